"""A training session: the one check of a run's settings before anything is built (:func:`validate`, which
gives a :class:`Setup`), the run's frame (:func:`training_run`: threads, precision, signals), its batchers
(:func:`open_batchers`, the training batcher's envs seeded by their global index, and :func:`open_evaluator`) and the
frame's exit (:mod:`~.finish` holds its end).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from rlstruct._accel import accelerator_for
from rlstruct._determinism import check_cublas_workspace, deterministic_mode, worker_environment
from rlstruct.agents import RL_Agent
from rlstruct.algos._env_spec import EnvSpec, create_env, describe_env, evaluation_env_kwargs
from rlstruct.algos._train.checkpoints import (
    CHECKPOINT_NAME,
    Resume,
    check_resume_algorithm,
    check_resume_env,
    load_checkpoint,
    load_resume,
)
from rlstruct.algos._train.compile_cache import check_compile_cache, compile_cache, jax_compile_cache
from rlstruct.algos._train.config import (
    AutocastPart,
    RunConfig,
    check_autocast,
    set_torch_threads,
    training_workers,
    validate_run_config,
)
from rlstruct.algos._train.distributed import World, rank_device, torchrun_restarts, world_from_environment
from rlstruct.algos._train.evaluation import Evaluator, agent_info_row
from rlstruct.algos._train.events import Evaluated
from rlstruct.algos._train.finish import explained_by_divergence
from rlstruct.algos._train.folder_claim import (
    FolderClaim,
    RunFolderLock,
    check_logdir,
    check_unfinished,
    claim_run_folder,
    run_logdir,
)
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.memory import check_collection_fits
from rlstruct.algos._train.presets import apply_preset
from rlstruct.algos._train.registry import Algorithm, check_resume_source
from rlstruct.algos._train.run_folder import learning_curve_wanted
from rlstruct.algos._train.seeds import AGENT_SEEDS, ENV_SEEDS, evaluation_seeds, role_seed
from rlstruct.algos._train.stop_rule import StopRule
from rlstruct.algos._train.video import check_videos
from rlstruct.batchers import RL_Batcher
from rlstruct.batchers._parent import check_start_method
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import ConfigError, DeviceMismatchError
from rlstruct.structures import DictTensor, Trajectories

__all__ = [
    "Setup",
    "check_on_device",
    "open_batchers",
    "open_evaluator",
    "validate",
    "seeded_model",
    "training_run",
    "warn_stalling_evaluations",
    "worker_args",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Setup:
    """A run's checked settings and what checking them found, handed to the loop.

    Attributes:
        algorithm: the algorithm.
        config: its checked config, with its preset applied (every setting resolved, ``preset`` naming the one used).
        spec: the env's description (from one CPU env).
        resume: the checkpoint the run continues, read and checked (``None``: a fresh run).
        learner_device: ``config.learner_device``, resolved.
        start: ``time.perf_counter()`` when the run was launched (the checks, and for ``rlstruct train`` the imports,
            count in its wall time).
        world: this process's rank in a data-parallel run (``torchrun``), or a world of one.
        on_evaluation: listeners of the run's evaluation event (:attr:`~.log.Run.evaluated`), each called with
            each evaluation whose result arrives during training (:class:`~.events.Evaluated`); ``rlstruct sweep``
            prunes a trial from there.
        claim: the log folder this start claimed and what claiming it created (``None``: a resumed run continuing
            in its own folder, a rank that does not log, a ``torchrun`` restart), given back by
            :func:`~.folder_claim.given_back_unless_trained` when the run raises before its first training iteration.
        lock: the log folder's lock, taken by :func:`validate` for the process that writes the folder (``None``: a
            rank that does not log, a filesystem without locks) and released when :func:`~.loops.run` ends.
    """

    algorithm: Algorithm
    config: RunConfig
    spec: EnvSpec
    resume: Resume | None
    learner_device: torch.device
    start: float
    world: World = World()
    on_evaluation: tuple[Callable[[Evaluated], None], ...] = ()
    claim: FolderClaim | None = None
    lock: RunFolderLock | None = None


def check_evaluation_envs(config: RunConfig, spec: EnvSpec) -> None:
    """Builds one evaluation env of a run whose ``evaluation_env_kwargs`` are given: its constructor must take them,
    and the policy trained on the training envs' spaces (``spec``) must fit its spaces.

    Raises:
        ValueError: the constructor refuses an argument of ``evaluation_env_kwargs``.
        ConfigError: the evaluation env's observations or actions differ from the training envs'.
    """
    kwargs = evaluation_env_kwargs(config.env, config.backend, config.env_kwargs, config.evaluation_env_kwargs)
    evaluated = describe_env(config.env, config.backend, config.max_episode_steps, kwargs,
                             argument="evaluation_env_kwargs")
    # The time limit and the solved return may differ: the evaluation runs to the training envs' limit.
    same = dataclasses.replace(evaluated, max_episode_steps=spec.max_episode_steps,
                               reward_threshold=spec.reward_threshold)
    if same != spec:
        raise ConfigError(f"evaluation_env_kwargs must leave the env's spaces as training has them, got "
                          f"{config.evaluation_env_kwargs!r}, which gives {evaluated} against {spec}; drop the "
                          "arguments that change the observations or the actions")


def warn_stalling_evaluations(config: RunConfig, spec: EnvSpec) -> None:
    """Warns when a run evaluates the greedy policy on whole Atari games: a greedy policy that never presses FIRE
    after a lost life (an untrained one, in Breakout) plays until ALE's cap, and each evaluation then takes minutes,
    blocking training. The Atari presets (``ppo-atari``, ``dqn-atari``) sample the policy instead."""
    if config.env.startswith("ALE/") and config.evaluation_policy == "greedy" and config.evaluation_max_steps is None:
        log.warning("%s: the evaluations play the greedy policy for up to %d steps a game, and one that never presses "
                    "FIRE plays until that cap (minutes per evaluation); pass --evaluation-policy sample (Atari's "
                    "protocol) or --evaluation-max-steps N", config.env, spec.max_episode_steps)


def validate(algorithm: Algorithm, config: RunConfig, *, given: frozenset[str] | None = None,
            checkpoint: dict[str, Any] | None = None, start: float | None = None) -> Setup:
    """Applies the preset of ``config`` (:func:`~.presets.apply_preset`: its settings fill the fields
    not given) and checks the result for ``algorithm`` before anything is built: the shared settings, the
    algorithm's own, the env's spaces, and the checkpoint of ``config.resume``.

    Args:
        algorithm: the algorithm.
        config: its config.
        given: the fields the caller gave, which a preset leaves alone (None: those that differ from the config
            class's defaults).
        checkpoint: the content of ``config.resume`` when the caller has read it already (the command line reads
            it for the flags' defaults), so that it is read once.
        start: ``time.perf_counter()`` at the run's launch (default: now); ``rlstruct train`` passes its process's
            start (:func:`~rlstruct.algos._train.flags.launched_at`), so that the wall time counts the imports.

    Raises:
        DeviceUnavailableError: a device of the config does not exist here.
        SpaceError: the algorithm cannot run on the env's spaces.
        ValueError: a setting is out of range.
        CheckpointError: ``resume`` is missing, unreadable, or not an rlstruct checkpoint.
        RunFinishedError: ``resume`` is a finished run that these settings give nothing more to do
            (:func:`~.folder_claim.check_unfinished`).
        ConfigError: an unknown ``preset`` or one of another algorithm or env, settings that cannot work together, a
            ``resume`` trained by another number of data-parallel ranks, a
            ``resume`` this config cannot continue (see
            :func:`~rlstruct.algos._train.checkpoints.load_resume`), a log folder that cannot be created or written,
            or, in a ``torchrun`` launch, one that holds a run already (:func:`~.folder_claim.claim_logdir`).
        RunFolderBusyError: another process writes the log folder (:class:`~.folder_claim.RunFolderLock`).
    """
    start = time.perf_counter() if start is None else start
    if config.resume is not None:  # the run's own algorithm and env first: the new env's preset would be blamed
        checkpoint = load_checkpoint(config.resume, argument="resume") if checkpoint is None else checkpoint
        check_resume_algorithm(algorithm.name, config.resume, checkpoint)
        check_resume_source(algorithm, config.resume, checkpoint)
        check_resume_env(config.env, config.resume, checkpoint)
    config, _ = apply_preset(algorithm.name, config, given)
    validate_run_config(config)
    if config.n_processes or config.n_evaluation_processes:
        check_start_method()  # a worker would meet it after the run folder and the learner are made
    if isinstance(config, AutocastPart):
        check_autocast(config, algorithm.title)
    if config.deterministic:
        check_cublas_workspace(algorithm.title)
    check_compile_cache()
    learning_curve_wanted()  # read again at the run's end, where a bad value would cost the run's files
    jax_compile_cache()  # before describe_env, which compiles a JAX env's first programs
    algorithm.check_family(config)
    check_videos(config)
    algorithm.check_config(config)
    spec = describe_env(config.env, config.backend, config.max_episode_steps, config.env_kwargs)
    algorithm.check_env(config, spec)
    check_collection_fits(config, spec)
    warn_stalling_evaluations(config, spec)
    if config.evaluation_env_kwargs is not None:
        check_evaluation_envs(config, spec)
    world = world_from_environment()
    # A run resumed in its own folder takes the folder's lock before it reads the checkpoint, and reads it again when
    # the caller's copy may be older than the file (a run that wrote it and ended since this process started).
    lock = None
    in_place = _resumed_in_place(config)
    if world.is_logger and in_place is not None:
        lock = RunFolderLock.acquire(in_place)
        if checkpoint is not None and _written_since(Path(config.resume), start):
            checkpoint = None
    try:
        resume = load_resume(algorithm.name, config, checkpoint=checkpoint)
        if world.distributed:  # "cuda" is this rank's GPU (cuda:LOCAL_RANK); counting GPUs initialises no CUDA context
            n_gpus = torch.cuda.device_count()
            devices = {name: rank_device(getattr(config, name), world, n_gpus)
                       for name in ("learner_device", "batcher_device", "evaluation_device")}
            config = dataclasses.replace(config, **devices)
        if resume is not None and resume.world_size != world.size:
            raise ConfigError(f"resume={config.resume!r} was trained by {resume.world_size} data-parallel rank(s), "
                              f"got {world.size} (WORLD_SIZE); resume it with torchrun --nproc-per-node "
                              f"{resume.world_size} (over all nodes), or start a new run without --resume")
        if resume is not None:
            check_unfinished(resume, config, spec)
        # Last: a run that fails a check creates no folder. Rank 0 alone writes the run's files (and holds the
        # folder's lock); a torchrun restart writes into the folder its first attempt claimed.
        logdir, restarts = run_logdir(algorithm.name, config, resume), torchrun_restarts()
        continued = resume is not None and logdir.resolve() == resume.folder.resolve()
        claim = None
        if world.is_logger and not continued and not restarts:
            claim = claim_run_folder(logdir, numbered=restarts is None,
                                     first_iteration=1 if resume is None else resume.iteration + 1)
            config = dataclasses.replace(config, logdir=str(claim.path))
            try:
                lock = RunFolderLock.acquire(claim.path)
            except BaseException:
                claim.release()
                raise
        else:
            check_logdir(logdir)
            if world.is_logger and lock is None:
                lock = RunFolderLock.acquire(logdir)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return Setup(algorithm, config, spec, resume, as_device(config.learner_device), start, world, claim=claim,
                 lock=lock)


def _written_since(resume: Path, start: float) -> bool:
    """Whether the checkpoint of ``resume`` (a file, or a run's folder) was written after ``start`` (a
    ``time.perf_counter()``), or up to 2 s before: the margin covers the clock of a network filesystem's server."""
    path = resume / CHECKPOINT_NAME if resume.is_dir() else resume
    started = time.time() - (time.perf_counter() - start)
    try:
        return path.stat().st_mtime > started - 2.0
    except OSError:  # gone: the read that follows says so
        return True


def _resumed_in_place(config: RunConfig) -> Path | None:
    """The folder of ``config.resume``'s checkpoint when the run continues in it (no other ``logdir``), else
    ``None`` (a fresh run, a run resumed into a new folder, or a ``resume`` that names nothing: its check says so)."""
    if config.resume is None:
        return None
    path = Path(config.resume)
    folder = path if path.is_dir() else path.parent
    if not folder.is_dir() or (config.logdir is not None and Path(config.logdir).resolve() != folder.resolve()):
        return None
    return folder


def check_on_device(structure: Trajectories | nn.Module, device: DeviceLike, what: str) -> None:
    """Raises :class:`DeviceMismatchError` when a tensor of ``structure`` is not on ``device``.

    Used by the learners with ``check_devices=True`` for what :class:`RL_Agent_CheckDevice` does not see
    (the model's parameters, a replay buffer's input).
    """
    d = as_device(device)
    if isinstance(structure, nn.Module):
        items = list(structure.named_parameters()) + list(structure.named_buffers())
    else:
        items = [*structure.info.items(), *structure.trajectories.items(), ("lengths", structure.trajectories.lengths)]
    for k, v in items:
        if v.device != d:
            raise DeviceMismatchError(
                f"{what} must be on {d}, got {v.device} (key {k!r}); move it with .to({str(d)!r})"
            )


@contextlib.contextmanager
def training_run(
    algo: str, config: RunConfig, spec: EnvSpec, *, start: float, resume: Resume | None = None, logger: bool = True,
    world_size: int = 1, on_evaluation: Sequence[Callable[[Evaluated], None]] = (), source: str | None = None,
) -> Iterator[tuple[Run, contextlib.ExitStack]]:
    """The frame of every ``train``: a :class:`Run`, and an exit stack that closes what the run opens.

    Sets ``torch`` to ``config.torch_threads`` threads (when set), to ``config.matmul_precision`` and, with
    ``config.deterministic``, to deterministic mode (:func:`~rlstruct._determinism.deterministic_mode`, inherited by
    the worker processes the run starts) and ``torch.compile``'s on-disk caches to rlstruct's compile cache
    (:func:`~.compile_cache.compile_cache`) for the run and restores the previous settings on exit; the run and
    everything pushed on the stack are closed on exit, in reverse order, whether training returned or raised.

    In the main thread, a first Ctrl-C (SIGINT) or SIGTERM (what ``timeout``, SLURM and ``docker stop`` send)
    during the run does not raise: it sets the ``signal`` of the run's :class:`~.stop_rule.StopRule`, so that the
    loop (``while not run.should_stop()``) ends after the iteration under way and :func:`finish_training` writes the
    checkpoint, the curve and the summary of what was reached, skipping the final evaluation. A second one raises:
    ``KeyboardInterrupt`` for SIGINT, ``SystemExit(143)`` for SIGTERM; so does one that arrives while the batchers'
    workers start, once they are up (:func:`open_batchers`: nothing is trained yet). The batchers' worker processes
    ignore SIGINT (a terminal sends it to the whole process group): closing them is this process's job, done by
    the stack. The previous handlers are restored on exit.

    An exception of the loop is suppressed when the run turns out to have diverged
    (:attr:`~.stop_rule.StopRule.diverged`, checked as the run closes; e.g. the envs refusing the NaN actions of
    diverged weights): the loop's code after the ``with`` block then ends the run (:func:`finish_diverged`).

    Args:
        algo: the algorithm's name (the run's log folder and checkpoint say it).
        config: the validated config.
        spec: the env's description, from the algorithm's ``validate``.
        start: ``time.perf_counter()`` when ``train`` was called (validation counts in the wall time).
        resume: the checkpoint the run continues, from :func:`~.checkpoints.load_resume` (``None``: a
            fresh run); see :class:`Run`.
        logger: whether this process writes the run's files (see :class:`Run`).
        world_size: the data-parallel ranks of the run.
        on_evaluation: listeners of the run's evaluation event, after its videos (see :class:`Run`).
        source: where the algorithm came from (:func:`~.registry.algorithm_source`; default: ``algo``), recorded
            in ``config.json`` and the checkpoints as ``"algorithm"``.

    Yields:
        ``(run, stack)``.
    """
    precision = torch.get_float32_matmul_precision()
    threads = set_torch_threads(config.torch_threads)
    run = Run(algo, config, spec, start=start, resume=resume, logger=logger, world_size=world_size, source=source,
              on_evaluation=on_evaluation)
    with contextlib.ExitStack() as stack:
        stack.push(explained_by_divergence(run))  # last out: after run.close has checked the last rows
        stack.callback(torch.set_num_threads, threads)
        stack.callback(torch.set_float32_matmul_precision, precision)
        torch.set_float32_matmul_precision(config.matmul_precision)
        if config.deterministic:
            stack.enter_context(deterministic_mode())
        stack.enter_context(compile_cache())
        stack.callback(run.close)
        stack.push(lambda failed, *_: run.trackers.close(failed=failed is not None))
        stack.enter_context(stop_on_signals(run.stop_rule))
        yield run, stack


def stop_at_once(signal_name: str) -> NoReturn:
    """Stops a run now for the signal ``signal_name`` (``"SIGINT"``, ``"SIGTERM"``), unwinding its frame: a second
    signal, or one whose run has nothing to record yet. ``KeyboardInterrupt`` for SIGINT, ``SystemExit(128 + n)``
    for another (143 for SIGTERM), what the signal's default action would give."""
    signum = signal.Signals[signal_name]
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def stop_on_signals(*rules: StopRule) -> Iterator[None]:
    """Within the block, in the main thread, a first SIGINT or SIGTERM sets the ``signal`` of every rule (each run
    of a population ends after the iteration under way), a second one stops at once (:func:`stop_at_once`); the
    previous handlers are restored on exit."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return

    def on_signal(signum: int, frame: Any) -> None:
        if any(rule.interrupted for rule in rules):
            stop_at_once(signal.Signals(signum).name)
        for rule in rules:
            rule.signal = signal.Signals(signum).name

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def seeded_model(seed: int, factory: Callable[..., nn.Module], *args: Any) -> nn.Module:
    """``factory(*args)`` with its initial weights drawn from ``torch.manual_seed(seed)``.

    The global generator is forked, so building the model leaves it as it was.

    >>> a, b = seeded_model(0, nn.Linear, 2, 1), seeded_model(0, nn.Linear, 2, 1)
    >>> torch.equal(a.weight, b.weight)
    True
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(*args)


def worker_args(config: RunConfig, spec: EnvSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments every batcher's agent and env factories share: ``(agent_args, env_args)``, the
    env's those of the training envs (the evaluation's replace ``env_kwargs`` by :func:`evaluation_env_kwargs`).

    Each batcher adds its own ``device``, ``n_envs`` and ``autoreset``.
    """
    agent_args = {"spec": spec, "hidden_sizes": tuple(config.hidden_sizes), "check_device": config.check_devices}
    if config.network is not None:
        agent_args["network"] = config.network
    env_args = {"name": config.env, "backend": config.backend, "max_episode_steps": spec.max_episode_steps,
                "physics_dtype": config.physics_dtype, "env_kwargs": config.env_kwargs}
    return agent_args, env_args


def open_batchers(
    stack: contextlib.ExitStack,
    config: RunConfig,
    spec: EnvSpec,
    create_agent: Callable[..., RL_Agent],
    *,
    n_timesteps: int,
    autoreset: bool,
    explore: dict[str, bool | float],
    evaluate: dict[str, bool | float],
    cuda_graph: bool = False,
    zero_copy: bool = False,
    agent_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    seed: int | None = None,
    run: Run | None = None,
    rank: int = 0,
    sync_timings: bool = False,
) -> tuple[RL_Batcher, Evaluator]:
    """The training batcher and the :class:`Evaluator` of a run, both closed by ``stack``.

    Seeds are fixed per role (envs from offsets 0 and 1000, agents from 5000 and 6000) so that a run is
    reproducible from ``seed`` (``config.seed``, or the session's seed of a resumed run) alone. The training batcher
    has one env seed and one agent seed: its ``config.n_envs`` envs are split evenly over its workers (and Ray
    actors), env ``i`` seeded by its global index ``rank * n_envs + i`` and the agent's draws for it keyed by
    ``(seed, i, step)``, so that the run is the same whatever the number of processes collecting. The evaluator is
    :func:`open_evaluator`'s.

    Args:
        stack: the run's exit stack (see :func:`training_run`).
        config: the validated config.
        spec: the env's description.
        create_agent: the batchers' agent factory (module level, so it pickles), e.g. :func:`create_policy_agent`.
        n_timesteps: steps of every training env per ``execute``.
        autoreset: whether the training envs auto-reset.
        explore: the training ``agent_info``, one value per key, e.g. ``{"stochastic": True}``.
        evaluate: the evaluation ``agent_info``, one value per key (:func:`evaluation_info`).
        cuda_graph: the training batcher's ``cuda_graph`` (see :class:`RL_Batcher`), and the evaluation batcher's
            where it runs on a GPU.
        zero_copy: the training batcher's ``zero_copy`` (its double buffer, to overlap collection and learning).
        agent_kwargs: more keyword arguments of ``create_agent`` for the training batcher's agent only (e.g. its
            ``autocast``); the evaluation's agent gets the shared ones.
        model_kwargs: more keyword arguments of ``create_agent`` for both batchers' agents: what their network is
            built with (e.g. ``normalize_observations``).
        seed: the seed of the envs and agents (``None``: ``config.seed``); pass ``run.seed``.
        run: the run whose ``progress.csv`` gets the batchers' restart count (``batcher/restarts``) when
            ``config.restart_workers`` allows restarts.
        rank: this process's rank in a data-parallel run: its training envs are the ``rank``-th group of
            ``config.n_envs`` in the run's numbering.
        sync_timings: the training batcher's ``sync_timings`` (a profiled run's, so that a GPU's phases are exact).

    Returns:
        ``(batcher, evaluator)``.

    Raises:
        KeyboardInterrupt: a SIGINT reached ``run`` while the workers started (``SystemExit(143)`` for a SIGTERM):
            see :func:`stop_at_once`.
    """
    agent_args, env_args = worker_args(config, spec)
    agent_args.update(model_kwargs or {})
    seed = config.seed if seed is None else seed
    per_worker = config.n_envs // training_workers(config)
    train_args = (
        n_timesteps, create_agent, {**agent_args, **(agent_kwargs or {}), "device": config.batcher_device},
        create_env, {**env_args, "n_envs": per_worker, "autoreset": autoreset, "device": config.batcher_device},
        config.n_processes, role_seed(seed, ENV_SEEDS),
    )
    train_kwargs = {"agent_info": agent_info_row(explore), "agent_seeds": role_seed(seed, AGENT_SEEDS),
                    "device": config.batcher_device, "cuda_graph": cuda_graph, "timeout": config.batcher_timeout,
                    "start_timeout": config.start_timeout, "restart_workers": config.restart_workers,
                    "env_index": rank * config.n_envs}
    if config.ray_actors:  # actor k hosts workers k * n_processes...: the rows of one process's workers, in order
        from rlstruct.batchers import RayBatcher

        stack.enter_context(ray_session(config.ray_address))
        # An actor's process is Ray's, not a child of this one: it gets deterministic mode from its runtime_env.
        runtime_env = {"env_vars": worker_environment()} if config.deterministic else None
        batcher = RayBatcher(*train_args, **train_kwargs, n_actors=config.ray_actors, runtime_env=runtime_env)
    else:
        batcher = RL_Batcher(*train_args, **train_kwargs, zero_copy=zero_copy, sync_timings=sync_timings)
    stack.callback(batcher.close)
    evaluator = open_evaluator(stack, config, spec, create_agent, evaluate=evaluate, cuda_graph=cuda_graph,
                               model_kwargs=model_kwargs, seed=seed)
    if config.restart_workers and run is not None:
        run.columns["batcher/restarts"] = lambda: batcher.n_restarts + evaluator.batcher.n_restarts
    if run is not None and run.stop_rule.signal is not None:
        # A signal held while the workers started (a worker cannot start with it) stops the run now, as one before
        # the start does: this session has trained nothing, so the start gives back the folder it claimed (a resumed
        # run keeps its checkpoint).
        stop_at_once(run.stop_rule.signal)
    return batcher, evaluator



def open_evaluator(
    stack: contextlib.ExitStack,
    config: RunConfig,
    spec: EnvSpec,
    create_agent: Callable[..., RL_Agent],
    *,
    evaluate: dict[str, bool | float],
    cuda_graph: bool = False,
    model_kwargs: dict[str, Any] | None = None,
    seed: int | None = None,
) -> Evaluator:
    """The :class:`Evaluator` of a run, closed by ``stack``: its batcher of ``config.n_evaluation_envs`` evaluation
    envs (``evaluation_env_kwargs`` over the training envs' own), each running one whole episode (up to
    ``config.evaluation_max_steps``), ``config.evaluation_chunk_steps`` steps per acquisition, on
    ``config.evaluation_device`` in ``config.n_evaluation_processes`` workers, seeded from ``seed`` as ``rlstruct eval``
    seeds them. :func:`open_batchers` opens one beside the training batcher; a loop that collects otherwise opens its
    own.

    Args:
        stack: the run's exit stack (see :func:`training_run`).
        config: the validated config.
        spec: the env's description.
        create_agent: the agent factory (module level, so it pickles), the one the run's checkpoint evaluates with.
        evaluate: the evaluation ``agent_info``, one value per key (the description's
            :meth:`~.registry.Algorithm.evaluation_agent_info`).
        cuda_graph: with a CUDA ``evaluation_device``, auto-reset envs whose first episodes count, each chunk replayed
            as one CUDA graph.
        model_kwargs: more keyword arguments of ``create_agent``: what its network is built with.
        seed: the seed of the envs and the agent (``None``: ``config.seed``); pass ``run.seed``.
    """
    agent_args, env_args = worker_args(config, spec)
    agent_args.update(model_kwargs or {})
    seed = config.seed if seed is None else seed
    n_eval_workers = max(config.n_evaluation_processes, 1)
    eval_steps = spec.max_episode_steps
    if config.evaluation_max_steps is not None:
        eval_steps = min(eval_steps, config.evaluation_max_steps)
    chunk = min(eval_steps, config.evaluation_chunk_steps)
    # On a GPU, an episodic evaluation is hundreds of eager steps, each many small launches and a host sync (the
    # running set): with cuda_graph, the evaluation envs auto-reset and each chunk is one graph replay; the
    # Evaluator counts every env's first episode, the one the episodic envs would have run.
    eval_graph = cuda_graph and accelerator_for(config.evaluation_device) is not None
    eval_env_kwargs = evaluation_env_kwargs(config.env, config.backend, config.env_kwargs,
                                            config.evaluation_env_kwargs)
    eval_env_seeds, eval_agent_seeds = evaluation_seeds(seed, n_eval_workers)
    eval_batcher = RL_Batcher(
        chunk, create_agent, {**agent_args, "device": config.evaluation_device},
        create_env, {**env_args, "n_envs": config.n_evaluation_envs, "autoreset": eval_graph,
                     "device": config.evaluation_device, "env_kwargs": eval_env_kwargs},
        config.n_evaluation_processes, eval_env_seeds, agent_info=agent_info_row(evaluate),
        agent_seeds=eval_agent_seeds, device=config.evaluation_device,
        cuda_graph=eval_graph, timeout=config.batcher_timeout, start_timeout=config.start_timeout,
        restart_workers=config.restart_workers,
    )
    n_eval = eval_batcher.n_elems()
    evaluator = Evaluator(eval_batcher, DictTensor({k: torch.full((n_eval,), v) for k, v in evaluate.items()}),
                          config.eval_every, max_steps=eval_steps, final_episodes=config.final_evaluation_episodes)
    stack.callback(evaluator.close)
    return evaluator

@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray for the training batcher's actors: the running session if this process has one, else a connection to
    ``address`` (``"auto"``, ``"ray://HOST:PORT"``), else a local cluster on the loopback interface; a session it
    started is shut down on exit."""
    # Read once when Ray is imported: unset, a local cluster listens on every network interface.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        yield
        return
    if address is None:
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
