"""The two families' training loops (:class:`~.family.TrainingLoop`): the on-policy one (A2C, PPO, REINFORCE, PQN:
collect, normalise, learn) and the off-policy one (DQN, SAC, TD3: collect, push into a replay buffer, take gradient
steps), with what every run does around them (send the weights to the batchers, record, evaluate, checkpoint, stop);
:func:`run` runs a checked setup in the loop its description carries, :func:`train` checks and runs an algorithm's
config, and :func:`trainer` is an algorithm module's ``train``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos._optim import OptimizerLike
from rlstruct.algos._train.checkpoints import load_state
from rlstruct.algos._train.config import CapturedPart, OffPolicyConfig, OnPolicyConfig, RunConfig
from rlstruct.algos._train.distributed import (
    World,
    all_ranks_stop,
    announce,
    average_gradients,
    broadcast_parameters,
    check_models_agree,
    fewest_over_ranks,
    global_sum,
    init_process_group,
    learner_seed,
    sum_over_ranks,
)
from rlstruct.algos._train.evaluation import Evaluator
from rlstruct.algos._train.family import TrainingEpisodes, open_run, record_iteration, until_a_worker_fails
from rlstruct.algos._train.finish import finish_diverged, finish_training
from rlstruct.algos._train.folder_claim import given_back_unless_trained, run_logdir
from rlstruct.algos._train.learner_state import LearnerState
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.registry import FAMILY_LOOPS, Algorithm, OffPolicyAlgorithm, OnPolicyAlgorithm
from rlstruct.algos._train.replay_setup import check_replay_fits, make_replay_buffer, replay_folder
from rlstruct.algos._train.result import TrainResult
from rlstruct.algos._train.session import Setup, check_on_device, open_batchers, seeded_model, validate
from rlstruct.algos._train.update import (
    LossFn,
    UpdateStep,
    actor_critic_learner,
    autocast_dtype,
    clip_groups,
    start_pipeline,
    training_agent_kwargs,
    weight_sync_mode,
)
from rlstruct.algos.replay import ReplayBuffer, one_step_steps
from rlstruct.algos.returns import episode_returns
from rlstruct.batchers import Pipeline, RL_Batcher, WeightSync
from rlstruct.devices import cpu_state_dict
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

if TYPE_CHECKING:  # the profiler stays out of a training run's imports
    from rlstruct.batchers.profile import LoopTimer

__all__ = [
    "ActorCriticLearner",
    "OffPolicyLearning",
    "OnPolicyLearning",
    "LearnFn",
    "OffPolicyLearner",
    "run",
    "train",
    "train_off_policy",
    "train_on_policy",
    "trainer",
]


log = logging.getLogger(__name__)

#: a learn step: ``(trajectories, loss_rewards [B, T]) -> statistics`` (0-d tensors or floats)
LearnFn = Callable[[Trajectories, torch.Tensor], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ActorCriticLearner:
    """The learner's parts that an on-policy learn step is built from.

    Attributes:
        model: the actor-critic (recurrent or not), on ``device``.
        agent: the learner's agent over ``model`` (a :class:`~rlstruct.algos.policies.PolicyAgent` or a
            :class:`~rlstruct.algos.policies.RecurrentPolicyAgent`), to replay a collection.
        checked_agent: ``agent`` in an :class:`~rlstruct.agents.RL_Agent_CheckDevice` with ``check_devices``,
            else ``agent``.
        optimizer: the model's Adam.
        device: the learner's device.
        seed: this session's seed (for the learn step's own generators).
        world: this process's rank in a data-parallel run (the gradients are averaged already; a learn step asks it
            only for a decision that every rank takes alike, e.g. PPO's early stop).
        state: what the checkpoint keeps besides the model's weights, which ``--resume`` restores once the learn step
            is built: the loop declares the optimizer (``"optimizer"``) and the return statistics
            (``"normalization"``); a learn step adds what it owns, e.g. an adaptive coefficient, a tensor updated in
            place (``learner.state.add(kl_coef=kl_coef)``).
    """

    model: nn.Module
    agent: RL_Agent
    checked_agent: RL_Agent
    optimizer: OptimizerLike
    device: torch.device
    seed: int
    world: World = World()
    state: LearnerState = dataclasses.field(default_factory=LearnerState)

    def update_step(self, loss_fn: LossFn, config: OnPolicyConfig, *, max_grad_norm: float,
                    per_network: bool = True, dynamic: bool | None = None) -> UpdateStep:
        """The update of the model by ``loss_fn`` (its batch's keys declared with
        :func:`~rlstruct.algos._train.update.reads`): compiled with ``config.compile_update``, under
        ``config.autocast``, its gradient norm clipped to ``max_grad_norm`` per network (the actor's and the critic's,
        see :func:`~rlstruct.algos._train.update.clip_groups`) or, without ``per_network``, over the whole model;
        ``dynamic`` is ``torch.compile``'s (``True`` for batches whose length changes)."""
        return UpdateStep(loss_fn, self.optimizer, clip_groups(self.model, per_network=per_network),
                          max_grad_norm=max_grad_norm, device=self.device, compile=config.compile_update,
                          dynamic=dynamic, autocast=autocast_dtype(config))


def _join_ranks(world: World, device: torch.device, config: RunConfig, stack: contextlib.ExitStack,
                state: nn.Module | list[torch.Tensor]) -> None:
    """Joins a data-parallel run's ranks (torchrun), after the batchers' workers spawned: rank 0's ``state``
    everywhere, its gradients averaged over the ranks from then on."""
    init_process_group(world, device, timeout_s=config.batcher_timeout, stack=stack)
    broadcast_parameters(state, world)
    for handle in average_gradients(state, world):
        stack.callback(handle.remove)


class _Episodes:
    """The collection of an episodic algorithm: every iteration resets the envs and runs each one episode to its
    end; the weights go to the batcher after each update (:class:`~rlstruct.batchers.Pipeline`'s calls)."""

    def __init__(self, batcher: RL_Batcher, sync: WeightSync):
        self.batcher, self.sync = batcher, sync
        sync.push()

    def next(self, agent_info: DictTensor | None = None) -> Trajectories:
        self.batcher.reset(agent_info=agent_info)
        self.batcher.execute()
        traj, n_running = self.batcher.get()
        assert n_running == 0, "n_timesteps covers the time limit: every episode ends in one execute"
        return traj

    def updated(self) -> None:
        self.sync.push()

    def close(self) -> None:
        """Nothing to collect: an episodic acquisition ends within :meth:`next`."""


def collector(setup: Setup, stack: contextlib.ExitStack, batcher: RL_Batcher,
               model: nn.Module) -> Pipeline | _Episodes:
    """The training batcher's acquisitions as the loop consumes them: a started
    :class:`~rlstruct.batchers.Pipeline` of auto-reset envs, or :class:`_Episodes`."""
    config = setup.config
    if setup.algorithm.episodic:
        return _Episodes(batcher, WeightSync(batcher, model, setup.learner_device, weight_sync_mode(config)))
    return start_pipeline(stack, batcher, model, config, device=setup.learner_device, overlap=config.overlap)


def untimed(phase: str) -> contextlib.nullcontext[None]:
    """A loop's phase when no :class:`~rlstruct.batchers.profile.LoopTimer` times it: a context that does nothing."""
    return contextlib.nullcontext()


class OnPolicyLearning:
    """The learner of one on-policy run, from the collections of its ``n_rows`` training envs: the learner's agent,
    Adam and the return statistics around the algorithm's learn step, restored from ``setup.resume``; each iteration
    is :meth:`schedule` (before the collection), :meth:`learn_from`, :meth:`after_update` (before the weights go to
    the batchers) and :meth:`record`. The solo loop drives one; a population drives one per member."""

    def __init__(self, setup: Setup, run: Run, model: nn.Module, n_rows: int):
        algo, config, learner, world = setup.algorithm, setup.config, setup.learner_device, setup.world
        self.setup, self.run, self.model, self.n_rows = setup, run, model, n_rows
        agent = algo.model.learner_agent(model, learner, config)
        self.optimizer, self.normalize = actor_critic_learner(model, config, n_rows=n_rows, device=learner,
                                                              sum_over_ranks=sum_over_ranks(world))
        self.owned = LearnerState(optimizer=self.optimizer, normalization=self.normalize)
        checked = RL_Agent_CheckDevice(agent, learner) if config.check_devices else agent
        self.learn = algo.make_learn(config, ActorCriticLearner(model, agent, checked, self.optimizer, learner,
                                                                run.seed, world, self.owned))
        if setup.resume is not None:  # after the learn step declared its own state
            self.owned.load_state_dict(setup.resume.learner, path=setup.resume.path)
        self.episodes = TrainingEpisodes(n_rows, learner)

    def schedule(self) -> tuple[DictTensor | None, dict[str, Any]]:
        """The next collection's ``agent_info`` (``None``: the batcher's) and the statistics it is recorded with."""
        algo = self.setup.algorithm
        return algo.schedule(self.setup.config, self.run.env_steps, self.n_rows) if algo.schedule else (None, {})

    def learn_from(self, traj: Trajectories, stats: dict[str, Any], phase: Callable[[str], Any]) -> Trajectories:
        """Learns from a collection (its statistics into ``stats``); returns it on the learner's device."""
        config, learner = self.setup.config, self.setup.learner_device
        with phase("to_learner"):
            traj = traj.to(learner)
        with phase("normalize"):
            loss_rewards = self.normalize(traj.trajectories)  # before any forward: the values and the loss agree
        if config.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = config.lr * (1.0 - self.run.budget_used())
        if config.check_devices:
            check_on_device(self.model, learner, "the learner's model")
        with phase("learn"):
            stats.update(self.learn(traj, loss_rewards))
        return traj

    def after_update(self, traj: Trajectories) -> None:
        """What the next collection acts with besides the weights: the return statistics updated."""
        self.normalize.after_update(traj.trajectories)

    def record(self, traj: Trajectories, stats: dict[str, Any], evaluator: Evaluator) -> None:
        """The iteration's record (:func:`~.family.record_iteration`): its env steps over every rank."""
        world = self.setup.world
        if self.setup.algorithm.episodic:
            ep_returns, lengths = episode_returns(traj)
            stats["train/episode_return"] = ep_returns.mean()
            stats["train/episode_length"] = lengths.float().mean()
            n_steps = global_sum(int(lengths.sum()), world)
        else:
            self.episodes.add(traj.trajectories, stats)
            n_steps = self.n_rows * traj.trajectories.temporal_size() * world.size  # the budget is global
        record_iteration(self.run, evaluator, n_steps, stats, model=self.model, learner=self.owned.state_dict)

    def finish(self, evaluator: Evaluator) -> TrainResult:
        """The run's end (:func:`~.finish.finish_training`)."""
        return finish_training(self.run, evaluator, self.model, self.setup.spec, title=self.setup.algorithm.title,
                               learner=self.owned.state_dict())


def train_on_policy(setup: Setup, *, timer: LoopTimer | None = None) -> TrainResult:
    """Trains ``setup.algorithm`` (an :class:`OnPolicyAlgorithm`) and returns the final evaluation and the run's
    history.

    With ``setup.resume``, the weights, the optimizer's state and the return statistics come from the checkpoint.
    With ``timer``, every iteration's phases (``collect``, then the
    :data:`~rlstruct.batchers.profile.LEARNER_PHASES`) are timed and the training batcher times its own
    (``rlstruct profile``); without, nothing is timed and nothing waits for a device.
    """
    algo: OnPolicyAlgorithm = setup.algorithm  # type: ignore[assignment]
    config, spec, resume, learner, world = setup.config, setup.spec, setup.resume, setup.learner_device, setup.world
    with open_run(setup) as (run, stack):
        # What the batchers' agents build besides the agent factory's own settings (none for a plain network).
        agent_kwargs, model_kwargs = algo.model.agent_kwargs(config)
        model = seeded_model(config.seed, algo.model.build, config, spec)
        if resume is not None:
            load_state(model, resume.model, "the model", resume.path)
        # Batchers first, model to the learner device after: no CUDA in this process before workers spawn.
        if algo.episodic:  # n_timesteps = the time limit: one execute runs every env's episode to its end
            steps: dict[str, Any] = {"n_timesteps": spec.max_episode_steps, "autoreset": False}
        else:  # with overlap in process, the batcher's double buffer keeps batch k whole while k + 1 is written
            steps = {"n_timesteps": config.n_steps, "autoreset": True, "cuda_graph": config.cuda_graph,
                     "zero_copy": config.overlap and config.n_processes == 0}
        batcher, evaluator = open_batchers(stack, config, spec, algo.agent(config.to_dict()),
                                           explore=algo.model.explore(config),
                                           evaluate=algo.evaluation_agent_info(config.to_dict()),
                                           agent_kwargs=agent_kwargs, model_kwargs=model_kwargs,
                                           seed=run.seed, rank=world.rank, run=run,
                                           sync_timings=timer is not None and timer.sync, **steps)

        model.to(learner)
        run.stop_rule.guard.watch(model.state_dict)
        _join_ranks(world, learner, config, stack, model)
        B = batcher.n_elems()
        announce(world, "envs of a collection" if algo.episodic else "env steps of a collection",
                 B if algo.episodic else B * config.n_steps, config.lr)
        member = OnPolicyLearning(setup, run, model, B)

        collect = collector(setup, stack, batcher, model)
        phase = untimed if timer is None else timer
        if timer is not None:
            timer.watch(batcher)
        if world.is_logger:
            evaluator.schedule(lambda: cpu_state_dict(model), run.iteration, run.env_steps)
        while not all_ranks_stop(run.should_stop(), world):
            with until_a_worker_fails(run.stop_rule):
                agent_info, stats = member.schedule()
                with phase("collect"):
                    traj = collect.next(agent_info)
                traj = member.learn_from(traj, stats, phase)
                # what the next collection acts with
                with phase("update_weights"), until_a_worker_fails(run.stop_rule):
                    member.after_update(traj)
                    collect.updated()
                with phase("record"):
                    member.record(traj, stats, evaluator)
        collect.close()  # an acquisition launched during the last update: close the batcher with nothing pending

        check_models_agree(model, world)
        return member.finish(evaluator)
    return finish_diverged(run, title=algo.title)  # the loop raised, and the divergence found explains it


class OffPolicyLearner(Protocol):
    """What the off-policy loop asks of an algorithm's learner.

    Built as ``learner_cls(config, spec, resume, device=..., seed=..., n_rows=...)`` after the batchers' workers
    spawned: its networks, optimizers and generators on the learner's ``device`` (seeded by this session's ``seed``),
    ``n_rows`` the training batcher's envs. The batchers' agent is the algorithm's ``agent``. The loop restores a
    resumed run's ``policy`` and ``state`` once the learner is built; ``resume`` says whether there is one.

    Attributes:
        policy: the network the batchers' agents run (and the checkpoint's ``model``).
        state: what the checkpoint keeps besides the policy's weights, which ``--resume`` restores: the other
            networks (targets, critics), the optimizers, tensors of state (a temperature) and counters
            (:class:`~.learner_state.LearnerState`).
    """

    policy: nn.Module
    state: LearnerState

    @staticmethod
    def exploration(config: OffPolicyConfig) -> dict[str, bool | float]:
        """The training ``agent_info``, one value per key (the batcher's example); the evaluation's is the
        algorithm's ``evaluation_info``."""

    def checked(self) -> dict[str, nn.Module]:
        """The networks that ``check_devices`` checks, by the name its message gives them."""

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the learner that the ranks of a data-parallel run hold alike: the networks' parameters and
        buffers, targets included, and any trained tensor outside a network (SAC's log temperature). Rank 0's are
        broadcast at the start; those that require a gradient are the trained ones, whose gradients are averaged."""

    def agent_info(self, env_steps: int) -> tuple[DictTensor | None, dict[str, Any]]:
        """The training ``agent_info`` of the next acquisition (``[n_rows]`` per key) at ``env_steps``, or ``None``
        to keep the batcher's (a captured acquisition then reads it without waiting for the device), and the
        statistics it is recorded with (e.g. DQN's epsilon)."""

    def transitions(self, trajectories: TemporalDictTensor) -> dict[str, Any]:
        """The arguments of :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps` for an acquisition."""

    def n_gradient_steps(self, n_new: int, buffered: int) -> int:
        """The gradient steps to take after ``n_new`` env steps, with ``buffered`` transitions in the buffer (once
        this session has collected ``learning_starts`` steps)."""

    def gradient_step(self, buffer: ReplayBuffer) -> dict[str, Any]:
        """One gradient step on a batch sampled from ``buffer``; its statistics."""

    # Optional: ``population_step(learners) -> step | None``, a staticmethod giving one batched gradient step of a
    # population's learners (``step(buffers, active) -> [statistics]``, ``step.write_back()``, ``step.sync(k)``:
    # see DQN's); without it, or where it gives ``None``, each member takes its own ``gradient_step``.


def _declared(learner: OffPolicyLearner) -> Callable[[], dict[str, Any]]:
    """What the checkpoint of an off-policy ``learner`` keeps (its ``state``'s ``state_dict``); a learner whose
    ``state`` is still a method saves and restores by hand (the protocol's first form), with a warning."""
    if isinstance(learner.state, LearnerState):
        return learner.state.state_dict
    warnings.warn(f"{type(learner).__name__}.state() is deprecated and goes in a later minor release: declare what "
                  "the learner owns as self.state = LearnerState(...) (rlstruct.algos.harness), which the harness "
                  "saves and restores on --resume", DeprecationWarning, stacklevel=2)
    return learner.state


class UniformStartLearner:
    """What an actor-critic :class:`OffPolicyLearner` of continuous control shares (SAC's and TD3's; a base to
    subclass): a fresh run's first ``learning_starts`` env steps act uniformly at random, the transitions are one-step
    (:func:`~rlstruct.algos.replay.one_step_steps`), and ``gradient_steps_per_env_step`` gradient steps follow each
    new env step, the fraction of a step carried over.

    A subclass calls ``super().__init__(config, fresh_run=resume is None, infos=...)``, ``infos`` being the training
    ``agent_info`` of each phase: ``{True: while uniform, False: the actor's}``, ``[n_rows]`` per key, one object each
    for the whole run (a captured acquisition reads them in place).
    """

    def __init__(self, config: OffPolicyConfig, *, fresh_run: bool, infos: dict[bool, DictTensor]):
        self.config, self.fresh_run, self.infos = config, fresh_run, infos
        self.owed = 0.0  # gradient steps due but not yet taken (fractions of a step carry over)

    def agent_info(self, env_steps: int) -> tuple[DictTensor | None, dict[str, Any]]:
        """Uniform actions for a fresh run's first ``learning_starts`` env steps, the actor's after."""
        return self.infos[self.fresh_run and env_steps < self.config.learning_starts], {}

    def transitions(self, trajectories: TemporalDictTensor) -> dict[str, Any]:
        """The one-step transitions of the acquisition (``one_step_steps``)."""
        return one_step_steps(trajectories, self.config.gamma)

    def n_gradient_steps(self, n_new: int, buffered: int) -> int:
        """``gradient_steps_per_env_step`` per new env step, the fraction of a step carried over."""
        self.owed += self.config.gradient_steps_per_env_step * n_new
        n_steps = int(self.owed)
        self.owed -= n_steps
        return n_steps


class OffPolicyLearning:
    """The learner of one off-policy run, from the collections of its ``n_rows`` training envs: the algorithm's
    learner (restored from ``setup.resume``) and its replay buffer (closed by ``stack``); each iteration is
    :meth:`agent_info` (before the collection), :meth:`learn_from` (the push and the gradient steps) and
    :meth:`record`. The solo loop drives one; a population drives one per member."""

    def __init__(self, setup: Setup, run: Run, stack: contextlib.ExitStack, n_rows: int):
        algo, config, spec, resume, device, world = (setup.algorithm, setup.config, setup.spec, setup.resume,
                                                     setup.learner_device, setup.world)
        self.setup, self.run, self.n_rows = setup, run, n_rows
        seed = learner_seed(run.seed, world)
        self.learner = learner = algo.make_learner(config, spec, resume, device=device, seed=seed, n_rows=n_rows)
        self.saved = _declared(learner)
        if resume is not None and isinstance(learner.state, LearnerState):
            load_state(learner.policy, resume.model, "the policy", resume.path)
            learner.state.load_state_dict(resume.learner, path=resume.path)
        run.stop_rule.guard.watch(learner.policy.state_dict)
        self.buffer = make_replay_buffer(config, spec, device, seed=seed, folder=run.logdir, rank=world.rank)
        stack.callback(self.buffer.close)
        self.episodes = TrainingEpisodes(n_rows, device)
        self.first_step = run.env_steps  # the (re)filling of the buffer counts from this session's first step
        self.weights = functools.partial(cpu_state_dict, learner.policy)  # an evaluation's, only when one is due

    def agent_info(self) -> tuple[DictTensor | None, dict[str, Any]]:
        """The next collection's ``agent_info`` (``None``: the batcher's) and the statistics it is recorded with."""
        return self.learner.agent_info(self.run.env_steps)

    def learn_from(self, traj: Trajectories, stats: dict[str, Any],
                   phase: Callable[[str], Any]) -> tuple[Trajectories, int]:
        """Pushes a collection into the buffer and takes the gradient steps due (statistics into ``stats``);
        returns the collection on the learner's device and the steps taken."""
        traj, n_steps = self.push(traj, stats, phase)
        self.gradient_steps(n_steps, stats, phase)
        return traj, n_steps

    def push(self, traj: Trajectories, stats: dict[str, Any],
             phase: Callable[[str], Any]) -> tuple[Trajectories, int]:
        """Pushes a collection into the buffer; returns it on the learner's device and the gradient steps due."""
        config, device, world, learner = self.setup.config, self.setup.learner_device, self.setup.world, self.learner
        with phase("to_learner"):
            traj = traj.to(device)
        if config.check_devices:
            check_on_device(traj, device, "the trajectories given to the learner")
            for what, module in learner.checked().items():
                check_on_device(module, device, what)
        tt = traj.trajectories
        n_new = self.n_rows * tt.temporal_size()  # this rank's; every rank's together count in the budget
        with phase("push"):
            self.buffer.push_steps(**learner.transitions(tt))
        stats["buffer_size"] = float(len(self.buffer))
        filled = self.run.env_steps + n_new * world.size - self.first_step >= config.learning_starts
        n_steps = fewest_over_ranks(learner.n_gradient_steps(n_new, len(self.buffer)) if filled else 0, world)
        self.buffer.anneal(self.run.budget_used())  # a prioritized buffer's importance-sampling exponent
        return traj, n_steps

    def gradient_steps(self, n_steps: int, stats: dict[str, Any], phase: Callable[[str], Any]) -> None:
        """``n_steps`` gradient steps (the last one's statistics into ``stats``)."""
        with phase("learn"):
            for _ in range(n_steps):
                stats.update(self.learner.gradient_step(self.buffer))

    def record(self, traj: Trajectories, stats: dict[str, Any], evaluator: Evaluator) -> None:
        """The iteration's record (:func:`~.family.record_iteration`): its env steps over every rank."""
        tt = traj.trajectories
        self.episodes.add(tt, stats)
        record_iteration(self.run, evaluator, self.n_rows * tt.temporal_size() * self.setup.world.size, stats,
                         model=self.learner.policy, learner=self.saved, weights=self.weights)

    def finish(self, evaluator: Evaluator) -> TrainResult:
        """The run's end (:func:`~.finish.finish_training`)."""
        return finish_training(self.run, evaluator, self.learner.policy, self.setup.spec,
                               title=self.setup.algorithm.title, learner=self.saved())


def train_off_policy(setup: Setup, *, timer: LoopTimer | None = None) -> TrainResult:
    """Trains ``setup.algorithm`` (an :class:`OffPolicyAlgorithm`) and returns the final evaluation and the run's
    history.

    With ``setup.resume``, the policy's weights and the learner's declared ``state`` come from the checkpoint. With
    ``timer``, every iteration's phases are timed as the on-policy loop's are (``collect``, ``to_learner``, then
    ``push`` into the replay buffer, ``learn``: the gradient steps, ``update_weights`` and ``record``) and the
    training batcher times its own (``rlstruct profile``).

    A resumed run's replay buffer is not in the checkpoint: it refills for ``learning_starts`` env steps before the
    first gradient step of the new session. A buffer kept in memory that needs more than the machine has available
    is refused before anything starts (:func:`~.replay_setup.check_replay_fits`), as is one on disk that needs more
    than the disk has free; a prioritized one anneals its importance-sampling exponent over the step budget.

    An algorithm whose config has the fast path's parts (DQN) takes it as the on-policy loop does: with
    ``cuda_graph`` the training batcher replays each acquisition, and the evaluation batcher each chunk, as one CUDA
    graph; with ``share_weights`` an in-process batcher on the learner's device reads the learner's weights there
    instead of a CPU copy after each update. Nothing of an iteration then waits for the device but the captured
    acquisition's reload of a new ``agent_info`` from the learner, the push of stacked frames (it reads their count
    of new frames; a buffer of whole observations keeps pairs on an accelerator and reads nothing) and the record's
    conversion every ``log_every`` iterations.
    """
    algo: OffPolicyAlgorithm = setup.algorithm  # type: ignore[assignment]
    config, spec, resume, device, world = setup.config, setup.spec, setup.resume, setup.learner_device, setup.world
    check_replay_fits(config, spec, device, folder=replay_folder(run_logdir(algo.name, config, resume), world.rank))
    with open_run(setup) as (run, stack):
        # Batchers first, the learner on its device after: no CUDA in this process before workers spawn.
        batcher, evaluator = open_batchers(stack, config, spec, algo.agent(config.to_dict()),
                                           agent_kwargs=training_agent_kwargs(config),
                                           n_timesteps=config.rollout_steps, autoreset=True,
                                           cuda_graph=isinstance(config, CapturedPart) and config.cuda_graph,
                                           explore=algo.make_learner.exploration(config),
                                           evaluate=algo.evaluation_agent_info(config.to_dict()),
                                           seed=run.seed, rank=world.rank, run=run,
                                           sync_timings=timer is not None and timer.sync)
        B = batcher.n_elems()
        member = OffPolicyLearning(setup, run, stack, B)
        learner = member.learner
        _join_ranks(world, device, config, stack, learner.tensors())
        announce(world, "transitions of a replay minibatch, from the rank's own buffer", config.batch_size, config.lr)

        # The policy's weights reach the training batcher as the on-policy loop's do: shared on the learner's device
        # with an in-process batcher there (config.share_weights), as a CPU copy after each update otherwise.
        collect = start_pipeline(stack, batcher, learner.policy, config, device=device)
        phase = untimed if timer is None else timer
        if timer is not None:
            timer.watch(batcher)
        if world.is_logger:
            evaluator.schedule(member.weights, run.iteration, run.env_steps)
        while not all_ranks_stop(run.should_stop(), world):
            with until_a_worker_fails(run.stop_rule):
                agent_info, stats = member.agent_info()
                with phase("collect"):
                    traj = collect.next(agent_info)
                traj, n_steps = member.learn_from(traj, stats, phase)
                if n_steps:
                    with phase("update_weights"), until_a_worker_fails(run.stop_rule):
                        collect.updated()
                with phase("record"):
                    member.record(traj, stats, evaluator)

        check_models_agree(learner.tensors(), world)
        return member.finish(evaluator)
    return finish_diverged(run, title=algo.title)  # the loop raised, and the divergence found explains it


# The families' descriptions name their loops by family (the registry sits beneath this module, which hands them in).
FAMILY_LOOPS["on-policy"], FAMILY_LOOPS["off-policy"] = train_on_policy, train_off_policy


def run(setup: Setup, *, timer: LoopTimer | None = None) -> TrainResult:
    """Trains from a checked :class:`~.session.Setup` in the loop its algorithm's description carries
    (:attr:`~.registry.Algorithm.loop`), timed by ``timer`` when given (``rlstruct profile``), then releases the log
    folder's lock (:attr:`~.session.Setup.lock`), also when training raised."""
    try:
        return setup.algorithm.loop(setup, timer=timer)
    finally:
        if setup.lock is not None:
            setup.lock.release()


def train(algorithm: Algorithm, config: RunConfig, *, seeds: Sequence[int] | None = None) -> Any:
    """Trains ``algorithm`` with ``config`` and returns the final evaluation and the run's history.

    With ``resume``, the weights, the optimizer's state and the learner's come from the checkpoint. With ``seeds``
    (or ``config.seeds``), the seeds train as one population in this process, each its own run in
    ``logdir/seed-S`` (``resume``: the population's folder), and the result is the list of the members' results,
    in seed order (:func:`~.population_loop.train_population`).

    Raises:
        ValueError: what :func:`~.session.validate` raises: a setting out of range, or one of its subclasses
            (``DeviceUnavailableError``, ``SpaceError``, ``ConfigError``, ``CheckpointError``) for a device, the
            env or ``resume``.
    """
    if seeds is not None:
        config = dataclasses.replace(config, seeds=tuple(seeds))
    if config.seeds is not None:
        return FAMILY_LOOPS["population"](algorithm, config)
    setup = validate(algorithm, config)
    with given_back_unless_trained(setup.claim):
        return run(setup)


def trainer(algorithm: Algorithm) -> Callable[[Any], TrainResult]:
    """The ``train(config)`` of ``algorithm``'s module: :func:`train` of ``algorithm``.

    >>> from rlstruct.algos import ppo
    >>> ppo.train.__name__, ppo.train.__module__, ppo.train.__doc__.split(":")[0]
    ('train', 'rlstruct.algos.ppo', 'Trains PPO with ``config`` (a ``PPOConfig``) and returns its TrainResult')
    """

    def train_algorithm(config: Any, *, seeds: Sequence[int] | None = None) -> Any:
        return train(algorithm, config, seeds=seeds)

    train_algorithm.__name__ = train_algorithm.__qualname__ = "train"
    train_algorithm.__module__ = algorithm.config_cls.__module__
    train_algorithm.__doc__ = (f"Trains {algorithm.title} with ``config`` (a ``{algorithm.config_cls.__name__}``) "
                               "and returns its TrainResult: the harness's train of the module's ALGORITHM (with "
                               "``seeds``, a population of those seeds in one process, one result per member).")
    return train_algorithm
