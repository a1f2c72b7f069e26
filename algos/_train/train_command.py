"""The body of ``rlstruct train ALGO`` (and ``python -m rlstruct.algos.ALGO``): parse the flags, check the run once,
train, report."""

from __future__ import annotations

import dataclasses
import errno
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rlstruct._determinism import set_workspace_at_start
from rlstruct.algos._train.checkpoints import check_resume_algorithm, load_checkpoint
from rlstruct.algos._train.config import RunConfig
from rlstruct.algos._train.distributed import restart_resume
from rlstruct.algos._train.flags import build_parser, config_from_args, given_flags, resumed_defaults, show_config
from rlstruct.algos._train.folder_claim import folder_moved, given_back_unless_trained, run_logdir
from rlstruct.algos._train.loops import run
from rlstruct.algos._train.population_loop import member_folder, population_seeds, train_population
from rlstruct.algos._train.presets import apply_preset, describe_preset, setting_sources
from rlstruct.algos._train.registry import Algorithm, check_resume_source, check_run_code
from rlstruct.algos._train.registry import algorithm as registered
from rlstruct.algos._train.result import TrainResult, stopped_early
from rlstruct.algos._train.run_folder import CSV_NAME, SUMMARY_NAME
from rlstruct.algos._train.session import Setup, validate
from rlstruct.errors import (
    BatcherWorkerError,
    ConfigError,
    RankLostError,
    RLStructError,
    RunFinishedError,
    RunRecordError,
)

__all__ = ["TRUST_CODE_HELP", "configure_logging", "launched_at", "main", "result_line", "stop_line"]

#: the help of ``--trust-code``, on every command that opens a saved run
TRUST_CODE_HELP = "import the run's code (algorithm, network, env) even where no installed package holds it"


def launched_at() -> float:
    """``time.perf_counter()``'s value at this process's start (Linux: from ``/proc``; elsewhere, now), so that a
    command's wall time counts its interpreter start and imports.

    >>> 0 <= time.perf_counter() - launched_at() < 3600
    True
    """
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: the start, in ticks after boot
    except (OSError, ValueError, IndexError):
        return now
    return now - min(max(age, 0.0), 3600.0)


#: the errors of a write that the disk under the run folder refuses: full (or over quota), read-only, not permitted
_FULL, _READ_ONLY = (errno.ENOSPC, errno.EDQUOT), (errno.EROFS, errno.EACCES, errno.EPERM)


def _storage_failure(error: OSError | RuntimeError, logdir: str | os.PathLike, prog: str, *,
                     moved: bool) -> str | None:
    """The line that ``rlstruct train`` ends with when a write of the run fails for its disk: full, read-only, or
    its folder deleted or moved during the run (``moved``: :func:`_folder_moved`); ``None`` for another error (a bug's
    traceback says more).

    >>> _storage_failure(OSError(errno.ENOSPC, "No space left on device", "runs/x/progress.csv"), "runs/x", "train",
    ...                  moved=False)
    "cannot write 'runs/x/progress.csv': No space left on device (ENOSPC); free space on its disk, then train \
--resume runs/x continues the run from its last checkpoint"
    """
    filename, code = getattr(error, "filename", None), getattr(error, "errno", None)
    file = repr(str(filename)) if filename else f"into the run folder {str(logdir)!r}"
    resume = f"{prog} --resume {logdir} continues the run from its last checkpoint"
    if moved:
        return (f"cannot write {file}: the run folder {str(logdir)!r} was deleted or moved during the run; move it "
                f"back and {resume}, or start a new run")
    if not isinstance(error, OSError):
        return None
    reason = f"{error.strerror or type(error).__name__} ({errno.errorcode.get(code or 0, code)})"
    if code in _FULL:
        return f"cannot write {file}: {reason}; free space on its disk, then {resume}"
    if code in _READ_ONLY:
        return f"cannot write {file}: {reason}; the run folder became read-only: make it writable, then {resume}"
    return None


def _folder_moved(setup: Setup) -> bool:
    """Whether the run folder of ``setup`` was deleted or moved by another hand during the run: it is gone or is
    another folder than the one the run claimed or locked (:func:`~.folder_claim.folder_moved`); not when the run's
    own failed start gave it back (:meth:`~.folder_claim.FolderClaim.release`), whose error is the one to report."""
    claim, lock = setup.claim, setup.lock
    if claim is not None and claim.released:
        return False
    identity = (lock.folder_identity if lock is not None else claim.identity if claim is not None else None)
    return folder_moved(_logdir(setup), identity)


def _logdir(setup: Setup) -> Path:
    """The run folder of ``setup``: its ``logdir``, else (a run resumed in place) its checkpoint's folder."""
    return run_logdir(setup.algorithm.name, setup.config, setup.resume)


def stop_line(result: TrainResult, config: RunConfig) -> str:
    """The line of ``rlstruct train`` that says why ``result``'s run stopped (its ``stop_reason``).

    >>> from rlstruct.algos.a2c import A2CConfig
    >>> result = TrainResult(eval_return=9.0, env_steps=24_576, wall_time_s=2.1, history=[], logdir="runs/x",
    ...                      stop_reason="time_limit")
    >>> stop_line(result, A2CConfig(time_limit=2, max_env_steps=500_000))
    'stopped at 24,576 of 500,000 env steps: time limit of 2 s reached; not a result that rlstruct compare counts'
    """
    steps = f"{result.env_steps:,}"
    of_budget = f"{steps} of {config.max_env_steps:,}" if config.max_env_steps is not None else steps
    reason = result.stop_reason
    early = stopped_early(reason, result.env_steps, config.max_env_steps)
    verdict = "; not a result that rlstruct compare counts" if early else ""
    if reason == "diverged" and result.diverged is not None:
        found = result.diverged
        return (f"stopped: the run diverged, {found['quantity']} was {found['value']} at iteration "
                f"{found['iteration']} ({steps} env steps taken); no evaluation of it counts")
    if reason == "target":
        return (f"stopped: the weights taken at {result.eval_env_steps:,} env steps reached the target return "
                f"{result.target_return:g} in an evaluation and in its confirmation on {config.n_evaluation_envs} "
                f"fresh episodes; kept those weights ({steps} env steps trained)")
    if reason == "budget":
        return f"stopped: the budget of {config.max_env_steps:,} env steps was spent ({steps} taken)"
    head = f"stopped at {of_budget} env steps"
    if reason == "time_limit":
        return f"{head}: time limit of {config.time_limit:g} s reached{verdict}"
    if reason == "signal":
        return f"{head}: {result.stop_signal} received{verdict}"
    if reason == "worker_failed" and result.worker_failure is not None:
        return (f"{head}: batcher worker {result.worker_failure['worker_id']} failed with no restart left"
                f"{verdict}")
    return f"{head}: another rank of the run stopped it{verdict}"


def _finished_summary(resume: str) -> str | None:
    """The ``summary.json`` of the run at ``resume`` (a checkpoint or its folder) on one line, or ``None`` when it has
    none that reads as JSON."""
    folder = Path(resume) if Path(resume).is_dir() else Path(resume).parent
    try:
        return json.dumps(json.loads((folder / SUMMARY_NAME).read_text()))
    except (OSError, ValueError):
        return None


def result_line(result: TrainResult) -> str:
    """The line of ``rlstruct train`` that gives the return it reports, which weights it is about, and where it
    stands against the run's target.

    >>> done = TrainResult(eval_return=480.5, env_steps=300_000, wall_time_s=61.0, history=[], logdir="runs/x",
    ...                    target_return=475.0, stop_reason="target", eval_env_steps=294_912)
    >>> result_line(done).split(" after ")[0]
    'evaluation return 480.50 (the confirmation of the weights taken at 294,912 env steps)'
    >>> result_line(done).split(": ")[1]
    'at or above the target 475'
    >>> print(result_line(TrainResult(eval_return=435.06, env_steps=500_000, wall_time_s=90.0, history=[],
    ...                               logdir="runs/x", target_return=475.0)))
    final evaluation return 435.06 after 500,000 env steps in 90.0 s: below the target 475
    """
    if result.stop_reason == "target":
        head = (f"evaluation return {result.eval_return:.2f} (the confirmation of the weights taken at "
                f"{result.eval_env_steps:,} env steps)")
    else:
        head = f"final evaluation return {result.eval_return:.2f}"
    line = f"{head} after {result.env_steps:,} env steps in {result.wall_time_s:.1f} s"
    if result.target_return is not None:
        line += f": {'at or above' if result.reached_target else 'below'} the target {result.target_return:g}"
    if result.preset_target is not None and result.preset_target != result.target_return:
        line += f" (preset {result.preset}'s target: {result.preset_target:g})"
    return line


class _PublicNames(logging.Formatter):
    """Names a record by the public part of its logger's name: a warning of the harness's
    ``rlstruct.algos._train.trackers`` reads ``rlstruct.algos``, the package a user imports."""

    def format(self, record: logging.LogRecord) -> str:
        parts = record.name.split(".")
        public = ".".join(parts[:next((i for i, part in enumerate(parts) if part.startswith("_")), len(parts))])
        return super().format(logging.makeLogRecord({**record.__dict__, "name": public or record.name}))


def configure_logging() -> None:
    """Sends warnings of every ``rlstruct`` logger to stderr: the command line's choice, never a library's."""
    handler = logging.StreamHandler()
    handler.setFormatter(_PublicNames("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def _train_population(algorithm: Algorithm, config: RunConfig, given: frozenset[str], launched: float,
                      prog: str) -> int:
    """``rlstruct train ALGO --seeds ...``: the population of ``config.seeds`` in this process
    (:func:`~.population_loop.train_population`), a stop line per member and, last on stdout, a JSON object with the
    members' summaries. The status is the worst member's: 1 when one diverged or a worker failed, 128 + the signal's
    number when a signal stopped them, else 0; a config error is one line and 2, as for one seed."""
    try:
        results = train_population(algorithm, config, given=given, start=launched)
    except RunFinishedError as e:  # nothing to do, as for a finished run of one seed
        print(f"{prog}: {e}", file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted: stopped without writing a checkpoint", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RLStructError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    gc.freeze()
    resolved, _ = apply_preset(algorithm.name, config, given)  # the members' settings, their preset's included
    status = 0
    for result in results:
        print(f"{Path(result.logdir).name}: {stop_line(result, resolved)}")
        if result.stop_reason in ("diverged", "worker_failed"):
            status = max(status, 1)
        elif result.interrupted:
            status = max(status, 128 + signal.Signals[result.stop_signal or "SIGINT"])
    root = Path(results[0].logdir).parent
    print(f"population of {len(results)} seeds: {root} (rlstruct compare {root})")
    print(json.dumps({"population": str(root), "members": [r.summary() for r in results]}))
    return status


def main(algorithm: Algorithm | str, argv: Sequence[str] | None = None) -> int:
    """``rlstruct train NAME [flags]`` of ``algorithm`` (its description, or its name in the registry: what an
    algorithm module run as ``__main__`` passes, the registry's module being the one its workers import): parse,
    check once (:func:`~.session.validate`), train (:func:`~.loops.run`), report.

    With ``--resume RUN``, the flags not given take the values of that run's config (:func:`resumed_defaults`);
    the checkpoint is read once, for those defaults and for the run. A config error (an unknown env, a device this
    machine does not have, a value out of range, a ``--resume`` checkpoint that is missing or that the settings
    cannot continue) prints one line to stderr and returns 2. ``--resume`` of a run that finished, with settings that
    give it nothing more to do (:class:`~rlstruct.errors.RunFinishedError`), changes nothing: one line to stderr, its
    ``summary.json`` as the last stdout line, status 0. A line says why training stopped (:func:`stop_line`);
    the last line on stdout is a JSON object with ``eval_return``, ``env_steps``, ``wall_time_s``, ``logdir`` and
    ``stop_reason`` (also written to ``summary.json`` in the log folder).

    Ctrl-C (SIGINT) stops training after the iteration under way (see
    :func:`~rlstruct.algos._train.session.training_run`): the checkpoint, the learning curve and the summary (with
    ``"interrupted": true``) are written, one line goes to stderr, and the status is 130 (128 + SIGINT, as
    for any command a terminal interrupts). A second Ctrl-C, or one before training starts, stops at once,
    also with status 130 and one line. SIGTERM (``timeout``, SLURM, ``docker stop``) does the same, with
    status 143 (128 + SIGTERM). In a data-parallel run (``torchrun``), a rank whose peer died or stopped answering
    prints one line (:class:`~rlstruct.errors.RankLostError`) and returns 1. A run that diverged (a loss, a gradient
    norm or a weight turned NaN or infinite: ``stop_reason`` ``"diverged"``) prints its stop line and the summary,
    without a final evaluation, and returns 1. A batcher worker that fails with no restart left (``--restart-workers``)
    ends the run as a signal does (its checkpoint and summary, ``stop_reason`` ``"worker_failed"``, with the
    traceback the worker sent): one line to stderr, status 1; ``--resume`` continues it.
    """
    if "--deterministic" in (sys.argv[1:] if argv is None else argv):
        set_workspace_at_start()  # cuBLAS reads it when the CUDA context is made: before anything can make one
    if isinstance(algorithm, str):
        algorithm = registered(algorithm)
    # The process's start when this command is the process's own command line (the console script, python -m), so
    # that the wall clock counts the imports; called from Python (a test, a notebook), the call is the launch.
    own = list(argv or []) == sys.argv[len(sys.argv) - len(argv):] if argv else argv is None or sys.argv[-1:] == [
        algorithm.name]
    launched = launched_at() if own else time.perf_counter()
    prog = f"rlstruct train {algorithm.name}"
    config_cls = algorithm.config_cls
    parser = build_parser(config_cls, prog, algorithm.description,
                          algorithm_group=f"{algorithm.title}'s own settings")
    parser.add_argument("--show-config", action="store_true",
                        help="print every setting this run would use and where it came from (flag, resumed run, "
                             "preset, default), then exit")
    parser.add_argument("--trust-code", action="store_true",
                        help="with --resume: import the run's network or env even where no installed package holds it")
    ns = parser.parse_args(argv)
    restarted = restart_resume(ns.resume, ns.logdir)
    if restarted is not None:  # torchrun restarted the group: continue the run from its last checkpoint
        argv = [*(sys.argv[1:] if argv is None else argv), "--resume", restarted]
        ns = parser.parse_args(argv)
        if os.environ.get("RANK", "0") == "0":
            print(f"{prog}: torchrun restarted the ranks (restart {os.environ['TORCHELASTIC_RESTART_COUNT']}): "
                  f"resuming {restarted}", file=sys.stderr)
    given = given_flags(parser, argv) - {"show_config", "trust_code"}
    configure_logging()  # before the checks: the numbered folder a used --logdir gives is announced by a warning
    try:
        checkpoint, resumed = None, frozenset()
        # A population's folder (or, with --seeds, the folder of the members named): the members' settings are the
        # first member's.
        population = None if ns.resume is None else ns.seeds or population_seeds(ns.resume)
        if population is not None:
            root, ns.resume = ns.resume, str(member_folder(ns.resume, population[0]))
        if ns.resume is not None:
            checkpoint = load_checkpoint(ns.resume, argument="resume")
            check_resume_algorithm(algorithm.name, ns.resume, checkpoint)
            check_resume_source(algorithm, ns.resume, checkpoint)
            # The command names the algorithm; a network or env not given here is the run's own, as its code.
            check_run_code(checkpoint, ns.resume, trust_code=ns.trust_code,
                           fields=[field for field in ("network", "env") if field not in given])
            defaults = resumed_defaults(config_cls, checkpoint)
            parser.set_defaults(**defaults)
            ns = parser.parse_args(argv)
            resumed = frozenset(defaults) - given
        config = config_from_args(config_cls, ns, given | resumed)
        if population is not None:
            config = dataclasses.replace(config, seeds=population, resume=root,
                                         logdir=root if config.logdir is None else config.logdir)
        if config.seeds is not None and not ns.show_config:
            return _train_population(algorithm, config, given | resumed, launched, prog)
        if ns.show_config:
            resolved, preset = apply_preset(algorithm.name, config, given | resumed)
            sources = setting_sources(resolved, preset, given, "flag")
            sources.update(dict.fromkeys(resumed, "resumed run"))
            if "preset" not in given | resumed:
                sources["preset"] = f"default ({config.preset})"
            print(f"# {prog} --env {resolved.env}: {describe_preset(preset)}")
            print(show_config(resolved, sources))
            return 0
        setup = validate(algorithm, config, given=given | resumed, start=launched,
                         checkpoint=checkpoint if ns.resume == config.resume else None)
    except RunFinishedError as e:  # nothing to do: a job that resumes its run until done ends as the run did
        print(f"{prog}: {e}", file=sys.stderr)
        summary = _finished_summary(config.resume)
        if summary is not None:
            print(summary)
        return 0
    except (ValueError, TypeError, RLStructError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        with given_back_unless_trained(setup.claim):
            result = run(setup)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted: stopped without writing a checkpoint", file=sys.stderr)
        return 130
    except (ConfigError, RunRecordError) as e:  # found as the run is built: tensors that do not fit, a bad CSV
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except RankLostError as e:  # a data-parallel run lost a rank: the others end, each with one line
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as e:  # the run folder's disk full, read-only, or the folder deleted under the run
        line = _storage_failure(e, _logdir(setup), prog, moved=_folder_moved(setup))
        if line is None and isinstance(e, BatcherWorkerError):
            # a worker that failed to start (its env or agent raised, it hung): its first line names the worker and
            # the error, which is what a traceback here would say
            line = str(e).splitlines()[0]
        if line is None:
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        return 1
    # The command ends here. Once torch._dynamo is imported, the interpreter's final garbage collections walk
    # thousands of modules after the last line; frozen objects are skipped (reference counting still frees them).
    gc.freeze()
    if not setup.world.is_logger:  # a data-parallel rank other than 0: rank 0 reports the run
        return 128 + signal.Signals[result.stop_signal].value if result.interrupted and result.stop_signal else 0
    if result.stop_reason == "worker_failed" and result.worker_failure is not None:  # the learner was intact
        kept = " (with the worker's traceback)" if result.worker_failure.get("traceback") else ""
        print(f"{prog}: error: {result.worker_failure['error']}; the run stopped and wrote {result.checkpoint} and "
              f"its summary{kept}: continue it with --resume {result.logdir} (--restart-workers N replaces a failed "
              "worker)", file=sys.stderr)
        print(stop_line(result, setup.config))
        print(json.dumps(result.summary()))
        return 1
    if result.stop_reason == "diverged":  # the library's warning said what diverged and which checkpoint is kept
        print(stop_line(result, setup.config))
        print(json.dumps(result.summary()))
        return 1
    if result.interrupted:
        print(f"{prog}: interrupted after {result.env_steps} env steps ({result.wall_time_s:.1f} s): wrote "
              f"{result.checkpoint}, the learning curve and {Path(result.logdir) / SUMMARY_NAME}", file=sys.stderr)
        print(stop_line(result, setup.config))
        print(json.dumps(result.summary()))
        return 128 + signal.Signals[result.stop_signal or "SIGINT"]
    print(stop_line(result, setup.config))
    print(result_line(result))
    tensorboard = f" (TensorBoard: tensorboard --logdir {result.logdir})" if setup.config.tensorboard else ""
    print(f"logs: {Path(result.logdir) / CSV_NAME}{tensorboard}")
    if result.plot:
        print(f"learning curve: {result.plot}")
    print(f"checkpoint: {result.checkpoint} (rlstruct eval {result.checkpoint})")
    print(json.dumps(result.summary()))
    return 0
