"""A population of seeds trained in one process (``rlstruct train ALGO --seeds 0,1,2``): each member is the run of its
seed, in its own folder ``ROOT/seed-S`` (its config, ``progress.csv``, checkpoints, evaluations, stop and
``summary.json``: every command reads it as any run), and the members' envs are one training batcher whose rows
``k * n_envs, ...`` are member ``k``'s, seeded and acted upon as the solo run of its seed
(:func:`open_population_batcher`).

Each member's learner is the family's own (:class:`~.loops.OnPolicyLearning`, :class:`~.loops.OffPolicyLearning`),
so a member takes the solo run's steps: the same env steps, evaluations, stop and rows. A member that stops (its
target, its budget, a divergence) ends its run there while the others go on; its envs keep stepping in the shared
batcher, their steps counted nowhere. A signal stops every member after the iteration under way, each writing its
checkpoint; a batcher worker that fails with no restart left stops them all as it stops a solo run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from rlstruct.agents import RL_Agent
from rlstruct.algos._env_spec import EnvSpec, create_env
from rlstruct.algos._train.checkpoints import load_state
from rlstruct.algos._train.config import CapturedPart, RunConfig, training_workers
from rlstruct.algos._train.evaluation import agent_info_row
from rlstruct.algos._train.family import open_run, until_a_worker_fails
from rlstruct.algos._train.finish import explained_by_divergence, finish_diverged
from rlstruct.algos._train.folder_claim import given_back_unless_trained
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.loops import OffPolicyLearning, OnPolicyLearning, collector, untimed
from rlstruct.algos._train.registry import FAMILY_LOOPS, Algorithm
from rlstruct.algos._train.replay_setup import check_replay_fits, replay_folder
from rlstruct.algos._train.result import TrainResult
from rlstruct.algos._train.run_folder import earlier_run_files
from rlstruct.algos._train.seeds import AGENT_SEEDS, ENV_SEEDS, check_seeds, role_seed
from rlstruct.algos._train.session import (
    Setup,
    open_batchers,
    open_evaluator,
    seeded_model,
    stop_at_once,
    stop_on_signals,
    validate,
    worker_args,
)
from rlstruct.algos._train.update import start_pipeline, training_agent_kwargs
from rlstruct.algos.population import PopulationAgent, create_member_envs, member_env_seeds
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import cpu_state_dict
from rlstruct.errors import ConfigError, RunFinishedError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["POPULATION_FILE", "member_folder", "population_seeds", "train_population"]

log = logging.getLogger(__name__)

#: the file in a population's root folder that names its members
POPULATION_FILE = "population.json"


def member_folder(root: str | Path, seed: int) -> Path:
    """Where member ``seed`` of the population in ``root`` writes its run: ``root/seed-S``."""
    return Path(root) / f"seed-{seed}"


def population_seeds(root: str | Path) -> tuple[int, ...] | None:
    """The seeds of the population whose root folder is ``root`` (its :data:`POPULATION_FILE`, else its ``seed-S``
    folders that hold a run), or ``None`` when ``root`` is not a population's folder."""
    root = Path(root)
    if not root.is_dir() or (root / "checkpoint.pt").exists():
        return None
    listed = root / POPULATION_FILE
    if listed.is_file() and not listed.is_symlink():
        try:
            seeds = json.loads(listed.read_text())["seeds"]
            return check_seeds(seeds, argument=str(listed))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    found = sorted(int(m.group(1)) for p in root.iterdir()
                   if (m := re.fullmatch(r"seed-(\d+)", p.name)) and (p / "checkpoint.pt").is_file())
    return tuple(found) if len(found) >= 2 else None


def open_population_batcher(
    stack: contextlib.ExitStack,
    config: RunConfig,
    spec: EnvSpec,
    create_agent: Callable[..., RL_Agent],
    *,
    seeds: Sequence[int],
    n_timesteps: int,
    explore: dict[str, bool | float],
    agent_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    zero_copy: bool = False,
    sync_timings: bool = False,
) -> RL_Batcher:
    """The training batcher of a population of seeds (``config.seeds``), closed by ``stack``: ``config.n_envs``
    auto-reset envs per member, member ``k``'s rows ``k * n_envs, ...``, seeded as the training batcher of the solo
    run of ``seeds[k]`` (:func:`open_batchers`'s roles): its envs reset as that run's, and its agent (the member's,
    in a :class:`~rlstruct.algos.population.PopulationAgent`) draws as that run's agent, whatever the worker that
    steps them. ``config.n_processes`` workers split the ``len(seeds) * n_envs`` rows evenly; a worker holding rows of
    several members needs an env whose state can be set (the torch simulators).

    Args: as :func:`open_batchers`'s, ``seeds`` the members' session seeds (each member run's ``run.seed``).
    """
    agent_args, env_args = worker_args(config, spec)
    agent_args.update(model_kwargs or {})
    env_rows, agent_rows = member_env_seeds([(role_seed(s, ENV_SEEDS), role_seed(s, AGENT_SEEDS)) for s in seeds],
                                            config.n_envs)
    per_worker = len(seeds) * config.n_envs // training_workers(config)
    member_args = {**agent_args, **(agent_kwargs or {}), "device": config.batcher_device}
    population_args = {"create_member": create_agent, "member_args": member_args, "rows": agent_rows,
                       "members": [role_seed(s, AGENT_SEEDS) for s in seeds], "n_rows": per_worker,
                       "device": config.batcher_device}
    envs_args = {"n_envs": per_worker, "rows": env_rows, "create_env": create_env,
                 "env_args": {**env_args, "autoreset": True, "device": config.batcher_device}}
    batcher = RL_Batcher(n_timesteps, PopulationAgent, population_args, create_member_envs, envs_args,
                         config.n_processes, 0, agent_info=agent_info_row(explore), agent_seeds=0,
                         device=config.batcher_device, timeout=config.batcher_timeout,
                         start_timeout=config.start_timeout, restart_workers=config.restart_workers,
                         zero_copy=zero_copy, sync_timings=sync_timings)
    stack.callback(batcher.close)
    return batcher


def _check_population(algorithm: Algorithm, config: RunConfig, world_size: int) -> None:
    """Refuses the settings a population does not run (yet), each with what to do instead."""
    refusals = {
        "data-parallel ranks (torchrun)": world_size > 1,
        "Ray actors (ray_actors)": config.ray_actors > 0,
        "CUDA-graph capture (cuda_graph)": isinstance(config, CapturedPart) and config.cuda_graph,
    }
    for what, refused in refusals.items():
        if refused:
            raise ConfigError(f"seeds={list(config.seeds or ())}: a population of seeds does not run {what} "
                              f"({algorithm.name}); train one process a seed (--seed S) instead")
    workers = max(config.n_processes, 1)
    if (len(config.seeds or ()) * config.n_envs) % workers:
        raise ConfigError(f"n_processes must split the population's {len(config.seeds)} x {config.n_envs} envs "
                          f"evenly, got {config.n_processes}; pass --n-processes dividing "
                          f"{len(config.seeds) * config.n_envs}")


def member_configs(config: RunConfig) -> list[RunConfig]:
    """Each member's config: ``config`` with its seed, its folder ``logdir/seed-S`` and, resuming the population in
    ``resume``, its run there (``logdir`` default: ``resume``)."""
    seeds = check_seeds(config.seeds)
    root = Path(config.logdir) if config.logdir is not None else None
    out = []
    for seed in seeds:
        resume = None if config.resume is None else str(member_folder(config.resume, seed))
        logdir = None if root is None else str(member_folder(root, seed))
        if logdir is None and resume is not None:
            logdir = resume
        out.append(dataclasses.replace(config, seed=seed, logdir=logdir, resume=resume))
    return out


def validate_population(algorithm: Algorithm, config: RunConfig, *, given: frozenset[str] | None = None,
                        start: float | None = None) -> list[Setup]:
    """:func:`~.session.validate` of each member's config (:func:`member_configs`); a member that fails gives back
    the folders the others claimed. A resumed member that has finished (:class:`~rlstruct.errors.RunFinishedError`:
    these settings give it nothing more to do) is left as it is, the others go on; when every member has finished,
    that error, naming them. The members' root folder gets :data:`POPULATION_FILE`."""
    seeds = check_seeds(config.seeds)
    if config.logdir is None and config.resume is None:  # runs/ALGO-ENV-seeds-S1_S2_..., numbered -2, -3 when taken
        base = Path("runs") / f"{algorithm.name}-{config.env.replace('/', '-')}-seeds-{'_'.join(map(str, seeds))}"
        root, n = base, 1
        while any(earlier_run_files(member_folder(root, seed)) for seed in seeds):
            n += 1
            root = base.with_name(f"{base.name}-{n}")
        config = dataclasses.replace(config, logdir=str(root))
    if config.resume is None:  # a member's folder is ROOT/seed-S: one holding a run is not numbered away
        for member in member_configs(config):
            found = earlier_run_files(Path(member.logdir))
            if found:
                raise ConfigError(f"logdir={config.logdir!r} holds a run of seed {member.seed} already "
                                  f"({member.logdir}: {', '.join(found[:3])}); pass a new --logdir, or --resume "
                                  f"{config.logdir} to continue the population")
    setups: list[Setup] = []
    finished: list[str] = []
    try:
        for member in member_configs(config):
            try:
                setups.append(validate(algorithm, member, given=given, start=start))
            except RunFinishedError as e:
                log.warning("seed %d: %s", member.seed, str(e).splitlines()[0])
                finished.append(str(member.seed))
        if not setups:
            raise RunFinishedError(f"every member of the population in {config.resume} has finished (seeds "
                                   f"{', '.join(finished)}); pass a larger --max-env-steps to train on")
        _check_population(algorithm, setups[0].config, setups[0].world.size)
    except BaseException:
        for setup in setups:
            if setup.lock is not None:
                setup.lock.release()
            if setup.claim is not None:
                setup.claim.release()
        raise
    root = Path(setups[0].config.logdir).parent
    listed = root / POPULATION_FILE
    if not listed.is_symlink():
        listed.write_text(json.dumps({"algorithm": algorithm.name, "env": config.env, "seeds": list(seeds)}) + "\n")
    return setups


def train_population(algorithm: Algorithm, config: RunConfig, *, given: frozenset[str] | None = None,
                     start: float | None = None) -> list[TrainResult]:
    """Trains the population of ``config.seeds`` in one process and returns each member's result, in seed order
    (see the module's docstring); resumed members that have finished are left out, with a warning.
    """
    if algorithm.population_loop is None:
        raise ConfigError(f"seeds={list(config.seeds or ())}: {algorithm.name}'s family trains one seed a process "
                          "(its description has no population_loop); train one process a seed (--seed S)")
    setups = validate_population(algorithm, config, given=given, start=start)
    try:
        with contextlib.ExitStack() as claims:
            for setup in setups:
                claims.enter_context(given_back_unless_trained(setup.claim))
            return algorithm.population_loop(setups)
    finally:
        for setup in setups:
            if setup.lock is not None:
                setup.lock.release()


class _Population:
    """The members' runs, their learners (``on_policy``: :class:`~.loops.OnPolicyLearning`, else
    :class:`~.loops.OffPolicyLearning`) and evaluators, and the one training batcher."""

    def __init__(self, setups: list[Setup], on_policy: bool):
        self.setups, self.on_policy = setups, on_policy
        self.algorithm = setups[0].algorithm
        self.results: dict[int, TrainResult] = {}

    def train(self) -> list[TrainResult]:
        setups, algo = self.setups, self.algorithm
        config = setups[0].config
        if not self.on_policy:
            for setup in setups:
                check_replay_fits(setup.config, setup.spec, setup.learner_device,
                                  folder=replay_folder(Path(setup.config.logdir), 0))
        error: BaseException | None = None
        with contextlib.ExitStack() as frames:
            opened = [frames.enter_context(open_run(setup)) for setup in setups]
            self.runs: list[Run] = [run for run, _ in opened]
            frames.enter_context(stop_on_signals(*(run.stop_rule for run in self.runs)))
            try:
                self._loop(frames, [stack for _, stack in opened], config)
            except BaseException as e:
                error = e
                raise
        # Left here, a member's divergence explained an error: the members it did not end end now.
        for k, run in enumerate(self.runs):
            if k not in self.results:
                if run.stop_rule.diverged is None:
                    raise error if error is not None else RuntimeError("a member of the population did not end")
                self.results[k] = finish_diverged(run, title=algo.title)
        return [self.results[k] for k in range(len(setups))]

    def _loop(self, frames: contextlib.ExitStack, stacks: list[contextlib.ExitStack], config: RunConfig) -> None:
        algo, setups, runs = self.algorithm, self.setups, self.runs
        spec, device, n = setups[0].spec, setups[0].learner_device, config.n_envs
        on_policy, episodic = self.on_policy, getattr(algo, "episodic", False)
        create_agent = algo.agent(config.to_dict())
        if on_policy:
            agent_kwargs, model_kwargs = algo.model.agent_kwargs(config)
            explore = algo.model.explore(config)
            models = [seeded_model(s.config.seed, algo.model.build, s.config, spec) for s in setups]
            for model, setup in zip(models, setups):
                if setup.resume is not None:
                    load_state(model, setup.resume.model, "the model", setup.resume.path)
        else:
            agent_kwargs, model_kwargs = training_agent_kwargs(config), None
            explore = algo.make_learner.exploration(config)
        # Batchers first, the learners on their device after: no CUDA in this process before workers spawn.
        if episodic:  # whole episodes: each member's own episodic batcher, as its solo run has it
            batchers = [open_batchers(stack, s.config, spec, create_agent, n_timesteps=spec.max_episode_steps,
                                      autoreset=False, explore=explore,
                                      evaluate=algo.evaluation_agent_info(s.config.to_dict()),
                                      agent_kwargs=agent_kwargs, model_kwargs=model_kwargs, seed=run.seed, run=run)
                        for s, run, stack in zip(setups, runs, stacks)]
            evaluators = [evaluator for _, evaluator in batchers]
        else:
            steps = config.n_steps if on_policy else config.rollout_steps
            shared = open_population_batcher(frames, config, spec, create_agent, seeds=[run.seed for run in runs],
                                             n_timesteps=steps, explore=explore, agent_kwargs=agent_kwargs,
                                             model_kwargs=model_kwargs,
                                             zero_copy=on_policy and config.overlap and config.n_processes == 0)
            evaluators = [open_evaluator(stack, s.config, spec, create_agent,
                                         evaluate=algo.evaluation_agent_info(s.config.to_dict()),
                                         model_kwargs=model_kwargs, seed=run.seed)
                          for s, run, stack in zip(setups, runs, stacks)]
            for run, evaluator in zip(runs, evaluators):
                if config.restart_workers:
                    run.columns["batcher/restarts"] = lambda e=evaluator: shared.n_restarts + e.batcher.n_restarts
        signalled = next((run.stop_rule.signal for run in runs if run.stop_rule.signal is not None), None)
        if signalled is not None:  # held while the workers started: nothing is trained yet
            stop_at_once(signalled)
        if on_policy:
            members: list[Any] = []
            for setup, run, model in zip(setups, runs, models):
                model.to(device)
                run.stop_rule.guard.watch(model.state_dict)
                members.append(OnPolicyLearning(setup, run, model, n))
            policies = models
        else:
            members = [OffPolicyLearning(s, run, stack, n) for s, run, stack in zip(setups, runs, stacks)]
            policies = [m.learner.policy for m in members]
        # an off-policy learner that steps every member at once (DQN's), which then owns the members' training state
        batched = None
        if not on_policy and hasattr(type(members[0].learner), "population_step"):
            batched = type(members[0].learner).population_step([m.learner for m in members])
        if batched is not None:
            for k, member in enumerate(members):
                member.saved = _synced(batched, k, member.saved)
        if episodic:
            collectors = [collector(s, stack, batcher, model)
                          for s, stack, (batcher, _), model in zip(setups, stacks, batchers, policies)]
        else:
            population = nn.ModuleDict({str(k): p for k, p in enumerate(policies)})
            pipeline = start_pipeline(frames, shared, population, config, device=device,
                                      **({"overlap": config.overlap} if on_policy else {}))
        for run, evaluator, policy in zip(runs, evaluators, policies):
            evaluator.schedule(lambda p=policy: cpu_state_dict(p), run.iteration, run.env_steps)
        default_info = DictTensor.cat([agent_info_row(explore)] * n)  # n rows, one value per key
        last_infos: list[DictTensor | None] = [None] * len(members)
        active = list(range(len(members)))
        while True:
            for k in list(active):
                if runs[k].should_stop():
                    self.results[k] = members[k].finish(evaluators[k])
                    active.remove(k)
            if not active:
                break
            rules = [runs[k].stop_rule for k in active]
            with until_a_worker_fails(*rules):
                scheduled = [m.schedule() if on_policy else m.agent_info() for m in members]
                if episodic:
                    parts = {k: collectors[k].next(scheduled[k][0]) for k in active}
                else:
                    traj = pipeline.next(_side_by_side([info for info, _ in scheduled], last_infos, default_info))
                    parts = {k: traj.index(slice(k * n, (k + 1) * n)) for k in active}
                learned: dict[int, tuple[Trajectories, dict[str, Any]]] = {}
                updated: list[int] = []
                steps_due: dict[int, int] = {}
                for k, part in parts.items():
                    stats = scheduled[k][1]
                    try:
                        if on_policy:
                            learned[k] = (members[k].learn_from(part, stats, untimed), stats)
                            updated.append(k)
                        elif batched is not None:
                            part, steps_due[k] = members[k].push(part, stats, untimed)
                            learned[k] = (part, stats)
                        else:
                            part, n_steps = members[k].learn_from(part, stats, untimed)
                            learned[k] = (part, stats)
                            if n_steps:
                                updated.append(k)
                    except Exception as e:  # a member whose divergence explains it ends; the others go on
                        if not self._ended_by_divergence(k, e):
                            raise
                        active.remove(k)
                if steps_due:
                    updated = self._batched_steps(batched, members, steps_due, learned)
                if updated:
                    with until_a_worker_fails(*rules):
                        for k in updated:
                            if on_policy:
                                members[k].after_update(learned[k][0])
                            if episodic:
                                collectors[k].updated()
                        if not episodic:
                            pipeline.updated()
                for k, (part, stats) in learned.items():
                    members[k].record(part, stats, evaluators[k])
        if on_policy and not episodic:
            pipeline.close()

    @staticmethod
    def _batched_steps(batched: Any, members: list[Any], steps_due: dict[int, int],
                       learned: dict[int, tuple[Trajectories, dict[str, Any]]]) -> list[int]:
        """The gradient steps due, of every member at once (due alike: the members fill their buffers together);
        returns the members that stepped.

        Raises:
            ConfigError: members due different numbers of steps, which one batched step cannot take.
        """
        counts = set(steps_due.values())
        if len(counts) > 1:
            raise ConfigError(f"the members of a batched population must take their gradient steps together, got "
                              f"{steps_due} steps due (member: steps); train them with population_batched off "
                              "(--no-population-batched)")
        n = counts.pop()
        active = [k in steps_due for k in range(len(members))]
        for _ in range(n):
            rows = batched([m.buffer for m in members], active)
            for k in steps_due:
                learned[k][1].update(rows[k])
        if n:
            batched.write_back()
        return list(steps_due) if n else []

    def _ended_by_divergence(self, k: int, error: Exception) -> bool:
        """Ends member ``k`` as diverged when its divergence (found now, with its rows and weights) explains
        ``error``; ``False`` otherwise."""
        run = self.runs[k]
        run.flush()
        if not explained_by_divergence(run)(type(error), error, None):
            return False
        self.results[k] = finish_diverged(run, title=self.algorithm.title)
        return True


def _synced(batched: Any, k: int, saved: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """Member ``k``'s checkpointed learner state, after the batched step's state of it is written into its learner."""

    def state() -> dict[str, Any]:
        batched.sync(k)
        return saved()

    return state


def _side_by_side(infos: list[DictTensor | None], last: list[DictTensor | None],
                  default: DictTensor) -> DictTensor | None:
    """The members' ``agent_info`` side by side (``None``: every member keeps the batcher's), a member that gives
    none keeping its last (``default`` before any)."""
    if all(info is None for info in infos):
        return None
    for k, info in enumerate(infos):
        if info is not None:
            last[k] = info
    return DictTensor.cat([info if info is not None else default for info in last])


def train_on_policy_population(setups: list[Setup]) -> list[TrainResult]:
    """The on-policy family's population loop (:attr:`~.registry.Algorithm.population_loop`)."""
    return _Population(setups, on_policy=True).train()


def train_off_policy_population(setups: list[Setup]) -> list[TrainResult]:
    """The off-policy family's population loop (:attr:`~.registry.Algorithm.population_loop`)."""
    return _Population(setups, on_policy=False).train()


# The families' descriptions name their population loops (the registry sits beneath this module); ``train`` with
# seeds reaches train_population the same way.
FAMILY_LOOPS["on-policy population"] = train_on_policy_population
FAMILY_LOOPS["off-policy population"] = train_off_policy_population
FAMILY_LOOPS["population"] = train_population
