"""PPO: proximal policy optimisation with a clipped surrogate objective and GAE(lambda) (Schulman et al. 2017).

Each iteration collects ``n_steps`` steps of every auto-reset env, then makes ``n_epochs`` passes over the collection
in ``n_minibatches`` shuffled minibatches (a seeded generator). GAE bootstraps through time limits from the stored
terminal observation and not through terminations. The file reads top to bottom: the config, the loss, the learn
step and ``ALGORITHM``; docs/algorithms/ppo.md tells the rest. Run it with ``rlstruct train ppo`` or
``python -m rlstruct.algos.ppo``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from rlstruct.algos.harness import (
    ACTOR_CRITIC,
    ActorCriticLearner,
    AdvantagePart,
    Batch,
    LearnFn,
    MinibatchPart,
    OnPolicyAlgorithm,
    OnPolicyConfig,
    RecurrentPart,
    default,
    main,
    mean_over_ranks,
    minibatch_epochs,
    reads,
    setting,
    trainer,
)
from rlstruct.algos.losses import normalize_masked
from rlstruct.algos.policies import (
    RecurrentPolicyAgent,
    critic_values,
    next_of_collection,
    policy_actions,
    replay_learner,
    replay_window,
)
from rlstruct.algos.returns import gae_advantages
from rlstruct.structures import TemporalDictTensor, Trajectories

__all__ = ["PPOConfig", "ppo_loss", "ppo_minibatch_loss", "learn_step", "ALGORITHM", "train"]


@dataclasses.dataclass
class PPOConfig(AdvantagePart, MinibatchPart, RecurrentPart, OnPolicyConfig):
    """PPO's settings (each one's help is beside it; the family's are :class:`OnPolicyConfig`'s, the collection's and
    its minibatches' :class:`MinibatchPart`'s, the policy's :class:`RecurrentPart`'s, the advantages' and the loss
    weights' :class:`AdvantagePart`'s)."""

    eval_every: int = default(8)
    n_steps: int = default(32)
    clip_coef: float = setting(0.2, "the surrogate's clip range: the ratio counts within [1 - eps, 1 + eps]")
    value_clip: float = setting(0.0, "clip each value's change from the collection's to +-value_clip (0: none)")
    max_grad_norm: float = setting(0.5, "clip the global gradient norm to this (0: no clipping)")
    target_kl: float | None = setting(None, "stop an update's epochs once a pass's approximate KL exceeds this")


#: what ``rlstruct sweep ppo`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 1e-2, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "n_steps": {"choices": [8, 16, 32, 64, 128, 256]}, "n_epochs": {"low": 1, "high": 10},
                "n_minibatches": {"choices": [1, 2, 4, 8]}, "gae_lambda": {"low": 0.8, "high": 1.0},
                "clip_coef": {"low": 0.1, "high": 0.3}, "entropy_coef": {"low": 0.0, "high": 0.05}}


def check_config(config: PPOConfig) -> None:
    """Raises ``ValueError`` for a setting of PPO's own out of range."""
    if not config.clip_coef > 0:
        raise ValueError(f"clip_coef must be > 0, got {config.clip_coef!r}")
    if config.value_clip < 0:
        raise ValueError(f"value_clip must be >= 0 (0: no value clipping), got {config.value_clip!r}")
    if config.target_kl is not None and not config.target_kl > 0:
        raise ValueError(f"target_kl must be > 0 or None, got {config.target_kl!r}")
    if config.recurrent and config.n_minibatches > config.n_envs:
        raise ValueError(f"n_minibatches must be <= the envs per collection with recurrent=True (a minibatch is a "
                         f"set of envs' windows: n_envs = {config.n_envs}), got {config.n_minibatches}; "
                         "lower n_minibatches or raise n_envs")


def ppo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_coef: float,
    value_clip: float,
    value_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of a minibatch of steps, averaged over the valid ones.

    With ``r = exp(log_probs - old_log_probs)``::

        policy = -mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))
        value  = mean(max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)) / 2   (c = value_clip; c = 0: no clip)
        loss   = policy + value_coef * value - entropy_coef * mean(H)

    Every input has the same shape (``[M]`` for a minibatch of ``M`` steps, or ``[B, T]``).

    Args:
        log_probs: ``log pi(a|s)`` of the sampled actions under the current weights, with gradient.
        old_log_probs: the same under the weights that acted (no gradient).
        advantages: GAE advantages (no gradient).
        values: ``V(s)`` under the current weights, with gradient.
        old_values: ``V(s)`` at the collection (no gradient).
        returns: the value targets ``G = advantages + old_values`` (no gradient).
        entropy: the policy's entropy, with gradient.
        mask: ``float``, 1 on valid steps; an all-zero mask gives a zero loss, not nan.
        clip_coef: the clip range ``eps``.
        value_clip: the value clip range ``c`` (0: no value clipping).
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise the advantages over the valid steps.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d ``loss/policy``, ``loss/value``, ``loss/entropy``,
        ``ppo/approx_kl`` (``mean((r - 1) - log r)``) and ``ppo/clip_fraction`` (steps whose ratio was clipped).

    >>> z, one = torch.zeros(2), torch.ones(2)
    >>> loss, stats = ppo_loss(torch.log(torch.tensor([1.5, 1.0])), z, one, z, z, one, z, one, clip_coef=0.2,
    ...                        value_clip=0.0, value_coef=1.0, entropy_coef=0.0, normalize_advantages=False)
    >>> round(stats["loss/policy"].item(), 4), round(stats["loss/value"].item(), 4), stats["ppo/clip_fraction"].item()
    (-1.1, 0.5, 0.5)
    """
    n = mask.sum().clamp_min(1.0)
    adv = normalize_masked(advantages, mask) if normalize_advantages else advantages
    log_ratio = log_probs - old_log_probs
    ratio = log_ratio.exp()
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef) * adv)
    policy_loss = -(surrogate * mask).sum() / n
    value_error = (values - returns) ** 2
    if value_clip > 0:
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        value_error = torch.maximum(value_error, (clipped - returns) ** 2)
    value_loss = 0.5 * (value_error * mask).sum() / n
    mean_entropy = (entropy * mask).sum() / n
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    with torch.no_grad():
        approx_kl = (((ratio - 1.0) - log_ratio) * mask).sum() / n
        clip_fraction = (((ratio - 1.0).abs() > clip_coef).float() * mask).sum() / n
    return loss, {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(),
                  "loss/entropy": mean_entropy.detach(), "ppo/approx_kl": approx_kl, "ppo/clip_fraction": clip_fraction}


@reads("frame", "action", "old_log_prob", "advantage", "old_value", "returns", "mask")
def ppo_minibatch_loss(model: nn.Module, config: PPOConfig,
                       batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of a minibatch of ``M`` flat steps: the forward and :func:`ppo_loss` in one function (what
    ``compile_update`` compiles; the same computation as the eager loop's).

    Args:
        model: the actor-critic (not recurrent).
        config: the run's settings (the loss's coefficients).
        batch: ``frame [M, *obs]``; ``action [M]`` or ``[M, D]`` (see
            :func:`~rlstruct.algos.policies.policy_actions`); ``old_log_prob float [M]`` (``action/log_prob`` of the
            weights that acted); ``advantage float [M]``; ``old_value float [M]`` (the values at the collection);
            ``returns float [M]`` (``advantage + old_value``); ``mask float [M]``.
    """
    dist, value = model.policy_value(batch["frame"])  # one pass of a shared encoder for both
    return ppo_loss(dist.log_prob(batch["action"]), batch["old_log_prob"], batch["advantage"], value,
                    batch["old_value"], batch["returns"], dist.entropy(), batch["mask"], **_loss_settings(config))


def _loss_settings(config: PPOConfig) -> dict[str, Any]:
    """The keyword arguments of :func:`ppo_loss` that the config sets."""
    return {"clip_coef": config.clip_coef, "value_clip": config.value_clip, "value_coef": config.value_coef,
            "entropy_coef": config.entropy_coef, "normalize_advantages": config.normalize_advantages}


def _flat_steps(tt: TemporalDictTensor, advantages: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """The collection's steps as :func:`ppo_minibatch_loss`'s batch of flat ``[B*T, ...]`` tensors (a minibatch is a
    set of rows of them)."""
    steps = {"frame": tt["observation/frame"], "action": policy_actions(tt), "old_log_prob": tt["action/log_prob"],
             "advantage": advantages, "old_value": values, "returns": advantages + values, "mask": tt.mask()}
    return {key: v.flatten(0, 1) for key, v in steps.items()}


@reads("trajectories", "old_log_prob", "advantage", "old_value", "returns", "mask")
def _recurrent_minibatch_loss(model: nn.Module, agent: RecurrentPolicyAgent, config: PPOConfig,
                              batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of ``b`` envs' whole windows ``[b, T]`` (``batch["trajectories"]``), replayed from their stored
    first state (the memory needs every earlier step of the window); the other tensors are ``[b, T]``."""
    out = replay_window(agent, model, batch["trajectories"], bootstrap=False)
    return ppo_loss(out["log_prob"], batch["old_log_prob"], batch["advantage"], out["value"], batch["old_value"],
                    batch["returns"], out["entropy"], batch["mask"], **_loss_settings(config))


def learn_step(config: PPOConfig, learner: ActorCriticLearner) -> LearnFn:
    """PPO's learn step: the collection's values and GAE advantages, then ``n_epochs`` passes of ``n_minibatches``
    shuffled minibatches, one update each (loss, backward, clipping, optimizer step; compiled with
    ``compile_update``). A recurrent minibatch is a set of envs' whole windows, replayed from their stored first
    state."""
    model = learner.model
    # The minibatches' order: seeded per session, on the learner's device, apart from the agents' generators.
    shuffle = torch.Generator(device=learner.device).manual_seed(learner.seed)
    if config.recurrent:
        loss_fn = functools.partial(_recurrent_minibatch_loss, model, learner.agent, config)
    else:
        loss_fn = functools.partial(ppo_minibatch_loss, model, config)
    update = learner.update_step(loss_fn, config, max_grad_norm=config.max_grad_norm, per_network=False)

    def past_target_kl(stats: dict[str, torch.Tensor]) -> bool:
        # One host sync per epoch, not per step: CleanRL's early stop on the last minibatch's approximate KL (in a
        # data-parallel run, its mean over the ranks: every rank stops at the same pass).
        return float(mean_over_ranks(stats["ppo/approx_kl"], learner.world)) > config.target_kl

    def learn(traj: Trajectories, loss_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        tt = traj.trajectories
        with torch.no_grad():
            if config.recurrent or config.check_devices:  # the window replayed (memory), or checked step by step
                out = replay_learner(learner.checked_agent, model, traj, recurrent=config.recurrent,
                                     checked=config.check_devices)
                values, next_values = out["value"], out["next_value"]
            elif "action/value" in tt:  # the collection's values, the critic on the episodes' ends alone
                values = tt["action/value"]
                next_values = next_of_collection(values, tt, model.value)
            else:  # the critic alone: the old log-probabilities are the batch's own
                frame, next_frame = tt["observation/frame"], tt["_observation/frame"]
                values, next_values = (v.unflatten(0, frame.shape[:2]) for v in
                                       critic_values(model, frame.flatten(0, 1), next_frame.flatten(0, 1)))
            advantages = gae_advantages(loss_rewards * config.reward_scale, values, next_values,
                                        tt["_observation/terminated"], tt["_observation/done"], config.gamma,
                                        config.gae_lambda)
        if config.recurrent:  # minibatches of envs: rows of the window
            batch = {"trajectories": traj, "old_log_prob": tt["action/log_prob"], "advantage": advantages,
                     "old_value": values, "returns": advantages + values, "mask": tt.mask()}
        else:
            batch = _flat_steps(tt, advantages, values)
        stats, epochs = minibatch_epochs(update, batch, n_epochs=config.n_epochs, n_minibatches=config.n_minibatches,
                                         shuffle=shuffle, stop=None if config.target_kl is None else past_target_kl)
        stats["ppo/epochs"] = float(epochs)
        return stats

    return learn


ALGORITHM = OnPolicyAlgorithm(name="ppo", title="PPO", config_cls=PPOConfig, description=__doc__.splitlines()[0],
                              check_config=check_config, model=ACTOR_CRITIC, make_learn=learn_step,
                              search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("ppo"))
