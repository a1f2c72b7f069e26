"""REINFORCE with a learned baseline and an entropy bonus (Williams 1992).

Every iteration the training batcher runs complete episodes (episodic envs, ``n_timesteps`` equal to the
time limit, so one ``execute`` ends with ``n_still_running == 0``); the returns are discounted, cut at the
end of each episode, and bootstrapped from the baseline ``V(_observation/frame)`` where an episode was
truncated by its time limit rather than terminated. The policy is categorical for discrete actions and a
diagonal Gaussian for continuous ones (see :mod:`rlstruct.algos.networks`).

The file reads top to bottom: the config, the returns and the loss, the learn step (one gradient step over
whole episodes), and a ``train`` that hands them to the on-policy loop (:mod:`rlstruct.algos.on_policy`).

Run it with ``rlstruct train reinforce --env CartPole-v1`` or ``python -m rlstruct.algos.reinforce``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence

import torch
from torch import nn

from rlstruct.agents import replay_agent, replay_agent_stateless
from rlstruct.algos.command import run_main
from rlstruct.algos.env_spec import EnvSpec
from rlstruct.algos.losses import masked_policy_value_loss
from rlstruct.algos.networks import check_normalizable
from rlstruct.algos.normalization import NormalizationConfig
from rlstruct.algos.on_policy import ActorCriticLearner, LearnFn, OnPolicyAlgorithm, train_on_policy
from rlstruct.algos.policies import policy_actions
from rlstruct.algos.record import TrainResult
from rlstruct.algos.returns import discounted_returns
from rlstruct.algos.setup import Setup, prepare
from rlstruct.algos.update import FastPathConfig, UpdateStep, autocast_dtype, clip_groups, validate_fast_path
from rlstruct.structures import Trajectories

__all__ = ["ReinforceConfig", "reinforce_loss", "reinforce_batch_loss", "reinforce_returns", "learn_step",
           "ALGORITHM", "validate", "train", "main"]

log = logging.getLogger(__name__)

@dataclasses.dataclass
class ReinforceConfig(NormalizationConfig, FastPathConfig):
    """REINFORCE settings (the shared ones are documented in :class:`RunConfig`, :class:`FastPathConfig` and
    :class:`NormalizationConfig`).

    With ``compile_update`` the loss is compiled with symbolic shapes (``dynamic=True``): a batch is as long as
    its longest episode, so its ``T`` changes from one update to the next.

    Attributes:
        gamma: discount factor.
        baseline_coef: weight of the baseline's squared error.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise the advantages (returns minus baseline) within each batch.
        max_grad_norm: clip the gradient norm of the actor and of the critic, each, to this (0: no clipping).
        bootstrap_truncated: at a time limit, bootstrap the return from the baseline of the final observation.
    """

    n_envs: int = 16
    time_limit: float = 600.0
    max_env_steps: int | None = 500_000
    lr: float = 3e-3
    eval_every: int = 5
    gamma: float = 0.99
    baseline_coef: float = 0.5
    entropy_coef: float = 0.01
    normalize_advantages: bool = True
    max_grad_norm: float = 1.0
    bootstrap_truncated: bool = True

    #: the settings a resumed run must share with its checkpoint, besides RunConfig's (see load_resume)
    RESUME_FIELDS = ("normalize_observations", "normalize_rewards")



def check_config(config: ReinforceConfig) -> None:
    """REINFORCE's own settings (the shared ones are :func:`~rlstruct.algos.config.validate_run_config`'s).

    Raises:
        ValueError: a setting is out of range.
        ConfigError: fast-path flags that cannot work together (see :func:`validate_fast_path`).
    """
    validate_fast_path(config, "REINFORCE", episodic=True)
    if not 0 <= config.gamma <= 1:
        raise ValueError(f"gamma must lie in [0, 1], got {config.gamma!r}")


def check_env(config: ReinforceConfig, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` for image observations."""
    spec.require("REINFORCE", config.env, pixels=False)
    check_normalizable(spec, config.normalize_observations)


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
    """The REINFORCE loss with a baseline, averaged over the valid steps.

    ``loss = -mean(log pi(a|s) * (G - b(s))) + baseline_coef * mean((b(s) - G)^2) / 2 - entropy_coef * mean(H)``.

    Args:
        log_probs: ``float [B, T]``, ``log pi(a|s)`` of the sampled actions (see
            :func:`~rlstruct.algos.policies.policy_actions`), with gradient.
        entropy: ``float [B, T]``, the policy's entropy, with gradient.
        values: ``float [B, T]``, the baseline ``b(s)``, with gradient.
        returns: ``float [B, T]`` (no gradient).
        mask: ``float [B, T]``, 1 on valid steps.
        baseline_coef: weight of the baseline loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise ``G - b(s)`` over the valid steps for the policy term.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d statistics.

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


def reinforce_batch_loss(
    model: nn.Module,
    config: ReinforceConfig,
    frame: torch.Tensor,
    action: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The REINFORCE loss of a batch from its tensors: the forward and :func:`reinforce_loss` in one function (what
    ``compile_update`` compiles, with symbolic ``T``; the returns are computed before, eagerly).

    Args:
        model: the actor-critic.
        config: the run's settings (the loss's coefficients).
        frame: ``[B, T, *obs]``, ``observation/frame``.
        action: ``[B, T]`` or ``[B, T, D]``, see :func:`~rlstruct.algos.policies.policy_actions`.
        returns: ``float [B, T]``, from :func:`reinforce_returns`.
        mask: ``float [B, T]``.
    """
    B, T = returns.shape
    flat = frame.flatten(0, 1)
    dist = model.policy(flat)
    values = model.value(flat).unflatten(0, (B, T))
    log_probs = dist.log_prob(action.flatten(0, 1)).unflatten(0, (B, T))
    return reinforce_loss(log_probs, dist.entropy().unflatten(0, (B, T)), values, returns, mask,
                          baseline_coef=config.baseline_coef, entropy_coef=config.entropy_coef,
                          normalize_advantages=config.normalize_advantages)


def learn_step(config: ReinforceConfig, learner: ActorCriticLearner) -> LearnFn:
    """REINFORCE's learn step: the returns of the collection's whole episodes, then one update (loss, backward,
    clipping, optimizer step). Compiled or under autocast, the update runs the forward (over episodes of changing
    lengths, so with symbolic shapes); eager, it takes the outputs of the forward that also gives the bootstrap
    values."""
    model, device = learner.model, learner.device
    forward_in_update = config.compile_update or autocast_dtype(config) is not None
    if forward_in_update:
        update = UpdateStep(functools.partial(reinforce_batch_loss, model, config), learner.optimizer,
                            clip_groups(model), max_grad_norm=config.max_grad_norm, device=device,
                            compile=config.compile_update, dynamic=True, autocast=autocast_dtype(config))
    else:
        loss_fn = functools.partial(reinforce_loss, baseline_coef=config.baseline_coef,
                                    entropy_coef=config.entropy_coef, normalize_advantages=config.normalize_advantages)
        update = UpdateStep(loss_fn, learner.optimizer, clip_groups(model), max_grad_norm=config.max_grad_norm,
                            device=device)

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
            return update(tt["observation/frame"], policy_actions(tt), returns, tt.mask())
        return update(out["log_prob"], out["entropy"], out["value"], returns, tt.mask())

    return learn


ALGORITHM = OnPolicyAlgorithm(name="reinforce", title="REINFORCE", config_cls=ReinforceConfig,
                              description=__doc__.splitlines()[0], check_config=check_config, check_env=check_env,
                              make_learn=learn_step, episodic=True)


def validate(config: ReinforceConfig) -> Setup:
    """Checks the config before anything is built (see :func:`~rlstruct.algos.setup.prepare`).

    Raises:
        DeviceUnavailableError: a device of the config does not exist here.
        SpaceError: the env does not have flat observations.
        ValueError: a setting is out of range, or ``resume`` is not an rlstruct checkpoint.
        FileNotFoundError: ``resume`` does not exist.
        ConfigError: ``resume`` holds another algorithm's run, or one trained with other
            :attr:`ReinforceConfig.RESUME_FIELDS` or shared settings (see :func:`load_resume`).
    """
    return prepare(ALGORITHM, config)


def train(config: ReinforceConfig) -> TrainResult:
    """Trains a policy with REINFORCE and returns the final evaluation and the run's history.

    With ``resume``, the weights, the optimizer's state and the return statistics come from the checkpoint.

    Raises:
        ValueError: what :func:`validate` raises: a setting out of range, or one of its subclasses
            (``DeviceUnavailableError``, ``SpaceError``, ``ConfigError``) for a device, the env's spaces or ``resume``.
        FileNotFoundError: ``resume`` does not exist.
    """
    return train_on_policy(validate(config))


def main(argv: Sequence[str] | None = None) -> int:
    """``rlstruct train reinforce [flags]``; the last stdout line is a JSON summary."""
    return run_main(ALGORITHM, train_on_policy, argv)


if __name__ == "__main__":
    # Imported by name so that spawned workers unpickle this module's functions under their real name.
    from rlstruct.algos.reinforce import main as _main

    raise SystemExit(_main())
