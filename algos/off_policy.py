"""The off-policy loop, written once for DQN and SAC: collect, push into the replay buffer, take gradient steps,
send the weights to the batchers, record, evaluate, checkpoint, stop.

An algorithm hands the loop an :class:`OffPolicyAlgorithm` whose ``make_learner`` is its :class:`OffPolicyLearner`
class, built whole on the learner's device once the batchers' workers run: the networks, how it explores, the
transitions it keeps from an acquisition, how many gradient steps it owes, and one gradient step (its losses,
optimizers and target updates).

**A function, not a base class**, for the reasons :mod:`rlstruct.algos.on_policy` gives: the iteration reads top
to bottom in one place, and an algorithm's learner is a plain object with the named methods of
:class:`OffPolicyLearner` (a protocol: nothing to inherit). What every off-policy algorithm gets lands here once:
the replay buffer and its refill after a resume, the evaluation, periodic checkpoints, data-parallel ranks.

**Data-parallel** (``torchrun``, :mod:`rlstruct.algos.distributed`): each rank collects with its own batchers into
its own replay buffer and samples its own minibatches (its own seed); the gradients of
:meth:`~OffPolicyLearner.gradient_step`'s backward passes are averaged over the ranks as they accumulate (hooks on
:meth:`~OffPolicyLearner.tensors`), every rank takes the fewest gradient steps any rank can take, and the env-step
counts (budget, exploration schedule, ``learning_starts``) are global; rank 0 alone records, evaluates and
checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from rlstruct.agents import RL_Agent
from rlstruct.algos.config import RunConfig
from rlstruct.algos.distributed import (
    all_ranks_stop,
    announce,
    average_gradients,
    broadcast_parameters,
    check_models_agree,
    fewest_over_ranks,
    init_process_group,
    learner_seed,
)
from rlstruct.algos.evaluation import evaluation_info
from rlstruct.algos.record import TrainResult
from rlstruct.algos.replay import ReplayBuffer
from rlstruct.algos.returns import episode_statistics
from rlstruct.algos.run import check_on_device, finish_training, open_batchers, training_run
from rlstruct.algos.setup import Algorithm, Setup
from rlstruct.devices import cpu_state_dict
from rlstruct.structures import DictTensor, TemporalDictTensor

__all__ = ["OffPolicyLearner", "OffPolicyAlgorithm", "train_off_policy"]


class OffPolicyLearner(Protocol):
    """What the off-policy loop asks of an algorithm's learner.

    Built as ``learner_cls(config, spec, resume, device=..., seed=..., n_rows=...)`` after the batchers' workers
    spawned: its networks, optimizers and generators on the learner's ``device`` (seeded by this session's ``seed``),
    a resumed run's state restored, ``n_rows`` the training batcher's envs.

    Attributes:
        policy: the network the batchers' agents run (and the checkpoint's ``model``).
    """

    policy: nn.Module

    @staticmethod
    def batcher_agent(config: RunConfig) -> tuple[Callable[..., RL_Agent], dict[str, bool | float]]:
        """The batchers' agent factory (module level, so it pickles) and the training ``agent_info``, one value per
        key (the batcher's example); the evaluation's is :func:`~rlstruct.algos.evaluation.evaluation_info`'s."""

    def checked(self) -> dict[str, nn.Module]:
        """The networks that ``check_devices`` checks, by the name its message gives them."""

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the learner that the ranks of a data-parallel run hold alike: the networks' parameters and
        buffers, targets included, and any trained tensor outside a network (SAC's log temperature). Rank 0's are
        broadcast at the start; those that require a gradient are the trained ones, whose gradients are averaged."""

    def agent_info(self, env_steps: int) -> tuple[DictTensor, dict[str, Any]]:
        """The training ``agent_info`` of the next acquisition (``[n_rows]`` per key) at ``env_steps``, and the
        statistics it is recorded with (e.g. DQN's epsilon)."""

    def transitions(self, trajectories: TemporalDictTensor) -> dict[str, Any]:
        """The arguments of :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps` for an acquisition."""

    def n_gradient_steps(self, n_new: int, buffered: int) -> int:
        """The gradient steps to take after ``n_new`` env steps, with ``buffered`` transitions in the buffer (once
        this session has collected ``learning_starts`` steps)."""

    def gradient_step(self, buffer: ReplayBuffer) -> dict[str, Any]:
        """One gradient step on a batch sampled from ``buffer``; its statistics."""

    def state(self) -> dict[str, Any]:
        """What the checkpoint keeps besides the policy's weights (see ``--resume``)."""


@dataclasses.dataclass(frozen=True)
class OffPolicyAlgorithm(Algorithm):
    """An off-policy algorithm as :func:`train_off_policy` runs it (see :class:`Algorithm` for the other fields).

    Attributes:
        make_learner: the learner's class (:class:`OffPolicyLearner`).
    """

    make_learner: type[OffPolicyLearner] | None = None

    def __post_init__(self) -> None:
        if self.make_learner is None:  # a field with a default only because Algorithm's last fields have one
            raise TypeError(f"OffPolicyAlgorithm {self.name!r} needs make_learner, got None; pass its learner's class")


def train_off_policy(setup: Setup) -> TrainResult:
    """Trains ``setup.algorithm`` (an :class:`OffPolicyAlgorithm`) and returns the final evaluation and the run's
    history.

    A resumed run's replay buffer is not in the checkpoint: it refills for ``learning_starts`` env steps before the
    first gradient step of the new session.
    """
    algo: OffPolicyAlgorithm = setup.algorithm  # type: ignore[assignment]
    config, spec, resume, device, world = setup.config, setup.spec, setup.resume, setup.learner_device, setup.world
    with training_run(algo.name, config, spec, start=setup.start, resume=resume, logger=world.is_logger,
                      world_size=world.size) as (run, stack):
        create_agent, explore = algo.make_learner.batcher_agent(config)
        # Batchers first, the learner on its device after: no CUDA in this process before workers spawn.
        batcher, evaluator = open_batchers(stack, config, spec, create_agent, n_timesteps=config.rollout_steps,
                                           autoreset=True, explore=explore,
                                           evaluate=evaluation_info(algo.name, config.to_dict()),
                                           seed=run.seed, rank=world.rank, run=run)
        B = batcher.n_elems()
        seed = learner_seed(run.seed, world)
        learner = algo.make_learner(config, spec, resume, device=device, seed=seed, n_rows=B)
        # Data-parallel ranks (torchrun): after the workers spawned; rank 0's state everywhere, gradients averaged.
        init_process_group(world, device, timeout_s=config.batcher_timeout, stack=stack)
        broadcast_parameters(learner.tensors(), world)
        for handle in average_gradients(learner.tensors(), world):
            stack.callback(handle.remove)
        announce(world, "transitions of a replay minibatch, from the rank's own buffer", config.batch_size, config.lr)
        buffer = ReplayBuffer.for_spec(spec, config.buffer_size, device, seed=seed)
        carry_return = torch.zeros(B, device=device)
        carry_length = torch.zeros(B, dtype=torch.int64, device=device)
        first_step = run.env_steps  # the (re)filling of the buffer counts from this session's first step

        weights = cpu_state_dict(learner.policy)
        batcher.update(weights)
        batcher.reset()
        if world.is_logger:
            evaluator.launch(weights, run.iteration, run.env_steps)
        while not all_ranks_stop(run.should_stop(), world):
            agent_info, stats = learner.agent_info(run.env_steps)
            batcher.execute(agent_info=agent_info)
            traj, _ = batcher.get()
            traj = traj.to(device)
            if config.check_devices:
                check_on_device(traj, device, "the trajectories given to the learner")
                for what, module in learner.checked().items():
                    check_on_device(module, device, what)
            tt = traj.trajectories
            n_new = B * tt.temporal_size()  # this rank's; every rank's together count in the budget
            buffer.push_steps(**learner.transitions(tt))

            stats["buffer_size"] = float(len(buffer))
            filled = run.env_steps + n_new * world.size - first_step >= config.learning_starts
            n_steps = fewest_over_ranks(learner.n_gradient_steps(n_new, len(buffer)) if filled else 0, world)
            for _ in range(n_steps):
                stats.update(learner.gradient_step(buffer))
            if n_steps:
                weights = cpu_state_dict(learner.policy)
                batcher.update(weights)

            ret_sum, len_sum, count, carry_return, carry_length = episode_statistics(
                tt["_observation/reward"], tt["_observation/done"], carry_return, carry_length
            )
            # nan (0 / 0) when no episode ended in this window.
            stats["train/episode_return"] = ret_sum / count
            stats["train/episode_length"] = len_sum / count
            run.record(n_new * world.size, stats)
            if world.is_logger:
                run.poll_evaluation(evaluator, lambda: weights)
                run.poll_checkpoint(learner.policy, learner.state)

        check_models_agree(learner.tensors(), world)
        return finish_training(run, evaluator, learner.policy, spec, title=algo.title, learner=learner.state())
