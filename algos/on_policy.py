"""The on-policy loop, written once for A2C, PPO, REINFORCE and PQN: collect, normalise, learn, send the weights to
the batchers, record, evaluate, checkpoint, stop.

An algorithm hands the loop an :class:`OnPolicyAlgorithm`: its name, config and checks, whether it learns from
whole episodes, its networks (:class:`PolicyNetworks`: the actor-critic, or PQN's Q-network) and the schedule of
its exploration, and ``make_learn``, which builds its learn step from the learner's parts
(:class:`ActorCriticLearner`: the model, the agent that replays it, the optimizer, the device). The learn step
takes one collection (``Trajectories`` on the learner's device) and the rewards the loss sees (normalised when
``normalize_rewards``) and returns the iteration's statistics: A2C takes one gradient step, PPO epochs of
minibatches with its clipped loss, REINFORCE one step over whole episodes, PQN epochs of minibatches regressing
on Q(lambda) targets.

**A function, not a base class.** The loop is one function over a frozen description of the algorithm's pieces,
so that one iteration reads top to bottom in one place, and an algorithm file holds only what is its own (config,
loss, learn step) with no override order to learn: there is no ``super()`` to call, no hook that a subclass may
or may not override, and every piece the loop calls is a named field. The capabilities every algorithm of the
family gets land here, once: the collection mode (a pipeline of auto-reset envs, optionally overlapped with
learning, or episodic acquisitions), observation and reward normalisation, resuming, periodic checkpoints. The
ones still to come have one place each: presets build the config before :func:`~rlstruct.algos.setup.prepare`; a
restart of crashed workers wraps the collection (:func:`_collector`); data-parallel learners all-reduce the
gradients as they accumulate (``Tensor.register_post_accumulate_grad_hook`` on the parameters of
:attr:`ActorCriticLearner.model`, during the backward and so before the clipping and the optimizer's step, as
DDP does) where the :class:`ActorCriticLearner` is built, and the records, evaluations and checkpoints of
:func:`train_on_policy` (``run.record``, ``run.poll_evaluation``, ``run.poll_checkpoint``, ``finish_training``)
are the lines that only the logging process runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos.checkpoints import load_state
from rlstruct.algos.distributed import (
    World,
    all_ranks_stop,
    announce,
    average_gradients,
    broadcast_parameters,
    check_models_agree,
    global_sum,
    init_process_group,
    sum_over_ranks,
)
from rlstruct.algos.evaluation import evaluation_info
from rlstruct.algos.networks import PolicyAgent, build_actor_critic, create_policy_agent
from rlstruct.algos.optim import OptimizerLike
from rlstruct.algos.record import TrainResult
from rlstruct.algos.recurrent import RecurrentPolicyAgent, create_recurrent_agent, recurrent_actor_critic
from rlstruct.algos.returns import episode_returns, episode_statistics
from rlstruct.algos.run import check_on_device, finish_training, open_batchers, seeded_model, training_run
from rlstruct.algos.setup import Algorithm, Setup
from rlstruct.algos.update import actor_critic_learner, start_pipeline, training_agent_kwargs, weight_sync_mode
from rlstruct.batchers import Pipeline, RL_Batcher, WeightSync
from rlstruct.devices import cpu_state_dict
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["LearnFn", "ActorCriticLearner", "PolicyNetworks", "actor_critic_networks", "OnPolicyAlgorithm",
           "train_on_policy"]

#: a learn step: ``(trajectories, loss_rewards [B, T]) -> statistics`` (0-d tensors or floats)
LearnFn = Callable[[Trajectories, torch.Tensor], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ActorCriticLearner:
    """The learner's parts that an on-policy learn step is built from.

    Attributes:
        model: the actor-critic (recurrent or not), or PQN's Q-network, on ``device``.
        agent: the learner's agent over ``model`` (:attr:`PolicyNetworks.agent`'s), to replay a collection.
        checked_agent: ``agent`` in an :class:`~rlstruct.agents.RL_Agent_CheckDevice` with ``check_devices``,
            else ``agent``.
        optimizer: the model's Adam.
        device: the learner's device.
        seed: this session's seed (for the learn step's own generators).
        world: this process's rank in a data-parallel run (the gradients are averaged already; a learn step asks it
            only for a decision that every rank takes alike, e.g. PPO's early stop).
    """

    model: nn.Module
    agent: RL_Agent
    checked_agent: RL_Agent
    optimizer: OptimizerLike
    device: torch.device
    seed: int
    world: World = World()


@dataclasses.dataclass(frozen=True)
class PolicyNetworks:
    """The networks of an on-policy algorithm, as the loop builds them.

    Attributes:
        build: ``(spec, hidden_sizes, **model_kwargs) -> model``, the learner's model.
        create_agent: the batchers' agent factory (module level, so it pickles).
        agent: ``(model, device) -> agent``, the learner's agent over its model.
        model_kwargs: what the model and every batcher's agent are built with.
        explore: the training ``agent_info``, one value per key (the batcher's example).
    """

    build: Callable[..., nn.Module]
    create_agent: Callable[..., RL_Agent]
    agent: Callable[[nn.Module, torch.device], RL_Agent]
    model_kwargs: dict[str, Any]
    explore: dict[str, bool | float]


def actor_critic_networks(config: Any) -> PolicyNetworks:
    """The actor-critic of A2C, PPO and REINFORCE (the LSTM one with ``recurrent``), sampling its actions."""
    model_kwargs = {"normalize_observations": config.normalize_observations}
    if getattr(config, "recurrent", False):
        return PolicyNetworks(recurrent_actor_critic, create_recurrent_agent, RecurrentPolicyAgent, model_kwargs,
                              {"stochastic": True})
    return PolicyNetworks(build_actor_critic, create_policy_agent, PolicyAgent, model_kwargs, {"stochastic": True})


@dataclasses.dataclass(frozen=True)
class OnPolicyAlgorithm(Algorithm):
    """An on-policy algorithm as :func:`train_on_policy` runs it (see :class:`Algorithm` for the other fields).

    Attributes:
        make_learn: ``(config, learner) -> learn step`` (:data:`LearnFn`).
        episodic: collect whole episodes (episodic envs, an acquisition as long as the time limit, the envs reset
            every iteration) instead of ``config.n_steps`` steps of auto-reset envs.
        networks: ``config -> PolicyNetworks`` (default: :func:`actor_critic_networks`).
        schedule: ``(config, env_steps, n_rows) -> (agent_info, statistics)``: the ``agent_info`` (``n_rows`` rows,
            CPU) of the next collection, and the statistics it is recorded with (e.g. PQN's epsilon); ``None``:
            ``networks``' ``explore`` throughout.
    """

    make_learn: Callable[[Any, ActorCriticLearner], LearnFn] | None = None
    episodic: bool = False
    networks: Callable[[Any], PolicyNetworks] = actor_critic_networks
    schedule: Callable[[Any, int, int], tuple[DictTensor, dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        if self.make_learn is None:  # a field with a default only because Algorithm's last fields have one
            raise TypeError(f"OnPolicyAlgorithm {self.name!r} needs make_learn, got None; pass its learn-step builder")


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


def _collector(setup: Setup, stack: contextlib.ExitStack, batcher: RL_Batcher,
               model: nn.Module) -> Pipeline | _Episodes:
    """The training batcher's acquisitions as the loop consumes them: a started
    :class:`~rlstruct.batchers.Pipeline` of auto-reset envs, or :class:`_Episodes`."""
    config = setup.config
    if setup.algorithm.episodic:
        return _Episodes(batcher, WeightSync(batcher, model, setup.learner_device, weight_sync_mode(config)))
    return start_pipeline(stack, batcher, model, config, device=setup.learner_device, overlap=config.overlap)


def train_on_policy(setup: Setup) -> TrainResult:
    """Trains ``setup.algorithm`` (an :class:`OnPolicyAlgorithm`) and returns the final evaluation and the run's
    history.

    With ``setup.resume``, the weights, the optimizer's state and the return statistics come from the checkpoint.
    """
    algo: OnPolicyAlgorithm = setup.algorithm  # type: ignore[assignment]
    config, spec, resume, learner, world = setup.config, setup.spec, setup.resume, setup.learner_device, setup.world
    networks = algo.networks(config)
    logger = world.is_logger  # rank 0 of a data-parallel run, or a plain run
    with training_run(algo.name, config, spec, start=setup.start, resume=resume, logger=logger,
                      world_size=world.size) as (run, stack):
        model_kwargs = networks.model_kwargs
        model = seeded_model(config.seed, functools.partial(networks.build, **model_kwargs), spec, config.hidden_sizes)
        if resume is not None:
            load_state(model, resume.model, "the model", resume.path)
        # Batchers first, model to the learner device after: no CUDA in this process before workers spawn.
        if algo.episodic:  # n_timesteps = the time limit: one execute runs every env's episode to its end
            steps: dict[str, Any] = {"n_timesteps": spec.max_episode_steps, "autoreset": False}
        else:  # with overlap in process, the batcher's double buffer keeps batch k whole while k + 1 is written
            steps = {"n_timesteps": config.n_steps, "autoreset": True, "cuda_graph": config.cuda_graph,
                     "zero_copy": config.overlap and config.n_processes == 0}
        batcher, evaluator = open_batchers(stack, config, spec, networks.create_agent, explore=networks.explore,
                                           evaluate=evaluation_info(algo.name, config.to_dict()),
                                           agent_kwargs=training_agent_kwargs(config), model_kwargs=model_kwargs,
                                           seed=run.seed, rank=world.rank, run=run, **steps)

        model.to(learner)
        # Data-parallel ranks (torchrun): after the workers spawned; rank 0's weights everywhere, gradients averaged.
        init_process_group(world, learner, timeout_s=config.batcher_timeout, stack=stack)
        broadcast_parameters(model, world)
        for handle in average_gradients(model, world):
            stack.callback(handle.remove)
        agent = networks.agent(model, learner)
        B = batcher.n_elems()
        announce(world, "envs of a collection" if algo.episodic else "env steps of a collection",
                 B if algo.episodic else B * config.n_steps, config.lr)
        optimizer, normalize, learner_state = actor_critic_learner(
            model, config, n_rows=B, device=learner, resume=resume, sum_over_ranks=sum_over_ranks(world))
        checked = RL_Agent_CheckDevice(agent, learner) if config.check_devices else agent
        learn = algo.make_learn(config, ActorCriticLearner(model, agent, checked, optimizer, learner, run.seed, world))
        carry_return = torch.zeros(B, device=learner)
        carry_length = torch.zeros(B, dtype=torch.int64, device=learner)

        collect = _collector(setup, stack, batcher, model)
        if world.is_logger:
            evaluator.launch(cpu_state_dict(model), run.iteration, run.env_steps)
        while not all_ranks_stop(run.should_stop(), world):
            agent_info, stats = algo.schedule(config, run.env_steps, B) if algo.schedule else (None, {})
            traj = collect.next(agent_info).to(learner)
            tt = traj.trajectories
            loss_rewards = normalize(tt)  # before any forward: the values and the loss see the same statistics
            if getattr(config, "anneal_lr", False):
                optimizer.param_groups[0]["lr"] = config.lr * (1.0 - run.budget_used())
            if config.check_devices:
                check_on_device(model, learner, "the learner's model")
            stats.update(learn(traj, loss_rewards))
            collect.updated()

            if algo.episodic:
                ep_returns, lengths = episode_returns(traj)
                stats["train/episode_return"] = ep_returns.mean()
                stats["train/episode_length"] = lengths.float().mean()
                n_steps = global_sum(int(lengths.sum()), world)
            else:
                ret_sum, len_sum, count, carry_return, carry_length = episode_statistics(
                    tt["_observation/reward"], tt["_observation/done"], carry_return, carry_length
                )
                # nan (0 / 0) when no episode ended in this window.
                stats["train/episode_return"] = ret_sum / count
                stats["train/episode_length"] = len_sum / count
                n_steps = B * tt.temporal_size() * world.size  # env steps of all ranks: the budget is global
            run.record(n_steps, stats)
            if world.is_logger:
                run.poll_evaluation(evaluator, lambda: cpu_state_dict(model))
                run.poll_checkpoint(model, learner_state)
        collect.close()  # an acquisition launched during the last update: close the batcher with nothing pending

        check_models_agree(model, world)
        return finish_training(run, evaluator, model, spec, title=algo.title, learner=learner_state())
