"""The learner that SAC and TD3 share: an actor, twin Q critics with Polyak-averaged targets, their Adams, and the
gradient step's frame (the critics' update, the delayed actor update, the targets' update), with the state it
declares for the checkpoint.

:class:`TwinCriticLearner` holds what both algorithms do alike; an algorithm's learner subclasses it with its actor,
its critics' loss, its targets (:meth:`~TwinCriticLearner.critic_targets`) and its actor update
(:meth:`~TwinCriticLearner.update_actor`): SAC's entropy term and temperature, TD3's target policy smoothing and
delay are theirs (:mod:`~rlstruct.algos.sac`, :mod:`~rlstruct.algos.td3`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rlstruct.algos.harness import (
    EnvSpec,
    LearnerState,
    OffPolicyConfig,
    Resume,
    UniformStartLearner,
    restore_optimizer,
    seeded_model,
)
from rlstruct.algos.network_factories import network_model
from rlstruct.algos.networks import make_adam, polyak_update
from rlstruct.algos.qnetworks import TwinQNetwork
from rlstruct.algos.replay import ReplayBuffer
from rlstruct.structures import DictTensor

__all__ = ["TwinCriticLearner"]

#: a critics' loss: ``(q [K, N], targets [N], *, weights [N] | None) -> (loss, stats)``, ``stats["td_error"]``
#: (``float [N]``) given ``weights``
CriticLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _stack_critic_optimizer_state(state: dict[str, Any], n_critics: int) -> dict[str, Any]:
    """An optimizer's ``state_dict`` over separate critics' parameters (``n_critics`` blocks in the same order,
    one per critic, as ``TwinQNetwork.parameters()`` listed them before the ensemble) turned into one over the
    ensemble's stacked parameters: each moment stacked over the critics, the step count kept.

    >>> saved = {"state": {i: {"step": torch.tensor(3.0), "exp_avg": torch.full((2,), float(i))} for i in range(4)},
    ...          "param_groups": [{"lr": 0.1, "params": [0, 1, 2, 3]}]}
    >>> new = _stack_critic_optimizer_state(saved, 2)
    >>> new["param_groups"][0]["params"], new["state"][1]["exp_avg"].tolist()
    ([0, 1], [[1.0, 1.0], [3.0, 3.0]])
    """
    (group,) = state["param_groups"]
    per_critic = len(group["params"]) // n_critics
    blocks = [group["params"][k * per_critic:(k + 1) * per_critic] for k in range(n_critics)]
    new_state: dict[int, dict[str, Any]] = {}
    for i, ids in enumerate(zip(*blocks)):
        saved = [state["state"][j] for j in ids if j in state["state"]]
        if saved:
            new_state[i] = {key: value if key == "step" else torch.stack([s[key] for s in saved])
                            for key, value in saved[0].items()}
    return {"state": new_state, "param_groups": [{**group, "params": list(range(per_critic))}]}


class _EnsembleOptimizer:
    """The critics' optimizer as the checkpoint keeps it: a state saved over separate critics' parameters (before the
    ensemble stacked them: ``n_critics`` times as many) is stacked onto the ensemble's as it loads, at the learning
    rate the optimizer was built with."""

    def __init__(self, optimizer: torch.optim.Optimizer, n_critics: int | None):
        self.optimizer, self.n_critics = optimizer, n_critics

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        (group,) = self.optimizer.param_groups
        saved = state["param_groups"]
        if self.n_critics and len(saved) == 1 and len(saved[0]["params"]) == self.n_critics * len(group["params"]):
            state = _stack_critic_optimizer_state(state, self.n_critics)
        restore_optimizer(self.optimizer, state, group["lr"])


class TwinCriticLearner(UniformStartLearner):
    """An actor-critic :class:`~rlstruct.algos.harness.OffPolicyLearner` of continuous control with twin critics (a
    base to subclass, SAC's and TD3's): the actor (:attr:`policy`), the critics (a
    :class:`~rlstruct.algos.qnetworks.TwinQNetwork`, or the ``--network`` factory's), their Polyak-averaged
    :attr:`target_critic` (and :attr:`target_policy` with ``target_actor``), an Adam each, and one gradient step:
    the critics regress on :meth:`critic_targets` (prioritized replay's priorities set from their TD errors), and
    every ``policy_delay``-th critic update, starting with the first, :meth:`update_actor` and then the targets'
    Polyak update at rate ``config.tau``.

    A subclass passes what differs to ``__init__`` and writes :meth:`critic_targets` and :meth:`update_actor`; state
    it owns beyond these networks and optimizers (SAC's temperature) it adds to :attr:`state`. The actor acts
    uniformly at random for a fresh run's first ``learning_starts`` env steps; a resumed run restores what
    :attr:`state` declares (the critics, their targets, the optimizers, a critics' optimizer saved before the
    ensemble stacked onto it, and, with a ``policy_delay``, the count of critic updates: the delay's phase) with the
    actor, and lets the restored actor act while its buffer refills.

    Args:
        config: the run's settings (``lr`` is the actor's learning rate).
        spec: the env's description.
        resume: the checkpoint the run continues (``None``: a fresh run).
        device: the learner's device.
        seed: seeds :attr:`noise`, the generator of the gradient steps' noise (this session's learner seed).
        actor: builds the actor as ``actor(obs_dim, action_dim, hidden_sizes, low, high)`` (without ``--network``).
        critic_loss: the critics' loss, ``(q [K, N], targets [N], *, weights) -> (loss, stats)``, with
            ``stats["td_error"]`` (``float [N]``) when given ``weights``.
        critic_lr: the critics' learning rate.
        infos: the training ``agent_info`` of each phase (see :class:`~rlstruct.algos.harness.UniformStartLearner`).
        policy_delay: critic updates per update of the actor and the targets, their count kept in the checkpoint
            (``None``: one, nothing counted).
        target_actor: keep a target actor too.
    """

    def __init__(self, config: OffPolicyConfig, spec: EnvSpec, resume: Resume | None, *, device: torch.device,
                 seed: int, actor: Callable[..., nn.Module], critic_loss: CriticLoss, critic_lr: float,
                 infos: dict[bool, DictTensor], policy_delay: int | None = None, target_actor: bool = False):
        self.device, self.action_dim = device, spec.action_dim
        self.critic_loss, self.policy_delay = critic_loss, policy_delay
        if config.network is not None:
            policy, critic = seeded_model(config.seed, network_model, config.network, spec)
            self.policy, self.critic = policy.to(device), critic.to(device)
        else:
            self.policy = seeded_model(config.seed, actor, spec.obs_dim, spec.action_dim, config.hidden_sizes,
                                       spec.action_low, spec.action_high).to(device)
            self.critic = seeded_model(config.seed + 1, TwinQNetwork, spec.obs_dim, spec.action_dim,
                                       config.hidden_sizes).to(device)
        self.target_policy = copy.deepcopy(self.policy).requires_grad_(False) if target_actor else None
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = make_adam(self.policy, config.lr, device, eps=config.adam_eps)
        self.critic_opt = make_adam(self.critic, critic_lr, device, eps=config.adam_eps)
        self.n_updates = 0  # critic updates so far: the actor and the targets follow every policy_delay-th
        # The networks before their optimizers, so that each optimizer's state loads onto restored parameters.
        self.state = LearnerState(critic=self.critic, target_critic=self.target_critic)
        if self.target_policy is not None:
            self.state.add(target_actor=self.target_policy)
        self.state.add(actor_optimizer=self.actor_opt,
                       critic_optimizer=_EnsembleOptimizer(self.critic_opt, getattr(self.critic, "n_critics", None)))
        if policy_delay is not None:
            self.state.counters(self, "n_updates")
        self.noise = torch.Generator(device=device)
        self.noise.manual_seed(seed)
        super().__init__(config, fresh_run=resume is None, infos=infos)

    def checked(self) -> dict[str, nn.Module]:
        """The actor and the critics, which ``check_devices`` checks."""
        return {"the learner's actor": self.policy, "the learner's critics": self.critic}

    def _targets(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(target, network)`` pairs, the actor's first."""
        actor = [] if self.target_policy is None else [(self.target_policy, self.policy)]
        return [*actor, (self.target_critic, self.critic)]

    def tensors(self) -> list[torch.Tensor]:
        """The parameters and buffers of the actor, the critics and the targets."""
        networks = (self.policy, self.critic, *(target for target, _ in self._targets()))
        return [t for n in networks for t in (*n.parameters(), *n.buffers())]

    def critic_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The critics' regression targets ``float [N]`` of a sampled batch (``obs``, ``action``, ``ret``,
        ``next_obs``, ``discount``), computed without gradient."""
        raise NotImplementedError

    def update_actor(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One step of the actor (and of what trains with it) on the batch's observations ``[N, obs_dim]``; its
        statistics."""
        raise NotImplementedError

    def critics_at(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The critics ``float [K, N]`` at actions of the actor, differentiable in the actions only (the actor's
        loss must not train the critics)."""
        self.critic.requires_grad_(False)
        q = self.critic(obs, action)
        self.critic.requires_grad_(True)
        return q

    def gradient_step(self, buffer: ReplayBuffer) -> dict[str, Any]:
        """One critic update on a sampled batch; every ``policy_delay``-th, the actor's and the targets' too."""
        config, critic = self.config, self.critic
        batch = buffer.sample(config.batch_size)
        with torch.no_grad():
            targets = self.critic_targets(batch)
        critic_loss, stats = self.critic_loss(critic(batch["obs"], batch["action"]), targets,
                                              weights=batch.get("weight"))
        # A prioritized batch's TD errors are its transitions' new priorities; a uniform one has neither rows nor TD
        # errors (its loss, without weights, computes none), and its buffer ignores the call.
        buffer.update_priorities(batch.get("index"), stats.pop("td_error", None))
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        delayed = self.n_updates % (self.policy_delay or 1) != 0
        self.n_updates += 1
        if delayed:
            return stats
        stats.update(self.update_actor(batch["obs"]))
        for target, network in self._targets():
            polyak_update(target, network, config.tau)
        return stats
