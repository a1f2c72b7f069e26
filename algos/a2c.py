"""A2C: n-step advantage actor-critic with GAE(lambda) (Mnih et al. 2016; Schulman et al. 2016).

The training batcher steps auto-reset envs; the env and the agent carry over from one ``execute`` to the
next, so each update sees ``n_steps`` fresh steps of every env. The policy is categorical for discrete actions and a
diagonal Gaussian for continuous ones (see :mod:`rlstruct.algos.networks`). Targets bootstrap through time limits and
not through terminations: at a truncated step the target uses ``V(_observation/frame)`` (the terminal
observation), at a terminated step nothing, and the GAE recursion is cut at every episode end.

The file reads top to bottom: the config, the loss, the learn step (one gradient step per collection), and a
``train`` that hands them to the on-policy loop (:mod:`rlstruct.algos.harness`).

Run it with ``rlstruct train a2c --env CartPole-v1`` (or ``--env Pendulum-v1``) or ``python -m rlstruct.algos.a2c``.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from rlstruct.algos.harness import (
    ACTOR_CRITIC,
    ActorCriticLearner,
    AdvantagePart,
    Batch,
    LearnFn,
    OnPolicyAlgorithm,
    OnPolicyConfig,
    RecurrentPart,
    RolloutPart,
    default,
    main,
    reads,
    setting,
    trainer,
)
from rlstruct.algos.losses import masked_policy_value_loss
from rlstruct.algos.networks import ActorCritic
from rlstruct.algos.policies import actor_critic_outputs, policy_actions, replay_learner
from rlstruct.algos.returns import gae_advantages
from rlstruct.structures import Trajectories

__all__ = ["ALGORITHM", "A2CConfig", "a2c_batch_loss", "a2c_loss", "learn_step", "train"]


@dataclasses.dataclass
class A2CConfig(AdvantagePart, RolloutPart, RecurrentPart, OnPolicyConfig):
    """A2C's settings (each one's help is beside it; the family's are :class:`OnPolicyConfig`'s, the collection's
    :class:`RolloutPart`'s, the policy's :class:`RecurrentPart`'s, the advantages' and the loss weights'
    :class:`AdvantagePart`'s)."""

    lr: float = default(5e-3)
    eval_every: int = default(25)
    max_grad_norm: float = setting(0.5, "clip the gradient norm of the actor and of the critic, each (0: no clipping)")


#: what ``rlstruct sweep a2c`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 1e-2, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "n_steps": {"choices": [4, 8, 16, 32]}, "gae_lambda": {"low": 0.8, "high": 1.0},
                "entropy_coef": {"low": 0.0, "high": 0.05}, "value_coef": {"low": 0.25, "high": 1.0},
                "max_grad_norm": {"low": 0.3, "high": 5.0, "log": True}}


def a2c_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The A2C loss, averaged over the valid steps (``mask`` 1):
    ``-mean(log pi(a|s) * A) + value_coef * mean((V(s) - (A + V_old(s)))^2) / 2 - entropy_coef * mean(H)``, where
    ``V_old`` is ``values`` without gradient (the critic regresses on the GAE targets) and ``A`` is standardised for
    the policy term when ``normalize_advantages``. Every tensor is ``float [B, T]``; ``log_probs``, ``entropy`` and
    ``values`` carry the gradient. Returns the loss and detached 0-d statistics.

    >>> from rlstruct.algos.distributions import Categorical
    >>> dist = Categorical(torch.zeros(1, 2, 2, requires_grad=True))
    >>> loss, stats = a2c_loss(dist.log_prob(torch.zeros(1, 2, dtype=torch.long)), dist.entropy(), torch.zeros(1, 2),
    ...                        torch.ones(1, 2), torch.ones(1, 2), value_coef=1.0, entropy_coef=0.0,
    ...                        normalize_advantages=False)
    >>> round(loss.item(), 4), round(stats["loss/value"].item(), 4)
    (1.1931, 0.5)
    """
    loss, terms = masked_policy_value_loss(
        log_probs, entropy, values, (advantages + values).detach(), advantages.detach(), mask,
        value_coef=value_coef, entropy_coef=entropy_coef, normalize_advantages=normalize_advantages,
    )
    return loss, {"loss/policy": terms["policy"], "loss/value": terms["value"], "loss/entropy": terms["entropy"]}


@reads("frame", "next_frame", "action", "reward", "terminated", "done", "mask")
def a2c_batch_loss(model: ActorCritic, config: A2CConfig, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The A2C loss of a batch: the forward, GAE and :func:`a2c_loss` in one function (what ``compile_update``
    compiles; the same computation as the eager loop's).

    Args:
        model: the actor-critic (not recurrent).
        config: the run's settings (``gamma``, ``gae_lambda``, ``reward_scale`` and the loss's coefficients).
        batch: ``frame [B, T, *obs]`` (``observation/frame``); ``next_frame [B, T, *obs]``
            (``_observation/frame``); ``action [B, T]`` or ``[B, T, D]`` (see
            :func:`~rlstruct.algos.policies.policy_actions`); ``reward float [B, T]``; ``terminated bool [B, T]``;
            ``done bool [B, T]``; ``mask float [B, T]``.
    """
    out = actor_critic_outputs(model, batch["frame"], batch["next_frame"], batch["action"])
    return _loss_of_outputs(out, config, batch["reward"], batch["terminated"], batch["done"], batch["mask"])


def _loss_of_outputs(out: dict[str, torch.Tensor], config: A2CConfig, reward: torch.Tensor, terminated: torch.Tensor,
                     done: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # GAE on the outputs' values (no gradient), then the loss.
    with torch.no_grad():
        advantages = gae_advantages(reward * config.reward_scale, out["value"], out["next_value"], terminated, done,
                                    config.gamma, config.gae_lambda)
    return a2c_loss(out["log_prob"], out["entropy"], out["value"], advantages, mask,
                    value_coef=config.value_coef, entropy_coef=config.entropy_coef,
                    normalize_advantages=config.normalize_advantages)


@reads("trajectories", "reward")
def _replayed_loss(agent, model: torch.nn.Module, config: A2CConfig,
                   batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`a2c_batch_loss` over the learner's outputs of ``batch["trajectories"]`` through its agent
    (:func:`replay_learner`: a recurrent window, or a device-checked replay), with the rewards
    ``batch["reward"] [B, T]``."""
    traj = batch["trajectories"]
    tt = traj.trajectories
    out = replay_learner(agent, model, traj, recurrent=config.recurrent, checked=config.check_devices)
    return _loss_of_outputs(out, config, batch["reward"], tt["_observation/terminated"], tt["_observation/done"],
                            tt.mask())


def learn_step(config: A2CConfig, learner: ActorCriticLearner) -> LearnFn:
    """A2C's learn step: one update (loss, backward, clipping, optimizer step; compiled with ``compile_update``)
    over the whole collection. A recurrent or device-checked run replays its agent over the trajectories; the
    others compute from the tensors."""
    model = learner.model
    replayed = config.recurrent or config.check_devices
    if replayed:
        loss_fn = functools.partial(_replayed_loss, learner.checked_agent, model, config)
    else:
        loss_fn = functools.partial(a2c_batch_loss, model, config)
    update = learner.update_step(loss_fn, config, max_grad_norm=config.max_grad_norm)

    def learn(traj: Trajectories, loss_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        if replayed:
            return update({"trajectories": traj, "reward": loss_rewards})
        tt = traj.trajectories
        return update({"frame": tt["observation/frame"], "next_frame": tt["_observation/frame"],
                       "action": policy_actions(tt), "reward": loss_rewards,
                       "terminated": tt["_observation/terminated"], "done": tt["_observation/done"], "mask": tt.mask()})

    return learn


ALGORITHM = OnPolicyAlgorithm(name="a2c", title="A2C", config_cls=A2CConfig, description=__doc__.splitlines()[0],
                              model=ACTOR_CRITIC, make_learn=learn_step, search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("a2c"))
