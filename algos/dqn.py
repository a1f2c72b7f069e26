"""Double DQN with a target network, epsilon-greedy exploration and uniform replay (Mnih et al. 2015;
van Hasselt et al. 2016), with optional n-step returns, a dueling head (Wang et al. 2016) and prioritized replay;
``double=False`` gives Mnih et al.'s targets, the target network's max.

Targets bootstrap through time limits from the stored terminal observation and not through terminations. On one
accelerator (``--learner-device cuda --batcher-device cuda``) it takes the fast path the on-policy algorithms take:
the training batcher's agent reads the learner's weights there, ``--cuda-graph`` replays each acquisition (and each
evaluation) as one CUDA graph, ``--compile-update`` compiles the gradient step's forwards and loss, and the replay
buffer, on the learner's device, is pushed and sampled without a read on the host. The file reads top to bottom:
the config, the targets and the loss (the Q networks and their agent, which PQN shares, are
:mod:`rlstruct.algos.qnetworks`'s), the learner (:class:`DQNLearner`) and ``ALGORITHM``; docs/algorithms/dqn.md
tells the rest. Run it with ``rlstruct train dqn`` or ``python -m rlstruct.algos.dqn``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent
from rlstruct.algos.harness import (
    Batch,
    CapturedPart,
    EnvSpec,
    FastPathPart,
    LearnerState,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    Resume,
    UpdateStep,
    autocast_dtype,
    default,
    main,
    reads,
    seeded_model,
    setting,
    trainer,
)
from rlstruct.algos.network_factories import Q_CONTRACT, check_network, network_model
from rlstruct.algos.networks import autocast_context, make_adam, polyak_update
from rlstruct.algos.population import Population, PopulationAdam
from rlstruct.algos.qnetworks import (
    PixelQNetwork,
    QAgent,
    QNetwork,
    create_q_agent,
    dueling_q,
    epsilon_at,
    evaluation_info,
    q_network,
)
from rlstruct.algos.replay import NStepWindow, ReplayBuffer
from rlstruct.errors import ConfigError
from rlstruct.structures import DictTensor, TemporalDictTensor

__all__ = ["DQNConfig", "QNetwork", "PixelQNetwork", "q_network", "dueling_q", "QAgent", "double_dqn_targets",
           "dqn_targets", "create_q_agent", "dqn_loss", "epsilon_at", "DQNLearner", "ALGORITHM", "train"]


@dataclasses.dataclass
class DQNConfig(CapturedPart, FastPathPart, OffPolicyConfig):
    """DQN's settings (each one's help is beside it; the family's are :class:`OffPolicyConfig`'s, the fast path's
    :class:`FastPathPart`'s and :class:`CapturedPart`'s)."""

    max_env_steps: int | None = default(50_000)
    gradient_steps: int = setting(32, "gradient steps after each acquisition", least=0)
    n_step: int = setting(1, "steps per return (1: one-step TD targets)", least=1)
    tau: float = setting(1.0, "target update rate (1: hard copy every target_update_interval steps; < 1: Polyak)",
                         within="(0, 1]")
    target_update_interval: int = setting(128, "gradient steps between two hard target updates", least=1)
    epsilon_start: float = setting(1.0, "exploration rate at the start", within="[0, 1]")
    epsilon_end: float = setting(0.05, "exploration rate after the decay", within="[0, 1]")
    epsilon_decay_steps: int = setting(10_000, "env steps of the linear decay from epsilon_start to epsilon_end",
                                       least=1)
    loss: str = setting("huber", "huber or mse", choices=("huber", "mse"))
    max_grad_norm: float = setting(10.0, "clip the gradient's global norm to this (0: no clipping)")
    dueling: bool = setting(False, "a dueling head: Q = V + A - mean(A)")
    double: bool = setting(True, "double DQN's targets (false: the target network's max, as Mnih et al. 2015 and "
                                 "SB3)")
    population_batched: bool = setting(True, "with --seeds: one batched gradient step of every member (false: each "
                                             "member's own, bitwise its solo run's)")

    RESUME_FIELDS = ("dueling",)


#: what ``rlstruct sweep dqn`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 1e-2, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "batch_size": {"choices": [32, 64, 128, 256]}, "gradient_steps": {"choices": [8, 16, 32, 64]},
                "target_update_interval": {"choices": [64, 128, 256, 512]},
                "epsilon_decay_steps": {"choices": [5_000, 10_000, 20_000]}, "n_step": {"choices": [1, 3, 5]}}


def check_config(config: DQNConfig) -> None:
    """Raises ``ValueError`` for a setting of DQN's own out of range."""
    if config.n_step > config.rollout_steps:
        raise ValueError(f"n_step must be <= rollout_steps (the first acquisition must hold one n-step return), "
                         f"got n_step={config.n_step}, rollout_steps={config.rollout_steps}")


def check_env(config: DQNConfig, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` for continuous actions."""
    spec.require("DQN", config.env, discrete=True)
    if config.network is not None:
        check_network(config.network, spec, Q_CONTRACT, algo="DQN")


def double_dqn_targets(
    returns: torch.Tensor, discounts: torch.Tensor, next_q_online: torch.Tensor, next_q_target: torch.Tensor
) -> torch.Tensor:
    """Double-DQN targets (van Hasselt et al. 2016): the online net picks, the target net evaluates.

    ``y = R + discount * Q_target(s', argmax_a Q_online(s', a))``.

    Args:
        returns: ``float [N]`` (n-step) rewards.
        discounts: ``float [N]``, ``gamma^m`` or 0 where the episode terminated.
        next_q_online: ``float [N, A]``.
        next_q_target: ``float [N, A]``.

    Returns:
        ``float [N]``, the targets (no gradient flows through them if the inputs carry none).

    >>> double_dqn_targets(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([[0.0, 1.0]]),
    ...                    torch.tensor([[8.0, 2.0]]))
    tensor([2.])
    """
    a_star = next_q_online.argmax(-1, keepdim=True)
    return returns + discounts * next_q_target.gather(-1, a_star).squeeze(-1)


def dqn_targets(returns: torch.Tensor, discounts: torch.Tensor, next_q_target: torch.Tensor,
                next_q_online: torch.Tensor | None = None) -> torch.Tensor:
    """DQN's targets: :func:`double_dqn_targets` with ``next_q_online``, else Mnih et al.'s
    ``y = R + discount * max_a Q_target(s', a)``.

    Args:
        returns: ``float [N]`` (n-step) rewards.
        discounts: ``float [N]``, ``gamma^m`` or 0 where the episode terminated.
        next_q_target: ``float [N, A]``.
        next_q_online: ``float [N, A]``, or ``None`` (the target network's max).

    >>> dqn_targets(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([[8.0, 2.0]]))
    tensor([5.])
    """
    if next_q_online is not None:
        return double_dqn_targets(returns, discounts, next_q_online, next_q_target)
    return returns + discounts * next_q_target.max(-1).values


def dqn_loss(
    q: torch.Tensor,
    actions: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    next_q_online: torch.Tensor | None,
    next_q_target: torch.Tensor,
    *,
    kind: str = "huber",
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The regression loss of ``Q(s, a)`` on :func:`dqn_targets` (double DQN's with ``next_q_online``), in float32
    whatever the Q-values' dtype (bfloat16 under autocast); with ``weights`` (prioritized replay's importance-sampling
    weights), the weighted mean of the per-transition losses.

    Args:
        q: ``float [N, A]``, online Q-values of the observations, with gradient.
        actions: ``int64 [N]``.
        returns: ``float [N]`` (n-step) rewards.
        discounts: ``float [N]``, ``gamma^m`` or 0 at a termination.
        next_q_online: ``float [N, A]``, online Q-values of the next observations (no gradient), or ``None``: the
            targets take the target network's max.
        next_q_target: ``float [N, A]``, target-network Q-values of the next observations (no gradient).
        kind: ``huber`` (smooth L1, delta 1) or ``mse``.
        weights: ``float [N]`` or ``None`` (a plain mean).

    Returns:
        ``(loss, stats)``; with ``weights``, ``stats["td_error"]`` is ``Q(s, a) - y``, ``float [N]`` (the new
        priorities), to be taken out before the statistics are recorded.

    >>> loss, _ = dqn_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([1]), torch.tensor([1.0]), torch.tensor([0.5]),
    ...                    torch.tensor([[0.0, 1.0]]), torch.tensor([[8.0, 2.0]]), kind="mse")
    >>> float(loss)
    1.0
    """
    q_a = q.float().gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        online = None if next_q_online is None else next_q_online.float()
        targets = dqn_targets(returns.float(), discounts.float(), next_q_target.float(), online)
    regression = nn.functional.smooth_l1_loss if kind == "huber" else nn.functional.mse_loss
    if weights is None:
        loss = regression(q_a, targets)
        return loss, {"loss/q": loss.detach(), "q_mean": q_a.detach().mean()}
    loss = (weights * regression(q_a, targets, reduction="none")).mean()
    return loss, {"loss/q": loss.detach(), "q_mean": q_a.detach().mean(), "td_error": (q_a - targets).detach()}


@reads("obs", "action", "ret", "next_obs", "discount")
def _batch_loss(model: nn.Module, target: nn.Module, device: torch.device, autocast: torch.dtype | None, double: bool,
                kind: str, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`dqn_loss` of a replay batch (what ``compile_update`` compiles): the online network on ``obs``, and on
    ``next_obs`` when ``double``, the target network on ``next_obs``, those forwards under ``autocast``; a prioritized
    batch's ``weight`` weighs the loss. ``obs [N, *obs_shape]``, ``action int64 [N]``, ``ret float [N]``,
    ``next_obs [N, *obs_shape]``, ``discount float [N]``."""
    with autocast_context(device, autocast):
        q = model(batch["obs"])
        with torch.no_grad():
            next_q_online = model(batch["next_obs"]) if double else None
            next_q_target = target(batch["next_obs"])
    return dqn_loss(q, batch["action"], batch["ret"], batch["discount"], next_q_online, next_q_target, kind=kind,
                    weights=batch.get("weight"))


class DQNLearner:
    """DQN's learner for the off-policy loop (:class:`~rlstruct.algos.harness.OffPolicyLearner`): the Q network
    and its target, Adam, epsilon-greedy exploration, n-step transitions, and one gradient step of
    :func:`dqn_loss` followed by the target update (Polyak with ``tau < 1``, else a hard copy every
    ``target_update_interval`` steps). The gradient step's forwards run under ``config.autocast``; with
    ``double=False`` it skips the online network's forward on the next observations; with ``compile_update`` its
    forwards and loss are compiled (:class:`~rlstruct.algos.harness.UpdateStep`: CUDA graphs on CUDA). Nothing of a
    gradient step waits for the device, and once epsilon has decayed the training batcher keeps its ``agent_info``
    (:meth:`agent_info` gives none), which a captured acquisition then reads without a host synchronisation.

    Built whole on ``device``. It declares what it owns (:attr:`state`): the target network, Adam's state and the
    count of gradient steps (the hard target updates keep their cadence), which a resumed run restores with the Q
    network; epsilon goes on decaying from the restored env-step count.

    Args:
        config: the run's settings.
        spec: the env's description.
        resume: the checkpoint the run continues (``None``: a fresh run).
        device: the learner's device.
        seed: this session's learner seed (DQN's minibatches come from the replay buffer's generator).
        n_rows: the training batcher's envs, one epsilon each.
    """

    def __init__(self, config: DQNConfig, spec: EnvSpec, resume: Resume | None, *, device: torch.device, seed: int,
                 n_rows: int):
        self.config, self.n_rows = config, n_rows
        if config.network is not None:
            self.policy = seeded_model(config.seed, network_model, config.network, spec)
        else:
            self.policy = seeded_model(config.seed, functools.partial(q_network, dueling=config.dueling), spec,
                                       config.hidden_sizes)
        self.policy.to(device)
        self.target = copy.deepcopy(self.policy).requires_grad_(False)
        self.optimizer = make_adam(self.policy, config.lr, device, eps=config.adam_eps)
        self.n_step = NStepWindow(config.gamma, config.n_step)
        self.autocast, self.device = autocast_dtype(config), device
        self.n_updates = 0
        self.state = LearnerState(optimizer=self.optimizer, target=self.target)
        self.state.counters(self, "n_updates")
        loss = functools.partial(_batch_loss, self.policy, self.target, device, self.autocast, config.double,
                                 config.loss)
        self.update = UpdateStep(loss, self.optimizer, [("grad_norm", list(self.policy.parameters()))],
                                 max_grad_norm=config.max_grad_norm, device=device, compile=config.compile_update)
        self._epsilon: float | None = None  # the rate the training batcher acts with

    @staticmethod
    def exploration(config: DQNConfig) -> dict[str, bool | float]:
        """The training ``agent_info``'s example: the first epsilon."""
        return {"epsilon": config.epsilon_start}

    def checked(self) -> dict[str, nn.Module]:
        """The Q network, which ``check_devices`` checks."""
        return {"the learner's model": self.policy}

    def tensors(self) -> list[torch.Tensor]:
        """The Q network's and its target's parameters and buffers."""
        return [*self.policy.parameters(), *self.policy.buffers(), *self.target.parameters(), *self.target.buffers()]

    def agent_info(self, env_steps: int) -> tuple[DictTensor | None, dict[str, Any]]:
        """The epsilon of ``env_steps`` (linear decay) for every env, or ``None`` when it is the previous call's
        (once the decay is over: the batcher keeps the one it has), and as a statistic.

        >>> learner = DQNLearner(DQNConfig(epsilon_decay_steps=100, epsilon_end=0.25), EnvSpec((4,), "float32", 2, 500),
        ...                      None, device=torch.device("cpu"), seed=0, n_rows=2)
        >>> [(info if info is None else info["epsilon"].tolist(), stats["epsilon"])
        ...  for info, stats in (learner.agent_info(s) for s in (0, 100, 200))]
        [([1.0, 1.0], 1.0), ([0.25, 0.25], 0.25), (None, 0.25)]
        """
        config = self.config
        epsilon = epsilon_at(env_steps, config.epsilon_start, config.epsilon_end, config.epsilon_decay_steps)
        changed, self._epsilon = epsilon != self._epsilon, epsilon
        info = DictTensor({"epsilon": torch.full((self.n_rows,), epsilon)}) if changed else None
        return info, {"epsilon": epsilon}

    def transitions(self, trajectories: TemporalDictTensor) -> dict[str, Any]:
        """The n-step transitions this acquisition completes (:meth:`~rlstruct.algos.replay.NStepWindow.steps`)."""
        return self.n_step.steps(trajectories)

    def n_gradient_steps(self, n_new: int, buffered: int) -> int:
        """``gradient_steps`` once the buffer holds a batch."""
        return self.config.gradient_steps if buffered >= self.config.batch_size else 0

    def gradient_step(self, buffer: ReplayBuffer) -> dict[str, Any]:
        """One :attr:`update` of :func:`dqn_loss` on a sampled batch, then the target update."""
        config, model, target = self.config, self.policy, self.target
        batch = buffer.sample(config.batch_size)
        stats = self.update(batch)
        # A prioritized batch's TD errors are its transitions' new priorities; a uniform one has neither rows nor TD
        # errors (its loss, without weights, computes none), and its buffer ignores the call.
        buffer.update_priorities(batch.get("index"), stats.pop("td_error", None))
        self.n_updates += 1
        if config.tau < 1:
            polyak_update(target, model, config.tau)
        elif self.n_updates % config.target_update_interval == 0:
            target.load_state_dict(model.state_dict())
        return stats



    @staticmethod
    def population_step(learners: Sequence[DQNLearner]) -> DQNPopulationStep | None:
        """The batched gradient step of a population of these learners (``rlstruct train dqn --seeds``), or
        ``None`` where each member steps on its own: ``population_batched`` off, a network from outside, a
        compiled update, autocast, or members resumed at different step counts."""
        config = learners[0].config
        if (not config.population_batched or config.network is not None or config.compile_update
                or learners[0].autocast is not None or len({lr.n_updates for lr in learners}) > 1):
            return None
        try:
            return DQNPopulationStep(learners)
        except ConfigError:  # a network without batched layers (a dueling head): each member steps on its own
            return None


class DQNPopulationStep:
    """One gradient step of every member of a population of :class:`DQNLearner` at once: the members' Q networks and
    targets stacked (:class:`~rlstruct.algos.population.Population`, batched layers), each member's batch sampled
    from its own replay buffer by its own generator (the solo run's minibatch), one backward over the summed member
    losses (a member's gradient is its own loss's), each member's gradient clipped over its own parameters, one
    :class:`~rlstruct.algos.population.PopulationAdam` step (a stopped member masked), the target updates of every
    member (their cadence is shared: the members step together).

    A member's arithmetic is its solo step's up to float32 rounding (a batched layer sums its products in another
    order than the solo layer's kernel), so its run parts from its solo run's bits over training; with
    ``population_batched=False`` each member takes its own step instead. The members' own networks get the stacked
    weights back with :meth:`write_back` (once an iteration, before they go to the batcher), and their targets and
    optimizers the stacked state with :meth:`sync` (before a checkpoint).
    """

    def __init__(self, learners: Sequence[DQNLearner]):
        self.learners = list(learners)
        self.config = config = learners[0].config
        self.online = Population([lr.policy for lr in learners], implementation="batched")
        self.target = Population([lr.target for lr in learners], implementation="batched").requires_grad_(False)
        self.optimizer = PopulationAdam(self.online, config.lr, eps=config.adam_eps)
        for k, learner in enumerate(learners):  # a resumed member's moments
            self.optimizer.load_member_state_dict(k, learner.optimizer.state_dict())
        self.n_updates = learners[0].n_updates
        regression = nn.functional.smooth_l1_loss if config.loss == "huber" else nn.functional.mse_loss
        self._regression = functools.partial(regression, reduction="none")
        # each member's own tensors and their slices of the stacked ones, for one foreach copy
        self._policies = [(list(lr.policy.state_dict().values()),
                           [t[k] for t in self.online.module.state_dict().values()]) for k, lr in enumerate(learners)]
        self._targets = [(list(lr.target.state_dict().values()),
                          [t[k] for t in self.target.module.state_dict().values()]) for k, lr in enumerate(learners)]

    def __call__(self, buffers: Sequence[ReplayBuffer], active: Sequence[bool]) -> list[dict[str, Any]]:
        """One gradient step of the members ``active`` marks (the others' batches are drawn and their weights kept);
        each member's statistics, as its solo step's."""
        config = self.config
        batches = [buffer.sample(config.batch_size) for buffer in buffers]
        keys = ["obs", "action", "ret", "next_obs", "discount"] + (["weight"] if "weight" in batches[0] else [])
        batch = {key: torch.stack([b[key] for b in batches]) for key in keys}
        q = self.online(batch["obs"])
        with torch.no_grad():
            next_q_online = self.online(batch["next_obs"]).float() if config.double else None
            next_q_target = self.target(batch["next_obs"]).float()
            targets = dqn_targets(batch["ret"].float(), batch["discount"].float(), next_q_target, next_q_online)
        q_a = q.float().gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        errors = self._regression(q_a, targets)
        losses = (batch["weight"] * errors if "weight" in batch else errors).mean(-1)
        self.optimizer.zero_grad()
        losses.sum().backward()
        norms = self.online.clip_grad_norms(config.max_grad_norm) if config.max_grad_norm > 0 else None
        self.optimizer.step(active)
        td = (q_a - targets).detach() if "weight" in batch else None
        for k, (buffer, b) in enumerate(zip(buffers, batches)):
            buffer.update_priorities(b.get("index"), None if td is None else td[k])
        self.n_updates += 1
        for learner, on in zip(self.learners, active):
            learner.n_updates += bool(on)
        if config.tau < 1:
            polyak_update(self.target, self.online, config.tau)
        elif self.n_updates % config.target_update_interval == 0:
            with torch.no_grad():
                torch._foreach_copy_(list(self.target.parameters()), list(self.online.parameters()))
        q_mean = q_a.detach().mean(-1)
        stats = [{"loss/q": losses[k].detach(), "q_mean": q_mean[k]} for k in range(len(buffers))]
        if norms is not None:
            for k, row in enumerate(stats):
                row["grad_norm"] = norms[k]
        return stats

    @torch.no_grad()
    def write_back(self) -> None:
        """The stacked weights into each member's Q network (what its batcher's agent, evaluation and guard read)."""
        for own, stacked in self._policies:
            torch._foreach_copy_(own, stacked)

    @torch.no_grad()
    def sync(self, k: int) -> None:
        """Member ``k``'s target network and Adam state into its learner (what its checkpoint holds)."""
        torch._foreach_copy_(*self._targets[k])
        self.learners[k].optimizer.load_state_dict(self.optimizer.member_state_dict(k))


def evaluation_agent(config: Mapping[str, Any]) -> Callable[..., RL_Agent]:
    """The agent factory that evaluates a saved DQN run: the Q network of its ``dueling`` setting."""
    return functools.partial(create_q_agent, dueling=bool(config.get("dueling", False)))


ALGORITHM = OffPolicyAlgorithm(name="dqn", title="DQN", config_cls=DQNConfig, description=__doc__.splitlines()[0],
                               check_config=check_config, check_env=check_env, make_learner=DQNLearner,
                               agent=evaluation_agent, evaluation_info=evaluation_info,
                               search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("dqn"))
