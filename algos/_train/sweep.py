"""``rlstruct sweep``: an Optuna study of one algorithm's settings on one env (:func:`run_sweep`), in any database
SQLAlchemy reaches (SQLite by default), the preset as its first trial, each trial a run folder of its own, pruned on
its evaluations as they arrive, trials run side by side in worker processes, and a second call adding trials.

Optuna compares trials at the same step; a trial reports each evaluation of trained weights at the tenth of the step
budget in which it was launched (step 0 to 10), so that trials that collect in batches of other sizes meet at the
same steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlstruct.algos._train.flags import OneLineParser, build_parser, config_from_args, given_flags
from rlstruct.algos._train.presets import given_fields
from rlstruct.algos._train.registry import ALGORITHMS, algorithm
from rlstruct.algos._train.search_space import covering, load_space, suggest, trial_params
from rlstruct.errors import ConfigError, MissingDependencyError, RLStructError

__all__ = ["DEFAULT_STORAGE", "SweepPlan", "pasteable", "run_sweep", "sweep_main"]

#: where a study is kept unless ``--storage`` says otherwise
DEFAULT_STORAGE = "sqlite:///runs/sweeps.db"
#: the fields a trial's settings leave out of the pasted preset: where and how one run is kept, not how it learns
_RUN_LOCAL = ("env", "seed", "logdir", "progress", "tensorboard", "preset", "resume")
#: the tenths of the step budget at which a trial reports its evaluations
_STEPS_PER_BUDGET = 10


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise MissingDependencyError("rlstruct sweep runs on Optuna, which is not installed here; pip install "
                                     "'rlstruct[sweep]'") from None
    return optuna


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

    def objective(self, trial: Any) -> float:
        """Trains the trial's settings in ``trial-NUMBER``; returns the final evaluation return (that of the kept
        weights when an evaluation reached the target), reporting the evaluations on the way."""
        optuna = _optuna()
        description = algorithm(self.algo)
        base, given = self.base()
        params = suggest(trial, self.space)
        config = dataclasses.replace(base, **params, logdir=str(Path(self.logdir) / f"trial-{trial.number}"))
        setup = description.validate(config, given=given | set(params) | {"logdir"})
        budget = setup.config.max_env_steps
        reported: set[int] = set()

        def report(row: Mapping[str, float]) -> None:
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
        trial.set_user_attr("logdir", config.logdir)
        result = description.run(dataclasses.replace(setup, on_evaluation=(report,)))
        if result.interrupted:
            raise KeyboardInterrupt
        trial.set_user_attr("env_steps", result.env_steps)
        return result.eval_return

    def optimize(self, n_trials: int, worker: int = 0) -> None:
        """Runs ``n_trials`` trials of the study, one after another, printing a line after each."""
        optuna = _optuna()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Seeded per worker and per call: a second call must not draw the first one's settings again.
        storage = _open_storage(self.storage)
        if worker:
            _wait_for_enqueued(optuna.load_study(study_name=self.study_name, storage=storage))
        earlier = len(optuna.load_study(study_name=self.study_name, storage=storage).trials)
        sampler = optuna.samplers.TPESampler(seed=self.seed + 1000 * worker + earlier)
        study = optuna.load_study(study_name=self.study_name, storage=storage, sampler=sampler,
                                  pruner=self.pruner)
        # A drawn combination that a run refuses fails its trial (Optuna logs why); the sweep goes on.
        study.optimize(self.objective, n_trials=n_trials, callbacks=[_print_trial], catch=(ValueError, RLStructError))


def _wait_for_enqueued(study: Any, timeout: float = 60.0) -> None:
    """Waits until worker 0 has taken the study's enqueued trials (the preset's): on SQLite two processes asking at
    once can both take the same waiting trial and run it twice, one trial short of the sweep."""
    waiting = _optuna().trial.TrialState.WAITING
    deadline = time.monotonic() + timeout
    while study.get_trials(deepcopy=False, states=(waiting,)) and time.monotonic() < deadline:
        time.sleep(0.1)


def _print_trial(study: Any, trial: Any) -> None:
    state = trial.state.name.lower()
    value = f", eval return {trial.value:.2f}" if trial.value is not None else ""
    if trial.intermediate_values and trial.state.name == "PRUNED":
        step = max(trial.intermediate_values)
        value = f" at {step}/{_STEPS_PER_BUDGET} of the budget, eval return {trial.intermediate_values[step]:.2f}"
    preset = f", preset {trial.user_attrs['preset']}" if "preset" in trial.user_attrs else ""
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
    print(f"trial {trial.number}: {state}{value} ({params}{preset})", flush=True)


def _work(plan: SweepPlan, n_trials: int, worker: int) -> None:
    plan.optimize(n_trials, worker)


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
    """The best trial's ``settings`` as ``(a rlstruct train command, a Preset entry for PRESETS)``.

    >>> command, preset = pasteable("ppo", "CartPole-v1", {"lr": 0.002, "normalize_rewards": True}, source="s")
    >>> command
    'rlstruct train ppo --env CartPole-v1 --lr 0.002 --normalize-rewards'
    >>> preset
    'Preset("ppo-cartpole-v1-sweep", "ppo", ("CartPole-v1",), {"lr": 0.002, "normalize_rewards": True}, None, "s"),'
    """
    words = ["rlstruct", "train", algo, "--env", env, *(w for k, v in settings.items() for w in _flag(k, v))]
    values = ", ".join(f'"{k}": {tuple(v) if isinstance(v, list) else v!r}' for k, v in settings.items())
    name = f"{algo}-{env.lower().replace('/', '-')}-sweep"
    return shlex.join(words), f'Preset("{name}", "{algo}", ("{env}",), {{{values}}}, None, "{source}"),'


def _open_storage(storage: str) -> Any:
    """The study's storage: a SQLite URL gets its folder created (SQLite creates the file, not its folder) and waits
    up to a minute for a lock another trial process holds, rather than SQLite's 5 s, which a loaded machine exceeds."""
    prefix = "sqlite:///"
    if not storage.startswith(prefix):
        return storage
    if storage[len(prefix):] not in ("", ":memory:"):
        Path(storage[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)
    return _optuna().storages.RDBStorage(storage, engine_kwargs={"connect_args": {"timeout": 60}})


def make_plan(algo: str, env: str, *, storage: str = DEFAULT_STORAGE, study_name: str | None = None,
              space: Mapping[str, Mapping[str, Any]] | None = None, flags: Sequence[str] = (),
              logdir: str | None = None, seed: int = 0, pruner: Any = "median") -> tuple[SweepPlan, Any]:
    """Checks a sweep's settings before any trial and returns its plan and the preset's settings
    (``(plan, preset config)``); see :func:`run_sweep`."""
    optuna = _optuna()
    if algo not in ALGORITHMS:
        raise ValueError(f"ALGO must be one of {list(ALGORITHMS)}, got {algo!r}")
    study_name = study_name or f"{algo}-{env.replace('/', '-')}"
    plan = SweepPlan(algo, env, {}, tuple(flags), storage, study_name, logdir or f"runs/sweeps/{study_name}", seed,
                     pruner)
    base, given = plan.base()
    # The preset's run, checked as every trial will be (the env, the flags); the folder is the sweep's.
    preset = algorithm(algo).validate(dataclasses.replace(base, logdir=plan.logdir), given=given | {"logdir"}).config
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
    and ``flags``. Calling again with the same study adds trials to it.

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
        seed: every trial's ``seed``; the sampler's seed.
        pruner: ``"median"`` (Optuna's median rule from a third of the budget on), ``"none"``, or an Optuna
            pruner (picklable when ``n_jobs > 1``).

    Raises:
        MissingDependencyError: Optuna is not installed.
        ValueError: a setting is out of range (or a ``ConfigError``: the run the flags give cannot start).
    """
    optuna = _optuna()
    if trials < 1 or n_jobs < 1:
        raise ValueError(f"trials and n_jobs must be >= 1, got {trials} and {n_jobs}")
    plan, preset = make_plan(algo, env, storage=storage, study_name=study_name, space=space, flags=flags,
                             logdir=logdir, seed=seed, pruner=pruner)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is printed instead
    study = optuna.create_study(study_name=plan.study_name, storage=_open_storage(storage), direction="maximize",
                                load_if_exists=True)
    if not study.trials:
        study.enqueue_trial(trial_params(preset.to_dict(), plan.space), user_attrs={"preset": preset.preset})
    if n_jobs == 1:
        plan.optimize(trials)
    else:
        shares = [trials // n_jobs + (i < trials % n_jobs) for i in range(n_jobs)]
        context = multiprocessing.get_context("spawn")
        # Not daemons: a trial's run may start batcher worker processes of its own.
        workers = [context.Process(target=_work, args=(plan, n, i)) for i, n in enumerate(shares) if n]
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
    return optuna.load_study(study_name=plan.study_name, storage=_open_storage(storage))


def sweep_main(argv: Sequence[str]) -> int:
    """``rlstruct sweep ALGO --env ID --trials N [...] [-- TRAIN FLAGS]``: a line per trial, the best trial as a
    command and as a preset, and a JSON object last."""
    argv = list(argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = OneLineParser(prog="rlstruct sweep",
                           description="Searches an algorithm's settings on an env with Optuna; flags after -- go "
                                       "to every trial's rlstruct train.")
    parser.add_argument("algo", choices=list(ALGORITHMS), help="the algorithm")
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
        print(f"rlstruct sweep: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return _report(ns.algo, ns.env, study, ns.storage)


def _report(algo: str, env: str, study: Any, storage: str) -> int:
    states = [t.state.name.lower() for t in study.trials]
    done = [t for t in study.trials if t.value is not None and math.isfinite(t.value)]
    out: dict[str, Any] = {"study": study.study_name, "storage": storage, "trials": len(states),
                           **{s: states.count(s) for s in ("complete", "pruned", "fail")}}
    if done:
        best = study.best_trial
        settings = best.user_attrs.get("settings", {})
        command, preset = pasteable(algo, env, settings,
                                    source=f"rlstruct sweep: study {study.study_name}, trial {best.number}")
        print(f"best: trial {best.number}, eval return {best.value:.2f} ({best.user_attrs.get('logdir')})")
        print(command)
        print("as a preset (rlstruct.algos._train.presets.PRESETS):")
        print(f"    {preset}")
        out.update(best_trial=best.number, best_value=best.value, best_params=best.params, best_settings=settings,
                   best_logdir=best.user_attrs.get("logdir"))
    print(json.dumps(out))
    return 0
