"""REINFORCE with a learned baseline and an entropy bonus (Williams 1992).

Every iteration the training batcher runs complete episodes (episodic envs, ``n_timesteps`` equal to the
time limit, so one ``execute`` ends with ``n_still_running == 0``); the returns are discounted, cut at the
end of each episode, and bootstrapped from the baseline ``V(_observation/frame)`` where an episode was
truncated by its time limit rather than terminated. The policy is categorical for discrete actions and a
diagonal Gaussian for continuous ones (see :mod:`rlstruct.algos.networks`).

The file reads top to bottom: the config, the returns and the loss, the learn step (one gradient step over
whole episodes), and a ``train`` that hands them to the on-policy loop (:mod:`rlstruct.algos.harness`).

Run it with ``rlstruct train reinforce --env CartPole-v1`` or ``python -m rlstruct.algos.reinforce``.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from rlstruct.agents import replay_agent, replay_agent_stateless
from rlstruct.algos.harness import (
    ACTOR_CRITIC,
    ActorCriticLearner,
    ActorCriticPart,
    Batch,
    EnvSpec,
    LearnFn,
    OnPolicyAlgorithm,
    OnPolicyConfig,
    check_actor_critic_network,
    default,
    main,
    reads,
    setting,
    trainer,
)
from rlstruct.algos.losses import masked_policy_value_loss
from rlstruct.algos.policies import policy_actions
from rlstruct.algos.returns import discounted_returns
from rlstruct.structures import Trajectories

__all__ = [
    "ALGORITHM",
    "ReinforceConfig",
    "learn_step",
    "reinforce_batch_loss",
    "reinforce_loss",
    "reinforce_returns",
    "train",
]


@dataclasses.dataclass
class ReinforceConfig(ActorCriticPart, OnPolicyConfig):
    """REINFORCE's settings (each one's help is beside it; the family's are :class:`OnPolicyConfig`'s, the policy's
    :class:`ActorCriticPart`'s). It collects whole episodes, so it has no collection part: no ``n_steps``, no
    ``overlap``, no recurrent policy."""

    n_envs: int = default(16)
    eval_every: int = default(5)
    anneal_lr: bool = default(False)
    baseline_coef: float = setting(0.5, "weight of the baseline's squared error")
    entropy_coef: float = setting(0.01, "weight of the entropy bonus")
    normalize_advantages: bool = setting(True, "standardise the advantages (returns minus baseline) in each batch")
    max_grad_norm: float = setting(1.0, "clip the gradient norm of the actor and of the critic, each (0: none)")
    bootstrap_truncated: bool = setting(True, "at a time limit, bootstrap the return from the final baseline")


#: what ``rlstruct sweep reinforce`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 1e-2, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "n_envs": {"choices": [8, 16, 32, 64]}, "entropy_coef": {"low": 0.0, "high": 0.05},
                "baseline_coef": {"low": 0.25, "high": 1.0}}


def check_env(config: ReinforceConfig, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` for image observations, :class:`~rlstruct.errors.ConfigError` for
    ``log_std_init`` with discrete actions."""
    spec.require("REINFORCE", config.env, pixels=False)
    check_actor_critic_network(config, spec, title="REINFORCE")


def reinforce_returns(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    lengths: torch.Tensor,
    gamma: float,
    *,
    bootstrap_truncated: bool = True,
) -> torch.Tensor:
    """Discounted returns of rows of whole episodes (one episode per row, padded to ``T``).

    Each row ends at ``lengths[b] - 1``; padding never leaks into the returns. Where a row ends without
    terminating (a time limit) and ``bootstrap_truncated``, the return bootstraps from ``next_values`` there.

    Args:
        rewards: ``float [B, T]``.
        next_values: ``float [B, T]``, ``V(_observation/frame)`` (no gradient needed).
        terminated: ``bool [B, T]``.
        lengths: ``int64 [B]``.
        gamma: discount factor.
        bootstrap_truncated: bootstrap at truncated ends (else a truncated end counts as terminal).

    Returns:
        ``float [B, T]`` (zero on padding).

    >>> reinforce_returns(torch.ones(2, 2), torch.full((2, 2), 4.0), torch.tensor([[False, True], [False, False]]),
    ...                   torch.tensor([2, 1]), 0.5)
    tensor([[1.5000, 1.0000],
            [3.0000, 0.0000]])
    """
    T = rewards.shape[1]
    t = torch.arange(T, device=rewards.device).unsqueeze(0)
    mask = t < lengths.unsqueeze(1)
    end = t == (lengths.unsqueeze(1) - 1)
    bootstrap = None
    if bootstrap_truncated:
        bootstrap = torch.where(end & ~terminated.bool(), next_values, torch.zeros_like(next_values))
    returns = discounted_returns(torch.where(mask, rewards, torch.zeros_like(rewards)), end, gamma, bootstrap=bootstrap)
    return returns * mask


def reinforce_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    baseline_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The REINFORCE loss with a baseline, averaged over the valid steps (``mask`` 1):
    ``-mean(log pi(a|s) * (G - b(s))) + baseline_coef * mean((b(s) - G)^2) / 2 - entropy_coef * mean(H)``, the
    advantages ``G - b(s)`` standardised when ``normalize_advantages``. Every tensor is ``float [B, T]``;
    ``log_probs``, ``entropy`` and the baseline ``values`` carry the gradient. Returns the loss and detached 0-d
    statistics.

    >>> from rlstruct.algos.distributions import Categorical
    >>> dist = Categorical(torch.zeros(1, 2, 2, requires_grad=True))
    >>> loss, _ = reinforce_loss(dist.log_prob(torch.zeros(1, 2, dtype=torch.long)), dist.entropy(),
    ...                          torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), baseline_coef=1.0,
    ...                          entropy_coef=0.0, normalize_advantages=False)
    >>> round(loss.item(), 4)
    1.1931
    """
    returns = returns.detach()
    loss, terms = masked_policy_value_loss(
        log_probs, entropy, values, returns, returns - values.detach(), mask,
        value_coef=baseline_coef, entropy_coef=entropy_coef, normalize_advantages=normalize_advantages,
    )
    return loss, {"loss/policy": terms["policy"], "loss/baseline": terms["value"], "loss/entropy": terms["entropy"]}


@reads("frame", "action", "returns", "mask")
def reinforce_batch_loss(model: nn.Module, config: ReinforceConfig,
                         batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The REINFORCE loss of a batch: the forward and :func:`reinforce_loss` in one function (what
    ``compile_update`` compiles, with symbolic ``T``; the returns are computed before, eagerly).

    Args:
        model: the actor-critic.
        config: the run's settings (the loss's coefficients).
        batch: ``frame [B, T, *obs]`` (``observation/frame``); ``action [B, T]`` or ``[B, T, D]`` (see
            :func:`~rlstruct.algos.policies.policy_actions`); ``returns float [B, T]`` (from
            :func:`reinforce_returns`); ``mask float [B, T]``.
    """
    returns = batch["returns"]
    B, T = returns.shape
    flat = batch["frame"].flatten(0, 1)
    dist = model.policy(flat)
    values = model.value(flat).unflatten(0, (B, T))
    log_probs = dist.log_prob(batch["action"].flatten(0, 1)).unflatten(0, (B, T))
    return reinforce_loss(log_probs, dist.entropy().unflatten(0, (B, T)), values, returns, batch["mask"],
                          baseline_coef=config.baseline_coef, entropy_coef=config.entropy_coef,
                          normalize_advantages=config.normalize_advantages)


@reads("log_prob", "entropy", "value", "returns", "mask")
def _outputs_loss(config: ReinforceConfig, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`reinforce_loss` of the learner's outputs over a batch (``log_prob``, ``entropy``, ``value``, each
    ``float [B, T]`` with gradient) and its ``returns`` and ``mask``."""
    return reinforce_loss(batch["log_prob"], batch["entropy"], batch["value"], batch["returns"], batch["mask"],
                          baseline_coef=config.baseline_coef, entropy_coef=config.entropy_coef,
                          normalize_advantages=config.normalize_advantages)


def learn_step(config: ReinforceConfig, learner: ActorCriticLearner) -> LearnFn:
    """REINFORCE's learn step: the returns of the collection's whole episodes, then one update (loss, backward,
    clipping, optimizer step). Compiled or under autocast, the update runs the forward (over episodes of changing
    lengths, so with symbolic shapes); eager, it takes the outputs of the forward that also gives the bootstrap
    values."""
    model = learner.model
    forward_in_update = config.compile_update or config.autocast != "none"
    if forward_in_update:
        loss_fn = functools.partial(reinforce_batch_loss, model, config)
    else:
        loss_fn = functools.partial(_outputs_loss, config)
    update = learner.update_step(loss_fn, config, max_grad_norm=config.max_grad_norm, dynamic=True)

    def learn(traj: Trajectories, loss_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        if config.check_devices:
            out = replay_agent(learner.checked_agent, traj)
        elif forward_in_update:  # the returns' bootstrap values; the update runs the forward
            with torch.no_grad():
                nxt = traj.trajectories["_observation/frame"]
                out = {"next_value": model.value(nxt.flatten(0, 1)).unflatten(0, nxt.shape[:2])}
        else:
            out = replay_agent_stateless(learner.agent, traj, "replay_batch")
        tt = traj.trajectories
        with torch.no_grad():
            returns = reinforce_returns(loss_rewards, out["next_value"], tt["_observation/terminated"], tt.lengths,
                                        config.gamma, bootstrap_truncated=config.bootstrap_truncated)
        if forward_in_update:
            return update({"frame": tt["observation/frame"], "action": policy_actions(tt), "returns": returns,
                           "mask": tt.mask()})
        return update({"log_prob": out["log_prob"], "entropy": out["entropy"], "value": out["value"],
                       "returns": returns, "mask": tt.mask()})

    return learn


ALGORITHM = OnPolicyAlgorithm(name="reinforce", title="REINFORCE", config_cls=ReinforceConfig,
                              description=__doc__.splitlines()[0], check_env=check_env, model=ACTOR_CRITIC,
                              make_learn=learn_step, search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("reinforce"))
