"""``rlstruct sweep``: an Optuna study of one algorithm's settings on one env (:func:`run_sweep`), in any database
SQLAlchemy reaches (SQLite by default), the preset as its first trial, each trial a run folder of its own, pruned on
its evaluations as they arrive, trials run side by side in worker processes, and a second call adding trials.

Optuna compares trials at the same step; a trial reports each evaluation of trained weights at the tenth of the step
budget in which it was launched (step 0 to 10), so that trials that collect in batches of other sizes meet at the
same steps.

Several processes may share a study: trial N draws its settings from a sampler seeded by ``(seed, N)``, so that they
draw different trials while one sweep stays reproducible; a trial whose process died is failed at the next call.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlstruct._processes import owner_gone, process_identity
from rlstruct._redact import redact_credentials
from rlstruct.algos._train.events import Evaluated
from rlstruct.algos._train.flags import OneLineParser, build_parser, config_from_args, given_flags
from rlstruct.algos._train.folder_claim import check_logdir
from rlstruct.algos._train.loops import run
from rlstruct.algos._train.presets import given_fields
from rlstruct.algos._train.registry import ALGORITHMS, algorithm
from rlstruct.algos._train.search_space import covering, load_space, suggest, trial_params
from rlstruct.algos._train.session import validate
from rlstruct.algos._train.sweep_study import (
    OWNER,
    check_storage,
    creating,
    die_with,
    fail_dead_trials,
    open_storage,
    preset_needs_a_run,
    require_optuna,
    trial_seeded_sampler,
    wait_for_enqueued_taken,
)
from rlstruct.errors import ConfigError, RLStructError

__all__ = ["DEFAULT_STORAGE", "SweepPlan", "pasteable", "run_sweep", "sweep_main"]

#: where a study is kept unless ``--storage`` says otherwise
DEFAULT_STORAGE = "sqlite:///runs/sweeps.db"
#: the fields a trial's settings leave out of the pasted preset: where and how one run is kept, not how it learns
_RUN_LOCAL = ("env", "seed", "logdir", "progress", "tensorboard", "preset", "resume")
#: the tenths of the step budget at which a trial reports its evaluations
_STEPS_PER_BUDGET = 10


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What every trial of a sweep shares (it travels to the worker processes).

    Attributes:
        algo: the algorithm's name.
        env: the env id.
        space: the search space (:mod:`~rlstruct.algos._train.search_space`), widened to hold the preset.
        flags: ``rlstruct train`` flags every trial runs with (e.g. ``--max-env-steps 20000``).
        storage: the study's database URL.
        study_name: the study's name in it.
        logdir: the folder of the trials' run folders (``trial-NUMBER``).
        seed: the trials' ``seed``, and the sampler's.
        pruner: an Optuna pruner.
    """

    algo: str
    env: str
    space: dict[str, dict[str, Any]]
    flags: tuple[str, ...]
    storage: str
    study_name: str
    logdir: str
    seed: int
    pruner: Any

    def base(self) -> tuple[Any, frozenset[str]]:
        """The config every trial starts from (the flags, the env and the seed) and the fields given."""
        description = algorithm(self.algo)
        parser = build_parser(description.config_cls, f"rlstruct sweep {self.algo} --")
        argv = [*self.flags, "--env", self.env, "--seed", str(self.seed)]
        ns = parser.parse_args(argv)
        given = given_flags(parser, argv)
        return config_from_args(description.config_cls, ns, given), given

    def train_settings(self) -> dict[str, Any]:
        """What every trial's run shares, that comparing trials needs the same: the algorithm, the env, the seed
        (every trial's, and the sampler's) and the settings the train flags give (``{"algo": ..., "env": ...,
        "seed": ..., field: value}``)."""
        base, given = self.base()
        config = base.to_dict()
        return {"algo": self.algo, "env": self.env, "seed": self.seed,
                **{k: config[k] for k in sorted(given - {"seed", "env"})}}

    def objective(self, trial: Any) -> float:
        """Trains the trial's settings in ``trial-NUMBER``; returns the final evaluation return (that of the kept
        weights when an evaluation reached the target), reporting the evaluations on the way."""
        optuna = require_optuna()
        description = algorithm(self.algo)
        base, given = self.base()
        params = suggest(trial, self.space)
        config = dataclasses.replace(base, **params, logdir=str(Path(self.logdir) / f"trial-{trial.number}"))
        # Who runs the trial: a later call in this PID namespace fails it at once if that process is gone; elsewhere
        # (another machine, a container beside this one) its heartbeat says it lives.
        trial.set_user_attr(OWNER, process_identity())
        try:
            setup = validate(description, config, given=given | set(params) | {"logdir"})
        except (ValueError, RLStructError) as e:  # a verdict on the settings drawn: not a trial to run again
            trial.set_user_attr("refused", str(e).splitlines()[0])
            raise
        budget = setup.config.max_env_steps
        reported: set[int] = set()

        def report(evaluated: Evaluated) -> None:
            row = evaluated.row
            launched = row["eval/launch_env_steps"]
            if launched <= 0:  # the untrained network's evaluation says nothing about the settings
                return
            step = min(int(_STEPS_PER_BUDGET * launched // budget), _STEPS_PER_BUDGET)
            if step in reported:
                return
            reported.add(step)
            trial.report(row["eval/return"], step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"evaluation return {row['eval/return']:.2f} at {int(launched):,} env steps")

        chosen = given_fields(setup.config) | set(params)
        settings = {k: v for k, v in setup.config.to_dict().items() if k in chosen and k not in _RUN_LOCAL}
        trial.set_user_attr("settings", settings)
        trial.set_user_attr("logdir", setup.config.logdir)
        try:
            result = run(dataclasses.replace(setup, on_evaluation=(report,)))
        except (ValueError, RLStructError) as e:  # what only building the run finds in the settings
            trial.set_user_attr("refused", str(e).splitlines()[0])
            raise
        except SystemExit as e:
            # A SIGTERM that stops the run at once (one while its workers start, or a second one) is SystemExit(143):
            # the trial fails as an interrupted run's does (Optuna fails a trial for a KeyboardInterrupt; a SystemExit
            # would leave it RUNNING, as a killed sweep's worker did when its parent died during a trial's start).
            if e.code == 128 + signal.SIGTERM:
                raise KeyboardInterrupt from None
            raise
        if result.interrupted:
            raise KeyboardInterrupt
        trial.set_user_attr("env_steps", result.env_steps)
        trial.set_user_attr("stop_reason", result.stop_reason)
        # Not a score (a diverged run's, or the last evaluation of one a worker's failure cut short): Optuna fails a
        # trial whose objective is nan, as it did when the failure raised.
        if result.stop_reason in ("diverged", "worker_failed"):
            return math.nan
        return result.eval_return

    def optimize(self, n_trials: int, *, wait_for_enqueued: bool = False) -> None:
        """Runs ``n_trials`` trials of the study, one after another, printing a line after each; first waits until
        another process has taken the study's enqueued trials (the preset's) when ``wait_for_enqueued``."""
        optuna = require_optuna()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = open_storage(self.storage)
        if wait_for_enqueued:
            wait_for_enqueued_taken(optuna.load_study(study_name=self.study_name, storage=storage))
        study = optuna.load_study(study_name=self.study_name, storage=storage, sampler=trial_seeded_sampler(self.seed),
                                  pruner=self.pruner)
        for _ in range(n_trials):
            try:
                # A drawn combination that a run refuses fails its trial (Optuna logs why); the sweep goes on.
                study.optimize(self.objective, n_trials=1, callbacks=[_print_trial],
                               catch=(ValueError, RLStructError))
            except ValueError as e:
                # Another sweep failed this trial while it ran (no heartbeat of it for the grace period): its result
                # cannot be told; the sweep goes on with its next trial.
                if not str(e).startswith("Cannot tell a "):
                    raise
                me = json.loads(json.dumps(process_identity()))
                number = max((t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get(OWNER) == me),
                             default="?")
                print(f"trial {number}: failed by another sweep while it ran (no heartbeat of it within the grace "
                      "period); its result is not counted", flush=True)


def _print_trial(study: Any, trial: Any) -> None:
    state = trial.state.name.lower()
    if trial.user_attrs.get("stop_reason") in ("diverged", "worker_failed"):
        state += f" ({trial.user_attrs['stop_reason'].replace('_', ' ')})"
    value = f", eval return {trial.value:.2f}" if trial.value is not None else ""
    if trial.intermediate_values and trial.state.name == "PRUNED":
        step = max(trial.intermediate_values)
        value = f" at {step}/{_STEPS_PER_BUDGET} of the budget, eval return {trial.intermediate_values[step]:.2f}"
    preset = f", preset {trial.user_attrs['preset']}" if "preset" in trial.user_attrs else ""
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
    print(f"trial {trial.number}: {state}{value} ({params}{preset})", flush=True)


def _work(plan: SweepPlan, n_trials: int, parent: int, wait_for_enqueued: bool) -> None:
    """A worker process's body: ``n_trials`` trials (see :meth:`SweepPlan.optimize`); it ends with the sweep process
    ``parent``."""
    die_with(parent)
    try:
        plan.optimize(n_trials, wait_for_enqueued=wait_for_enqueued)
    except KeyboardInterrupt:  # the parent's Ctrl-C, or its death: the trial's run has ended and said so
        sys.exit(130)


def _flag(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, (list, tuple)):
        return [flag, *map(str, value)]
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, "none" if value is None else str(value)]


def pasteable(algo: str, env: str, settings: Mapping[str, Any], *, source: str) -> tuple[str, str]:
    """The best trial's ``settings`` as ``(a rlstruct train command, a Preset entry for PRESETS)``; ``algo`` as
    ``rlstruct train`` takes it (a name or ``MODULE:ATTRIBUTE``), the preset by the algorithm's name.

    >>> command, preset = pasteable("ppo", "CartPole-v1", {"lr": 0.002, "normalize_rewards": True}, source="s")
    >>> command
    'rlstruct train ppo --env CartPole-v1 --lr 0.002 --normalize-rewards'
    >>> preset
    'Preset("ppo-cartpole-v1-sweep", "ppo", ("CartPole-v1",), {"lr": 0.002, "normalize_rewards": True}, None, "s"),'
    """
    words = ["rlstruct", "train", algo, "--env", env, *(w for k, v in settings.items() for w in _flag(k, v))]
    values = ", ".join(f'"{k}": {tuple(v) if isinstance(v, list) else v!r}' for k, v in settings.items())
    algo_name = algorithm(algo).name
    name = f"{algo_name}-{env.lower().replace('/', '-')}-sweep"
    return shlex.join(words), f'Preset("{name}", "{algo_name}", ("{env}",), {{{values}}}, None, "{source}"),'


def make_plan(algo: str, env: str, *, storage: str = DEFAULT_STORAGE, study_name: str | None = None,
              space: Mapping[str, Mapping[str, Any]] | None = None, flags: Sequence[str] = (),
              logdir: str | None = None, seed: int = 0, pruner: Any = "median") -> tuple[SweepPlan, Any]:
    """Checks a sweep's settings before any trial and returns its plan and the preset's settings
    (``(plan, preset config)``); see :func:`run_sweep`."""
    optuna = require_optuna()
    name = algorithm(algo).name  # an unknown algorithm or an outside one that does not import: before anything
    check_storage(storage)
    study_name = study_name or f"{name}-{env.replace('/', '-')}"
    plan = SweepPlan(algo, env, {}, tuple(flags), storage, study_name, logdir or f"runs/sweeps/{study_name}", seed,
                     pruner)
    base, given = plan.base()
    # The preset's run, checked as every trial will be (the env, the flags), in a folder of its own: checking claims
    # the folder it is given, and the sweep's folder holds the trials' folders, not a run.
    with tempfile.TemporaryDirectory(prefix="rlstruct-sweep-") as scratch:
        checked = validate(algorithm(algo), dataclasses.replace(base, logdir=str(Path(scratch) / "preset")),
                           given=given | {"logdir"})
        if checked.lock is not None:
            checked.lock.release()
        preset = checked.config
    if preset.max_env_steps is None:
        raise ConfigError(f"a sweep reports evaluations at tenths of the step budget, got max_env_steps=None for "
                          f"{algo} on {env}; pass -- --max-env-steps N")
    space = dict(algorithm(algo).search_space if space is None else space)
    searched = {k: v for k, v in space.items() if k not in given}  # a flag given fixes its field
    if not searched:
        raise ConfigError(f"the flags given fix every field of the search space ({sorted(space)}); drop one of them")
    if isinstance(pruner, str):
        choices = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=3),
                   "none": optuna.pruners.NopPruner}
        if pruner not in choices:
            raise ValueError(f"pruner must be one of {list(choices)} or an Optuna pruner, got {pruner!r}")
        pruner = choices[pruner]()
    return dataclasses.replace(plan, space=covering(searched, preset.to_dict()), pruner=pruner), preset


def run_sweep(algo: str, env: str, *, trials: int, storage: str = DEFAULT_STORAGE, study_name: str | None = None,
              space: Mapping[str, Mapping[str, Any]] | None = None, flags: Sequence[str] = (), n_jobs: int = 1,
              logdir: str | None = None, seed: int = 0, pruner: Any = "median") -> Any:
    """Adds ``trials`` trials to the study ``study_name`` of ``algo`` on ``env`` and returns the study.

    A new study's first trial is the run the preset gives (with ``flags``); each trial trains in
    ``logdir/trial-NUMBER`` with the settings the sampler draws from ``space``, the other settings from the preset
    and ``flags``. Calling again with the same study, ``seed`` and ``flags`` adds trials to it.

    Args:
        algo: the algorithm's name.
        env: the env id.
        trials: trials to add.
        storage: the study's database, an SQLAlchemy URL (default: ``sqlite:///runs/sweeps.db``).
        study_name: the study's name (default: ``ALGO-ENV``).
        space: the search space (default: the algorithm module's ``SEARCH_SPACE``); a field that ``flags`` gives
            is not searched.
        flags: ``rlstruct train`` flags of every trial, e.g. ``["--max-env-steps", "20000"]``.
        n_jobs: worker processes that run trials side by side (1: this process).
        logdir: the folder of the trials' run folders (default: ``runs/sweeps/STUDY``).
        seed: every trial's ``seed``; the sampler's seed; one per study.
        pruner: ``"median"`` (Optuna's median rule from a third of the budget on), ``"none"``, or an Optuna
            pruner (picklable when ``n_jobs > 1``).

    Raises:
        MissingDependencyError: Optuna is not installed.
        ValueError: a setting is out of range (or a ``ConfigError``: the run the flags give cannot start, or the
            study runs its trials with another ``seed`` or other ``flags``).
    """
    optuna = require_optuna()
    if trials < 1 or n_jobs < 1:
        raise ValueError(f"trials and n_jobs must be >= 1, got {trials} and {n_jobs}")
    plan, preset = make_plan(algo, env, storage=storage, study_name=study_name, space=space, flags=flags,
                             logdir=logdir, seed=seed, pruner=pruner)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is printed instead
    with creating(storage):
        study = optuna.create_study(study_name=plan.study_name, storage=open_storage(storage), direction="maximize",
                                    load_if_exists=True)
        _check_same_flags(study, plan)
        check_logdir(Path(plan.logdir))
        for trial in fail_dead_trials(study):
            owner = trial.user_attrs.get(OWNER, {})
            how = "ended before it did" if owner_gone(owner) else "sent no heartbeat within the grace period"
            print(f"trial {trial.number}: failed, its process ({owner.get('pid')} on {owner.get('host')}) {how}",
                  flush=True)
        # A new study runs the preset first; so does a study whose preset trial was killed before it ended.
        enqueued = not study.trials or preset_needs_a_run(study)
        if enqueued:
            if study.trials:
                print("the preset's trial was killed before it ended: it runs again", flush=True)
            study.enqueue_trial(trial_params(preset.to_dict(), plan.space), user_attrs={"preset": preset.preset})
    if n_jobs == 1:
        plan.optimize(trials, wait_for_enqueued=not enqueued)
    else:
        shares = [trials // n_jobs + (i < trials % n_jobs) for i in range(n_jobs)]
        context = multiprocessing.get_context("spawn")
        # Not daemons: a trial's run may start batcher worker processes of its own. Worker 0 takes the preset's trial
        # this call enqueued; the others wait until it has (two SQLite clients could both take it).
        workers = [context.Process(target=_work, args=(plan, n, os.getpid(), bool(i) or not enqueued))
                   for i, n in enumerate(shares) if n]
        for w in workers:
            w.start()
        try:
            for w in workers:
                w.join()
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached the workers too: each ends its trial's run
            for w in workers:
                w.join(timeout=60)
            raise
        failed = [w.exitcode for w in workers if w.exitcode != 0]
        if failed:
            raise RLStructError(f"{len(failed)} sweep worker process(es) failed (exit codes {failed}); their output "
                                "above says why")
    return optuna.load_study(study_name=plan.study_name, storage=open_storage(storage))


#: the study's user attribute holding the train settings its trials run with (:meth:`SweepPlan.train_settings`)
_TRAIN_SETTINGS = "train_settings"


def _check_same_flags(study: Any, plan: SweepPlan) -> None:
    """Records the train settings of a new study; refuses a call whose settings differ from the study's (its trials
    would not be comparable: a larger budget wins), naming each differing flag.

    Raises:
        ConfigError: the settings differ.
    """
    mine = json.loads(json.dumps(plan.train_settings()))
    theirs = study.user_attrs.get(_TRAIN_SETTINGS)
    if theirs is None:  # a new study (or one started before the settings were kept): these are its settings
        study.set_user_attr(_TRAIN_SETTINGS, mine)
        return
    if "seed" not in theirs:  # kept before the seed was: the study's seed is not known
        mine.pop("seed")
    if theirs == mine:
        return
    differ = []
    for key in sorted(set(theirs) | set(mine)):
        if theirs.get(key, _MISSING) == mine.get(key, _MISSING):
            continue
        flag = "ALGO" if key == "algo" else "--" + key.replace("_", "-")
        shown = [" ".join(map(str, v)) if isinstance(v, list) else str(v) for v in (theirs.get(key), mine.get(key))]
        if key not in mine:
            differ.append(f"{flag} {shown[0]} (the study's only)")
        elif key not in theirs:
            differ.append(f"{flag} {shown[1]} (this call's only)")
        else:
            differ.append(f"{flag} {shown[0]} (the study's) vs {shown[1]} (this call's)")
    # --seed is the sweep's own flag (every trial's seed and the sampler's), the others go to train after --
    flags = "--seed and its flags after --" if theirs.get("seed") != mine.get("seed") else "flags after --"
    raise ConfigError(f"study {study.study_name!r} runs its trials with other train flags than this call: "
                      f"{'; '.join(differ)}; pass the study's {flags}, or another --study-name")


_MISSING = object()


def sweep_main(argv: Sequence[str]) -> int:
    """``rlstruct sweep ALGO --env ID --trials N [...] [-- TRAIN FLAGS]``: a line per trial, the best trial as a
    command and as a preset, and a JSON object last."""
    argv = list(argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = OneLineParser(prog="rlstruct sweep",
                           description="Searches an algorithm's settings on an env with Optuna; flags after -- go "
                                       "to every trial's rlstruct train.")
    parser.add_argument("algo", metavar="ALGO",
                        help=f"the algorithm: one of {', '.join(ALGORITHMS)}, an installed one, or MODULE:ATTRIBUTE")
    parser.add_argument("--env", required=True, metavar="ID", help="gymnasium id of the env")
    parser.add_argument("--trials", type=int, default=8, metavar="N", help="trials to add to the study (default: 8)")
    parser.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL",
                        help=f"the study's database, an SQLAlchemy URL (default: {DEFAULT_STORAGE})")
    parser.add_argument("--study-name", default=None, metavar="NAME", help="the study's name (default: ALGO-ENV)")
    parser.add_argument("--space", default=None, metavar="FILE",
                        help="the search space, a JSON or YAML file (default: the algorithm's)")
    parser.add_argument("--n-jobs", type=int, default=1, metavar="N",
                        help="trials run side by side, one process each (default: 1)")
    parser.add_argument("--pruner", default="median", choices=["median", "none"],
                        help="median: stop a trial whose evaluation falls below the earlier trials' median at "
                             "the same step; none: never (default: median)")
    parser.add_argument("--logdir", default=None, metavar="DIR",
                        help="folder of the trials' run folders (default: runs/sweeps/STUDY)")
    parser.add_argument("--seed", type=int, default=0, help="every trial's seed, and the sampler's (default: 0)")
    ns = parser.parse_args(argv)
    try:
        space = None if ns.space is None else load_space(ns.space, algorithm(ns.algo).config_cls)
        study = run_sweep(ns.algo, ns.env, trials=ns.trials, storage=ns.storage, study_name=ns.study_name,
                          space=space, flags=flags, n_jobs=ns.n_jobs, logdir=ns.logdir, seed=ns.seed,
                          pruner=ns.pruner)
    except KeyboardInterrupt:
        print("rlstruct sweep: interrupted; the finished trials are in the study (run again to add more)",
              file=sys.stderr)
        return 130
    except (ValueError, ImportError, FileNotFoundError, RLStructError) as e:
        print(f"rlstruct sweep: error: {redact_credentials(str(e).splitlines()[0])}", file=sys.stderr)
        return 2
    return _report(ns.algo, ns.env, study, ns.storage)


def _report(algo: str, env: str, study: Any, storage: str) -> int:
    states = [t.state.name.lower() for t in study.trials]
    done = [t for t in study.trials if t.value is not None and math.isfinite(t.value)]
    # Every trial is counted: running (in another process, or one whose process on another machine died less than
    # the grace period ago) and waiting trials too.
    out: dict[str, Any] = {"study": study.study_name, "storage": redact_credentials(storage),
                           "trials": len(states),
                           **{s: states.count(s) for s in ("complete", "pruned", "fail", "running", "waiting")}}
    if done:
        best = study.best_trial
        settings = best.user_attrs.get("settings", {})
        command, preset = pasteable(algo, env, settings,
                                    source=f"rlstruct sweep: study {study.study_name}, trial {best.number}")
        print(f"best: trial {best.number}, eval return {best.value:.2f} ({best.user_attrs.get('logdir')})")
        print(command)
        print("as a preset (rlstruct.algos.PRESETS):")
        print(f"    {preset}")
        out.update(best_trial=best.number, best_value=best.value, best_params=best.params, best_settings=settings,
                   best_logdir=best.user_attrs.get("logdir"))
    print(json.dumps(out))
    return 0
