"""Published results at published budgets: MinAtar (5M env steps) and MuJoCo v4 (1M env steps, PPO, SAC and TD3;
HalfCheetah also with rl-baselines3-zoo's PPO settings, task ``halfcheetah-zoo``), run by rlstruct's published-budget
presets as resumable runs, and the table of docs/benchmarks/published.md.

Each (task, algorithm, seed) is one ``rlstruct train`` run in its own folder, ``ROOT/ALGO-TASK/seed-S``, which
``rlstruct compare ROOT/ALGO-TASK`` reads. Running the script again goes on where it stopped: a finished run is
skipped, a run with a checkpoint is resumed (``--resume``), a folder without one (killed before its first
checkpoint) starts again. Each run uses one torch thread; ``--jobs 2`` runs two at once::

    python benchmarks/published.py --root ../published-runs --tasks hopper,halfcheetah,walker2d --seeds 0
    python benchmarks/published.py --root ../published-runs --tasks hopper --algos sac,td3 --seeds 0
    python benchmarks/published.py --root ../published-runs --tasks breakout --algos ppo,pqn --seeds 0,1,2 --jobs 2
    python benchmarks/published.py --root ../published-runs --table docs/benchmarks/published.md

``--table`` writes the page's table from what has finished: for each row ``rlstruct compare``'s IQM of the final
evaluations with its 95% interval over seeds, the mean training return of the last episodes (what the references
print), the published figures, the budget and the wall time on this machine; a row not yet run gives the command
that runs it. A task's peers (:class:`Peer`: Stable-Baselines3 with the zoo's HalfCheetah settings) get rows of
their own from the run folders their script writes (``benchmarks/sb3_reference.py --logdir``), so that
``rlstruct compare ROOT/ppo-halfcheetah-zoo ROOT/sb3-ppo-halfcheetah-zoo`` compares the two.

``--pack-rows`` writes each row's records (evaluations, summaries, configs, what the table reads; no weights) into
the package's references, which ``rlstruct compare --reference ALGO-TASK`` reads (records already there keep the
seeds that have no folder under ``--root``, so that a row's seeds can run on several machines; ``--replace`` writes
the folders' alone), and ``--from-records`` writes the table (and ``--curves DIR`` each task's curves) from them, on
a machine without the run folders::

    python benchmarks/published.py --root ../published-runs --pack-rows
    python benchmarks/published.py --from-records --table docs/benchmarks/published.md --curves docs/assets/published

``--check`` is the learning regression check before a release (:mod:`benchmarks.learning_check`): the first
evaluations of each chosen row that has records, run again under ``ROOT/check`` and held to the band of the recorded
seeds; exit 1 when a run learns slower than the band allows::

    python benchmarks/published.py --root ../published-runs --check --tasks breakout --algos ppo --seeds 0
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))


@dataclasses.dataclass(frozen=True)
class Task:
    """One row group of the table: an env at its published budget and the figures published for it.

    Attributes:
        name: the short name ``--tasks`` takes (``"breakout"``).
        env: the env id.
        algos: algorithm -> the published-budget preset that runs it.
        references: ``(figure, source and protocol)`` pairs, the figures the task's rows stand beside.
        algo_references: an algorithm's own figures, in its row instead of the task's (MuJoCo: each algorithm's
            published returns).
        peers: other libraries' runs of the task, rows of their own.
        reevaluation: episodes over which ``--reevaluate`` evaluates each finished run's final weights again
            (``rlstruct eval``), the reference's protocol where it evaluates more episodes than the runs do; 0: none.
    """

    name: str
    env: str
    algos: dict[str, str]
    references: tuple[tuple[str, str], ...]
    peers: tuple[Peer, ...] = ()
    reevaluation: int = 0
    algo_references: dict[str, tuple[tuple[str, str], ...]] = dataclasses.field(default_factory=dict)

    def references_of(self, algo: str) -> tuple[tuple[str, str], ...]:
        """The figures the row of ``algo`` (an algorithm or a peer) stands beside: its own, else the task's."""
        return self.algo_references.get(algo, self.references)


@dataclasses.dataclass(frozen=True)
class Peer:
    """Another library's runs of a task on this machine, a row beside rlstruct's: its run folders (``ROOT/NAME-TASK``,
    read as rlstruct's are) are written by its own script, which this one does not run.

    Attributes:
        name: the group's prefix, as an algorithm's (``"sb3-ppo"``).
        label: the row's algorithm cell.
        budget: its env steps.
        command: what writes the group's seeds (``ROOT`` stands for ``--root``).
        reevaluation_script: the script (from the repository's root) whose ``--reevaluate RUN --episodes N --seed S``
            evaluates a run's final model again, printing ``rlstruct eval``'s JSON line.
    """

    name: str
    label: str
    budget: int
    command: str
    reevaluation_script: str


# the references, by the short names the table gives them (the page's section on references gives their protocols)
_MINATAR_DQN = "MinAtar paper's DQN"
_MINATAR_AC = "its actor-critic(lambda)"
_GYMNAX = "gymnax's PPO at 10M"
_CLEANRL = "CleanRL"
_ZOO = "rl-zoo"
_MINATAR_ALGOS = {"ppo": "ppo-minatar-5m", "pqn": "pqn-minatar-5m", "dqn": "dqn-minatar-5m",
                  "impala": "impala-minatar-5m"}
_MUJOCO_ALGOS = {"ppo": "ppo-mujoco-1m", "sac": "sac-mujoco-1m", "td3": "td3-mujoco-1m"}
#: the zoo evaluates its final model over 150,000 env steps: 150 episodes of these MuJoCo envs (when none falls early)
_ZOO_EPISODES = 150

#: the tasks, in the table's order
TASKS: dict[str, Task] = {t.name: t for t in (
    Task("asterix", "MinAtar/Asterix-v1", _MINATAR_ALGOS,
         (("17", _MINATAR_DQN), ("19", _MINATAR_AC), ("15", _GYMNAX))),
    Task("breakout", "MinAtar/Breakout-v1", _MINATAR_ALGOS,
         (("10", _MINATAR_DQN), ("17.5", _MINATAR_AC), ("28", _GYMNAX))),
    Task("freeway", "MinAtar/Freeway-v1", _MINATAR_ALGOS,
         (("50", _MINATAR_DQN), ("47.5", _MINATAR_AC), ("58", _GYMNAX))),
    Task("seaquest", "MinAtar/Seaquest-v1", _MINATAR_ALGOS,
         (("20 (minatar <= 1.0.10)", _MINATAR_DQN), ("15.5", _MINATAR_AC))),
    Task("spaceinvaders", "MinAtar/SpaceInvaders-v1", _MINATAR_ALGOS,
         (("43", _MINATAR_DQN), ("185", _MINATAR_AC), ("131", _GYMNAX))),
    # MuJoCo: each algorithm's own figures at 1M env steps, CleanRL's and the zoo's
    Task("hopper", "Hopper-v4", _MUJOCO_ALGOS, (), reevaluation=_ZOO_EPISODES, algo_references={
        "ppo": (("2,383", _CLEANRL), ("2,410", _ZOO)), "sac": (("2,310", _CLEANRL), ("2,326", _ZOO)),
        "td3": (("3,135", _CLEANRL), ("3,606", _ZOO))}),
    Task("halfcheetah", "HalfCheetah-v4", _MUJOCO_ALGOS, (), reevaluation=_ZOO_EPISODES, algo_references={
        "ppo": (("1,443", _CLEANRL), ("5,819", _ZOO)), "sac": (("9,635", _CLEANRL), ("9,535", _ZOO)),
        "td3": (("9,583", _CLEANRL), ("9,656", _ZOO))}),
    # the zoo's own HalfCheetah settings (its figure is one run of them)
    Task("halfcheetah-zoo", "HalfCheetah-v4", {"ppo": "ppo-halfcheetah-zoo"}, (("5,819", _ZOO),),
         reevaluation=_ZOO_EPISODES, peers=(
        Peer("sb3-ppo", "Stable-Baselines3 2.9 PPO (the zoo's `ppo.yml` entry, `VecNormalize`)", 1_000_000,
             "python benchmarks/sb3_reference.py --algo ppo --env HalfCheetah-v4 --max-env-steps 1000000 "
             "--eval-every 1000000 --eval-episodes 8 --seeds 0,1,2,3,4 --logdir ROOT/sb3-ppo-halfcheetah-zoo",
             "benchmarks/sb3_reference.py"),)),
    Task("walker2d", "Walker2d-v4", _MUJOCO_ALGOS, (), reevaluation=_ZOO_EPISODES, algo_references={
        "ppo": (("2,288", _CLEANRL), ("3,479", _ZOO)), "sac": (("3,591", _CLEANRL), ("3,863", _ZOO)),
        "td3": (("4,058", _CLEANRL), ("4,718", _ZOO))}),
)}

#: the algorithms of the table's rows, in each task's order
ALGOS = ("ppo", "pqn", "dqn", "impala", "sac", "td3")
#: the table's rows, (task, algorithm or peer), in order
ROWS = [(t, a) for t in TASKS for a in ALGOS if a in TASKS[t].algos] + \
       [(t, p.name) for t in TASKS for p in TASKS[t].peers]
ROWS.sort(key=lambda row: list(TASKS).index(row[0]))


def run_folder(root: Path, task: str, algo: str, seed: int) -> Path:
    """``ROOT/ALGO-TASK/seed-S``: one run; its parent is the group ``rlstruct compare`` reads."""
    return root / f"{algo}-{task}" / f"seed-{seed}"


def run_state(folder: Path) -> str:
    """``"new"`` (no folder, or one a run left before its first checkpoint), ``"finished"`` (its summary says it ran
    to its end: its budget spent; a run stopped before it, by a time limit, a signal or a worker's failure, is not)
    or ``"resumable"`` (a checkpoint to go on from)."""
    from rlstruct.algos._train.compare import FINISHED, record_state

    summary = folder / "summary.json"
    if summary.is_file():
        record = json.loads(summary.read_text())
        config = folder / "config.json"
        settings = json.loads(config.read_text()) if config.is_file() else {}
        if record.get("stop_reason") is not None and record_state(record, settings)[0] == FINISHED:
            return "finished"
    return "resumable" if (folder / "checkpoint.pt").is_file() else "new"


def checkpoint_every(preset: str) -> int:
    """Iterations between two checkpoints: about 50k env steps of the preset's iterations, what a kill can lose."""
    from rlstruct.algos._train.presets import PRESETS

    settings = next(p for p in PRESETS if p.name == preset).settings
    per_iteration = settings["n_envs"] * settings.get("n_steps", settings.get("rollout_steps", 1))
    return max(1, 50_000 // per_iteration)


def train_command(root: Path, task: str, algo: str, seed: int, *, max_env_steps: int | None = None,
                  every: int | None = None) -> list[str]:
    """The ``rlstruct train`` arguments that start or resume one run (the state of its folder decides which);
    ``every`` iterations between checkpoints (None: :func:`checkpoint_every`)."""
    folder = run_folder(root, task, algo, seed)
    preset = TASKS[task].algos[algo]
    extra = ["--max-env-steps", str(max_env_steps)] if max_env_steps else []
    common = ["--no-progress", "--no-tensorboard", "--torch-threads", "1",
              "--checkpoint-every", str(every or checkpoint_every(preset)), *extra]
    if run_state(folder) == "resumable":
        return ["train", algo, "--resume", str(folder), *common]
    return ["train", algo, "--env", TASKS[task].env, "--preset", preset, "--seed", str(seed), "--logdir", str(folder),
            *common]


#: the rows whose run takes under 20 minutes on a 2-core machine alone run five seeds, the others three: PPO and PQN on
#: MinAtar (Breakout's five PPO seeds took 10-17 minutes each, one torch thread, when two ran at once; SpaceInvaders'
#: seed 4 12 minutes; PQN's Freeway seeds 13 minutes each, one at a time) and PPO on MuJoCo at 1M (HalfCheetah's and
#: Walker2d's 4-9 minutes on an earlier machine; Walker2d's 13 on this 2-vCPU AMD EPYC beside another run); DQN's 5M
#: runs take about 1.6 hours, SAC's and TD3's 1M 3-4 hours
_FIVE_SEED_PRESETS = {("ppo", "ppo-minatar-5m"), ("pqn", "pqn-minatar-5m"), ("ppo", "ppo-mujoco-1m")}
FIVE_SEEDS = {(t.name, a) for t in TASKS.values() for a, preset in _FIVE_SEED_PRESETS if t.algos.get(a) == preset}


def population_command(root: Path, task: str, algo: str, seeds: list[int], *, resume: bool,
                       max_env_steps: int | None = None, every: int | None = None) -> list[str]:
    """The ``rlstruct train`` arguments that start (or, ``resume``, continue) ``seeds`` of a row as one population in
    one process (``--seeds``): its members are the row's run folders ``ROOT/ALGO-TASK/seed-S``, as one run a seed
    writes them."""
    group = run_folder(root, task, algo, seeds[0]).parent
    solo = train_command(root, task, algo, seeds[0], max_env_steps=max_env_steps, every=every)
    common = solo[solo.index("--no-progress"):]
    listed = ["--seeds", ",".join(map(str, seeds))]
    if resume:
        return ["train", algo, "--resume", str(group), *listed, *common]
    return ["train", algo, "--env", TASKS[task].env, "--preset", TASKS[task].algos[algo], *listed, "--logdir",
            str(group), *common]


def populations(root: Path, runs: list[tuple[str, str, int]]) -> list[tuple[str, str, list[int]]]:
    """``runs`` gathered into populations: the unfinished seeds of one row in one state (new, or resumable), in
    order; a row's single seed in a state stays a run of its own (``[seed]``)."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for task, algo, seed in runs:
        state = run_state(run_folder(root, task, algo, seed))
        if state == "finished":
            print(f"{run_folder(root, task, algo, seed)}: finished, skipped", flush=True)
            continue
        groups.setdefault((task, algo, state), []).append(seed)
    return [(task, algo, seeds) for (task, algo, _), seeds in groups.items()]


def start_population(root: Path, task: str, algo: str, seeds: list[int], *, max_env_steps: int | None = None,
                     every: int | None = None) -> subprocess.Popen:
    """Starts (or resumes) ``seeds`` of a row as one population in its own process, its output in
    ``ALGO-TASK/population-S1-S2-....log``."""
    folders = [run_folder(root, task, algo, seed) for seed in seeds]
    resume = run_state(folders[0]) == "resumable"
    for folder in folders:
        if not resume and folder.exists():
            shutil.rmtree(folder)  # killed before its first checkpoint: nothing to go on from
    folders[0].parent.mkdir(parents=True, exist_ok=True)
    args = population_command(root, task, algo, seeds, resume=resume, max_env_steps=max_env_steps, every=every)
    print(f"{folders[0].parent} seeds {seeds}: {'resumed' if resume else 'started'}: rlstruct {' '.join(args)}",
          flush=True)
    log = open(folders[0].parent / f"population-{'-'.join(map(str, seeds))}.log", "a")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "rlstruct.algos", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=_child_env())
    proc.log = log  # type: ignore[attr-defined]
    return proc


def row_seeds(task: str, algo: str) -> str:
    """The seeds a row runs (:data:`FIVE_SEEDS`)."""
    return "0,1,2,3,4" if (task, algo) in FIVE_SEEDS else "0,1,2"


def shown_command(task: str, algo: str, seeds: str | None = None) -> str:
    """The command a reader runs for a row (its :func:`row_seeds` by default)."""
    seeds = row_seeds(task, algo) if seeds is None else seeds
    return f"python benchmarks/published.py --root runs/published --tasks {task} --algos {algo} --seeds {seeds}"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # one thread per run: two runs share the 2 cores, and torch's pool would otherwise oversubscribe them
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    return env


def start(root: Path, task: str, algo: str, seed: int, *, max_env_steps: int | None = None,
          every: int | None = None) -> subprocess.Popen | None:
    """Starts (or resumes) one run in its own process, its output in ``FOLDER.log``; None when it has finished."""
    folder = run_folder(root, task, algo, seed)
    state = run_state(folder)
    if state == "finished":
        print(f"{folder}: finished, skipped", flush=True)
        return None
    if state == "new" and folder.exists():
        shutil.rmtree(folder)  # killed before its first checkpoint: nothing to go on from
    folder.parent.mkdir(parents=True, exist_ok=True)
    args = train_command(root, task, algo, seed, max_env_steps=max_env_steps, every=every)
    print(f"{folder}: {'resumed' if state == 'resumable' else 'started'}: rlstruct {' '.join(args)}", flush=True)
    log = open(folder.parent / f"{folder.name}.log", "a")  # noqa: SIM115 (closed when the process ends)
    proc = subprocess.Popen([sys.executable, "-m", "rlstruct.algos", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=_child_env())
    proc.log = log  # type: ignore[attr-defined]
    return proc


def run_all(root: Path, runs: list[tuple[str, str, int]], *, jobs: int = 1, max_env_steps: int | None = None,
            every: int | None = None, population: bool = False) -> int:
    """Runs ``runs`` ((task, algo, seed)), ``jobs`` at a time (with ``population``, a row's seeds as one population
    a process, :func:`populations`); returns the number that failed."""
    pending = [(t, a, [s]) for t, a, s in runs] if not population else populations(root, runs)
    active, failed = [], 0
    while pending or active:
        while pending and len(active) < jobs:
            task, algo, seeds = pending.pop(0)
            if len(seeds) == 1:
                proc = start(root, task, algo, seeds[0], max_env_steps=max_env_steps, every=every)
            else:
                proc = start_population(root, task, algo, seeds, max_env_steps=max_env_steps, every=every)
            if proc is not None:
                active.append((proc, [run_folder(root, task, algo, seed) for seed in seeds]))
        for proc, folders in list(active):
            if proc.poll() is not None:
                proc.log.close()
                active.remove((proc, folders))
                for folder in folders:
                    print(f"{folder}: exit status {proc.returncode}, {run_state(folder)}", flush=True)
                failed += proc.returncode != 0
        time.sleep(0.5)
    return failed


# --------------------------------------------------------------------------- the final weights, evaluated again
#: the env seed of every re-evaluation (``rlstruct eval``'s default): the same episodes for every run's weights
REEVALUATION_SEED = 12345


def reevaluation_path(folder: Path, episodes: int) -> Path:
    """``FOLDER/reevaluation-N.json``: a finished run's final weights evaluated again over ``episodes`` episodes."""
    return folder / f"reevaluation-{episodes}.json"


def reevaluate(root: Path, task: str, algo: str) -> list[Path]:
    """Evaluates the final weights of each finished run of ``ALGO-TASK`` again over the task's
    :attr:`Task.reevaluation` episodes (``rlstruct eval RUN --episodes N``, greedy, env seed
    :data:`REEVALUATION_SEED`; a peer's through its :attr:`Peer.reevaluation_script`), writing ``rlstruct eval``'s
    JSON line with the command into :func:`reevaluation_path` (whole); a run already re-evaluated is skipped.
    Returns the files written.

    Raises:
        RuntimeError: an evaluation failed (its output's end in the message).
    """
    from rlstruct.algos._train.durable import write_whole

    episodes = TASKS[task].reevaluation
    written = []
    for folder in sorted((root / f"{algo}-{task}").glob("seed-*")):
        target = reevaluation_path(folder, episodes)
        if not episodes or not folder.is_dir() or run_state(folder) != "finished" or target.is_file():
            continue
        options = ["--episodes", str(episodes), "--seed", str(REEVALUATION_SEED)]
        peer = next((p for p in TASKS[task].peers if p.name == algo), None)
        if peer is None:
            shown = ["rlstruct", "eval", str(folder), *options]
            args = [sys.executable, "-m", "rlstruct.algos", *shown[1:]]
        else:
            shown = ["python", peer.reevaluation_script, "--reevaluate", str(folder), *options]
            args = [sys.executable, str(HERE.parent / peer.reevaluation_script), *shown[2:]]
        proc = subprocess.run(args, capture_output=True, text=True, env=_child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(shown)} failed (status {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
        record = json.loads(proc.stdout.strip().splitlines()[-1])
        record["command"] = " ".join(shown)
        write_whole(target, json.dumps(record, indent=1))
        print(f"{folder}: final weights over {episodes} episodes: {record['eval_return']:.1f}", flush=True)
        written.append(target)
    return written


def reevaluated(values: list[float | None], episodes: int) -> str:
    """The IQM [95% CI] of the finished runs' re-evaluations ``values``, ``"-"`` unless every one has its own."""
    from rlstruct.algos.statistics import aggregate_scores

    if not episodes or not values or any(v is None for v in values):
        return "-"
    iqm = aggregate_scores(values)["iqm"]
    return _interval(iqm.value, iqm.low, iqm.high) if len(values) > 1 else _fmt(iqm.value)


# --------------------------------------------------------------------------- the table
def _compare(group: Path) -> dict | None:
    """``rlstruct compare --json`` of one group's finished runs (None: none finished)."""
    from rlstruct.algos._train.compare import compare_groups, load_group
    from rlstruct.errors import ConfigError

    try:
        return compare_groups([load_group(str(group))], allow_missing=True)["groups"][group.name]
    except (ConfigError, FileNotFoundError):
        return None


def training_return(folder: Path, episodes: int = 100) -> float | None:
    """The mean return of about the last ``episodes`` training episodes, what the references report, from
    ``progress.csv``: each row's ``train/episode_return`` (the mean over the episodes that ended in its iteration)
    weighted by the episodes it holds (the env steps of its iteration over ``train/episode_length``), latest first."""
    path = folder / "progress.csv"
    if not path.is_file():
        return None
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if _finite(r.get("train/episode_return"))
                and _finite(r.get("train/episode_length")) and float(r["train/episode_length"]) > 0]
    total, count = 0.0, 0.0
    # A row's episodes: the env steps since the row before it that had any (an iteration in which no episode ended
    # logs nan), over their mean length; with episodes that all end together (Freeway's 2,500 frames) that is every
    # env's, where counting from the iteration before would weigh each row as one or two episodes.
    for row, before in reversed(list(zip(rows, [None, *rows[:-1]]))):
        steps = float(row["env_steps"]) - (float(before["env_steps"]) if before else 0.0)
        length, mean = float(row["train/episode_length"]), float(row["train/episode_return"])
        if steps <= 0:
            continue
        n = min(max(steps / length, 1.0), episodes - count)
        total, count = total + n * mean, count + n
        if count >= episodes:
            break
    return total / count if count else None


def _finite(text: str | None) -> bool:
    try:
        return text is not None and math.isfinite(float(text))
    except ValueError:
        return False


def _last_row(folder: Path) -> dict[str, str] | None:
    path = folder / "progress.csv"
    if not path.is_file():
        return None
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def last_env_steps(folder: Path) -> int:
    """The env steps of the last row of a run's ``progress.csv`` (0 when it has none)."""
    row = _last_row(folder)
    return int(float(row["env_steps"])) if row else 0


def run_wall_time(folder: Path, summary: dict) -> float | None:
    """A finished run's wall time over all its sessions: ``summary.json``'s ``run_wall_time_s``, else (a summary
    written before that field) the last ``progress.csv`` row's ``wall_time_s``, which counts every session; its
    ``wall_time_s`` alone is the last session's."""
    total = summary.get("run_wall_time_s")
    if isinstance(total, (int, float)):
        return float(total)
    row = _last_row(folder)
    return float(row["wall_time_s"]) if row and row.get("wall_time_s") else None


def _minutes(walls: list[float]) -> str:
    """``"68 min"`` or ``"60-75 min"``: the runs' wall times."""
    if not walls:
        return "-"
    low, high = round(min(walls) / 60), round(max(walls) / 60)
    return f"{low} min" if low == high else f"{low}-{high} min"


def _interval(value: float, low: float, high: float) -> str:
    """``"5,699 [5,402, 6,080]"``: an estimate and its interval, as the table prints them."""
    return f"{_fmt(value)} [{_fmt(low)}, {_fmt(high)}]"


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def row_spec(task: str, algo: str) -> tuple[str, int, str]:
    """A row's algorithm cell, its budget in env steps and the command that runs its seeds: a preset's for one of
    the task's algorithms, a :class:`Peer`'s for a peer."""
    from rlstruct.algos._train.presets import PRESETS

    t = TASKS[task]
    if algo in t.algos:
        preset = next(p for p in PRESETS if p.name == t.algos[algo])
        return f"{algo} (`--preset {preset.name}`)", preset.settings["max_env_steps"], shown_command(task, algo)
    peer = next(p for p in t.peers if p.name == algo)
    return peer.label, peer.budget, peer.command.replace("ROOT", "runs/published")


def _training_cell(trained: list[float], runs: int) -> str:
    """The mean training return over the runs that logged their training episodes, saying how many when not all did
    (a peer's runs recorded before its script wrote them)."""
    if not trained:
        return "-"
    mean = _fmt(sum(trained) / len(trained))
    return mean if len(trained) == runs else f"{mean} ({len(trained)} of {runs} seeds)"


@dataclasses.dataclass(frozen=True)
class RowRuns:
    """What a row shows of its finished runs, read from their folders or from their records.

    Attributes:
        stats: ``rlstruct compare``'s statistics of the group (its ``runs``, ``iqm``, ``n_left_out``).
        summaries: each finished run's ``summary.json``.
        trained: each finished run's training return (:func:`training_return`; None where it logged none).
        reevaluations: each finished run's final weights evaluated again (None where not).
    """

    stats: dict
    summaries: list[dict]
    trained: list[float | None]
    reevaluations: list[float | None]


def _left_out_note(stats: dict) -> str:
    """What a row's seeds cell says of the runs it does not count: how many still run (no summary yet), and each
    other one by name and why (stopped before its budget, diverged)."""
    from rlstruct.algos._train.compare import NO_SUMMARY, left_out_reason

    left_out, stopped = stats.get("left_out", {}), stats.get("stopped_early", {})
    running = sum(state == NO_SUMMARY for state in left_out.values())
    others = [f"{Path(run).name} {left_out_reason(state, stopped.get(run))}" for run, state in left_out.items()
              if state != NO_SUMMARY]
    parts = ([f"+{running} running"] if running else []) + ([f"left out: {'; '.join(others)}"] if others else [])
    return f" ({', '.join(parts)})" if parts else ""


def _reevaluation(folder: Path, episodes: int) -> float | None:
    path = reevaluation_path(folder, episodes)
    return json.loads(path.read_text())["eval_return"] if episodes and path.is_file() else None


def _folder_runs(root: Path, task: str, algo: str) -> RowRuns | None:
    """The row's finished runs from their folders under ``root`` (None: none finished)."""
    group = root / f"{algo}-{task}"
    stats = _compare(group) if group.is_dir() else None
    if stats is None:
        return None
    folders = [Path(r) for r in stats["runs"]]
    return RowRuns(stats, [json.loads((f / "summary.json").read_text()) for f in folders],
                   [training_return(f) for f in folders],
                   [_reevaluation(f, TASKS[task].reevaluation) for f in folders])


def row_extra(folder: Path, task: str) -> dict:
    """What a row reads from a run folder beyond its records, which :func:`pack` keeps per run: its training return
    and its final weights' re-evaluation."""
    return {"training_return": training_return(folder), "reevaluation": _reevaluation(folder, TASKS[task].reevaluation)}


def _record_runs(records: Path) -> RowRuns | None:
    """The row's finished runs from their records (None: no records, or none finished)."""
    from rlstruct.algos._train.compare import compare_groups
    from rlstruct.algos._train.records import load_reference
    from rlstruct.errors import ConfigError

    if not records.is_file():
        return None
    try:
        stats = compare_groups([load_reference(f"g={records}")], allow_missing=True)["groups"]["g"]
    except ConfigError:
        return None
    runs = {r["name"]: r for r in json.loads(records.read_text())["runs"]}
    finished = [runs[folder.rpartition("/")[2]] for folder in stats["runs"]]
    extras = [r.get("extra") or {} for r in finished]
    return RowRuns(stats, [r["summary"] for r in finished], [e.get("training_return") for e in extras],
                   [e.get("reevaluation") for e in extras])


def _not_finished(root: Path | None, task: str, algo: str, command: str) -> str:
    """The cell of a row without a finished run: what it has and the command that goes on (from folders), or that it
    has no records (from records)."""
    if root is None:
        return f"no records yet (`published.py --pack-rows` where its run folders are; they run with `{command}`)"
    started = {f.name: last_env_steps(f) for f in sorted((root / f"{algo}-{task}").glob("seed-*")) if f.is_dir()}
    how = "resume" if algo in TASKS[task].algos else "remove their folders and run again"  # a peer keeps no checkpoint
    state = (f"not finished yet ({', '.join(f'{k} at {v:,} env steps' for k, v in started.items())}); {how}: "
             if started else "not run yet: ")
    return f"{state}`{command}`"


#: what the seeds cell of a row kept from the page says (:func:`row_cells`)
NO_RECORDS = "(no records kept)"


def row_cells(root: Path | None, task: str, algo: str, *, records: Path | None = None,
              kept: dict[tuple[str, str], list[str]] | None = None) -> list[str]:
    """One table row: task, algorithm, budget, seeds finished, IQM [95% CI], the re-evaluation, training return,
    wall time, references; from the run folders under ``root``, or (``records``, a folder) from the records that
    ``--pack-rows`` wrote. A row with neither, whose line on the page (``kept``, by env and algorithm) has finished
    seeds, keeps that line, its seeds cell saying that no records of it are kept: its numbers were measured before
    the records were, and a table written where its run folders are not must not lose them."""
    t = TASKS[task]
    label, max_env_steps, command = row_spec(task, algo)
    budget = f"{max_env_steps / 1e6:g}M"
    refs = "; ".join(f"{fig} ({src})" for fig, src in t.references_of(algo))
    runs = _record_runs(records / f"{algo}-{task}.json") if records is not None else _folder_runs(root, task, algo)
    if runs is None:
        line = (kept or {}).get((t.env, label))
        if line is not None and line[3].split(" ")[0] not in ("", "0"):
            seeds = line[3] if NO_RECORDS in line[3] else f"{line[3]} {NO_RECORDS}"
            return [*line[:3], seeds, *line[4:8], refs]
        if records is not None and line is not None:  # the page had it with no seed: not run, as far as it knows
            return [t.env, label, budget, "0", f"not run yet: `{command}`", "-", "-", "-", refs]
        return [t.env, label, budget, "0", _not_finished(None if records is not None else root, task, algo, command),
                "-", "-", "-", refs]
    stats = runs.stats
    iqm = stats["iqm"]
    low, high = iqm["low"], iqm["high"]
    interval = _interval(iqm["value"], low, high) if low is not None else _fmt(iqm["value"])
    walls = [w for w in (run_wall_time(Path(f), s) for f, s in zip(stats["runs"], runs.summaries)) if w is not None]
    steps = {s.get("env_steps") for s in runs.summaries}
    seeds = f"{len(runs.summaries)}{_left_out_note(stats)}"
    short = sorted(s for s in steps if isinstance(s, int) and s < max_env_steps)
    note = f" (at {', '.join(f'{s:,}' for s in short)})" if short else ""
    trained = [x for x in runs.trained if x is not None]
    return [t.env, label, budget + note, seeds, interval, reevaluated(runs.reevaluations, t.reevaluation),
            _training_cell(trained, len(runs.summaries)), _minutes(walls), refs]


TABLE_BEGIN, TABLE_END = "<!-- published table: begin -->", "<!-- published table: end -->"


def table_lines(text: str) -> dict[tuple[str, str], list[str]]:
    """The rows of the table between a page's markers, by env and algorithm (the first two cells)."""
    _, _, rest = text.partition(TABLE_BEGIN)
    body, _, _ = rest.partition(TABLE_END)
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in body.splitlines()
             if line.startswith("| ")]
    return {(c[0], c[1]): c for c in cells if len(c) == 9 and c[0] != "env"}  # not the header


def table(root: Path | None, *, records: Path | None = None,
          kept: dict[tuple[str, str], list[str]] | None = None) -> str:
    """The markdown table of every row (:data:`ROWS`), from the run folders under ``root`` or the records in
    ``records``; a row with neither keeps its line of ``kept`` (:func:`row_cells`)."""
    head = ["env", "algorithm (preset)", "budget", "seeds", "evaluation: IQM [95% CI]",
            f"final weights, {_ZOO_EPISODES} fresh episodes: IQM [95% CI]",
            "training return (last 100 episodes, mean over seeds)", "wall time a run", "published"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":--"] * 3 + ["--:"] * 5 + [":--"]) + "|"]
    lines += ["| " + " | ".join(row_cells(root, task, algo, records=records, kept=kept)) + " |"
              for task, algo in ROWS]
    return "\n".join(lines)


def write_table(root: Path | None, page: Path, *, records: Path | None = None) -> str:
    """Replaces the text between the page's table markers by :func:`table` (the page is created when missing), from
    the run folders under ``root`` or the records in ``records``."""
    from rlstruct.algos._train.flags import OneLineParser  # noqa: F401 (imports the package before torch loads)

    if records is not None:
        # the machine that ran the records is not this one: say where the numbers come from instead
        where = "Regenerated from the runs' records (`python benchmarks/published.py --table PAGE --from-records`)."
    else:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        where = (f"Taken on {platform.machine()}, {os.cpu_count()} CPUs, one torch thread a run; load average when the "
                 f"table was written {load}.")
    text = page.read_text() if page.is_file() else f"{TABLE_BEGIN}\n{TABLE_END}\n"
    rows = table(root, records=records, kept=table_lines(text))
    if NO_RECORDS in rows:
        where += (f" A row whose seeds say {NO_RECORDS} is the page's line as it was: measured before the records of "
                  "its runs were kept in the repository, where its run folders are not; it is run again to be "
                  "recorded (its command is in the section on the runs).")
    body = f"{TABLE_BEGIN}\n{rows}\n\n{where}\n{TABLE_END}"
    before, _, rest = text.partition(TABLE_BEGIN)
    _, _, after = rest.partition(TABLE_END)
    page.write_text(before + body + after)
    return body


#: the records the package ships, for rlstruct compare --reference NAME
RECORDS = HERE.parent / "algos" / "data" / "references"


def pack(group: Path, path: Path, *, name: str, about: str = "", command: str = "", task: str | None = None,
         replace: bool = False) -> Path:
    """Writes the records of the run folders in ``group`` (their states, configs, summaries and evaluations; no
    weights, no machine paths) to ``path``, which ``rlstruct compare --reference`` reads; with the ``task`` of a
    row, also what its table reads beyond them (:func:`row_extra`), so that ``--table --from-records`` writes it.
    Records already at ``path`` keep the seeds that have no folder in ``group`` (a row's seeds run on several
    machines, or its earlier seeds' folders are gone): :func:`~rlstruct.algos._train.records.merge_records`;
    ``replace`` writes the folders' runs alone."""
    from rlstruct.algos._train.records import merge_records, pack_runs, write_records

    path.parent.mkdir(parents=True, exist_ok=True)
    extra = None if task is None else (lambda folder: row_extra(folder, task))
    records = pack_runs(group, name=name, about=about, command=command, extra=extra)
    if path.is_file() and not replace:
        records, kept = merge_records(path, records)
        for run in kept:
            print(f"records: {path}: kept the finished {run} over its folder's run, which has not finished",
                  flush=True)
    return write_records(records, path)


def draw_curves(records: Path, folder: Path) -> list[Path]:
    """Draws, for each task with records in ``records``, its rows' curves over seeds (``rlstruct compare
    --curves``) into ``folder/TASK.png``; returns the files drawn."""
    from rlstruct.algos._train.compare import compare_groups
    from rlstruct.algos._train.figures import plot_curves
    from rlstruct.algos._train.records import load_reference

    folder.mkdir(parents=True, exist_ok=True)
    drawn = []
    for task in TASKS:
        paths = [(algo, records / f"{algo}-{task}.json") for t, algo in ROWS if t == task]
        groups = [load_reference(f"{algo}={path}") for algo, path in paths if path.is_file()]
        if groups:
            result = compare_groups(groups, allow_missing=True)
            result = {**result, "groups": {k: v for k, v in result["groups"].items() if k in result["curves"]}}
            if result["groups"]:
                drawn.append(plot_curves(result, folder / f"{task}.png"))
    return drawn


def check(root: Path, tasks: list[str], algos: list[str], seeds: list[int], *, records: Path,
          upto: int | None = None, max_env_steps: int | None = None) -> int:
    """The learning regression check (:mod:`benchmarks.learning_check`) of the rows of ``tasks`` x ``algos`` that
    have records in ``records``: each seed's run of the row's command under ``ROOT/check``, stopped after ``upto``
    env steps (default: the records' third evaluation), held to the recorded seeds' band; prints a line a run and
    returns 1 when one falls under its band (2 when no row has records)."""
    from benchmarks.learning_check import default_prefix, recorded_curves, run_prefix, verdict

    rows = [(t, a) for t, a in ROWS if t in tasks and a in algos and a in TASKS[t].algos]
    checked, failed = 0, 0
    for task, algo in rows:
        path = records / f"{algo}-{task}.json"
        curves = recorded_curves(path) if path.is_file() else []
        if not curves:
            print(f"{algo}-{task}: no records of finished runs in {records}, not checked; pack them first "
                  "(--root ROOT --pack-rows)", flush=True)
            continue
        prefix = float(upto) if upto is not None else default_prefix(curves)
        for seed in seeds:
            folder = run_folder(root / "check", task, algo, seed)
            shutil.rmtree(folder, ignore_errors=True)  # a check starts afresh: never resumed from an older code's run
            run = run_prefix(lambda: start(root / "check", task, algo, seed, max_env_steps=max_env_steps), folder,
                             prefix)
            result = verdict(f"{algo}-{task}/seed-{seed}", run, curves, prefix)
            print(result.line(), flush=True)
            checked += 1
            failed += not result.passed
    if not checked:
        print(f"published.py: error: no row of {tasks} x {algos} has records in {records}; nothing was checked",
              file=sys.stderr)
        return 2
    print(f"{checked - failed} of {checked} runs at or above their rows' recorded seeds", flush=True)
    return 1 if failed else 0


def _names(value: str, known) -> list[str]:
    names = [v for v in value.split(",") if v]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"published.py: error: unknown {unknown}; choose from {sorted(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--root", type=Path, default=None, help="folder of the run folders (ALGO-TASK/seed-S)")
    parser.add_argument("--tasks", default="", help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--algos", default="ppo", help="comma-separated, of ppo, pqn, dqn (MinAtar), sac, td3 "
                                                       "(MuJoCo)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (one torch thread each)")
    parser.add_argument("--population", action="store_true",
                        help="run each row's seeds as one population in one process (rlstruct train --seeds)")
    parser.add_argument("--max-env-steps", type=int, default=None, help="a smaller budget (tests)")
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                        help="iterations between checkpoints (default: the preset's evaluation period)")
    parser.add_argument("--reevaluate", action="store_true",
                        help="evaluate the finished runs' final weights of --tasks again over each task's episodes "
                             "(its reference's protocol), before the table")
    parser.add_argument("--table", type=Path, default=None, metavar="PAGE",
                        help="write the table into PAGE between its markers (after the runs, if any)")
    parser.add_argument("--pack", type=Path, action="append", default=[], metavar="GROUP",
                        help="write the records of the run folders in GROUP (no weights) into --records, named by "
                             "GROUP's last part, for rlstruct compare --reference")
    parser.add_argument("--pack-rows", action="store_true",
                        help="write the records of every row of the table that has run folders under --root")
    parser.add_argument("--replace", action="store_true",
                        help="with --pack or --pack-rows, write the run folders' runs alone (default: records "
                             "already in --records keep the seeds that have no folder here)")
    parser.add_argument("--about", default="", help="what the records of --pack are (one line)")
    parser.add_argument("--command", default="", help="the command that ran the runs of --pack")
    parser.add_argument("--from-records", action="store_true",
                        help="write --table from the records in --records (those --pack-rows wrote) instead of run "
                             "folders")
    parser.add_argument("--curves", type=Path, default=None, metavar="DIR",
                        help="with --from-records, also draw each task's curves over seeds into DIR/TASK.png")
    parser.add_argument("--records", type=Path, default=RECORDS, metavar="DIR",
                        help="where --pack and --pack-rows write (default: the package's references)")
    parser.add_argument("--check", action="store_true",
                        help="the learning regression check: run the first env steps of each row of --tasks and "
                             "--algos that has records in --records, for each of --seeds, under ROOT/check, and hold "
                             "each run to the band of its row's recorded seeds (benchmarks/learning_check.py); exit 1 "
                             "when one falls under it")
    parser.add_argument("--check-env-steps", type=int, default=None, metavar="N",
                        help="--check's prefix in env steps (default: the records' third evaluation)")
    ns = parser.parse_args(argv)
    if ns.check:
        if ns.root is None:
            parser.error("--check needs --root, the folder under which its runs go (ROOT/check)")
        return check(ns.root, _names(ns.tasks, TASKS), _names(ns.algos, ALGOS),
                     [int(s) for s in ns.seeds.split(",") if s], records=ns.records, upto=ns.check_env_steps,
                     max_env_steps=ns.max_env_steps)
    if ns.pack or ns.pack_rows:
        groups = [(g, g.name, ns.about, ns.command, None) for g in ns.pack]
        if ns.pack_rows:
            if ns.root is None:
                parser.error("--pack-rows needs --root, the folder of the run folders")
            groups += [(run_folder(ns.root, t, a, 0).parent, f"{a}-{t}", f"{row_spec(t, a)[0]} on {TASKS[t].env}",
                        row_spec(t, a)[2], t) for t, a in ROWS if run_folder(ns.root, t, a, 0).parent.is_dir()]
        from rlstruct.errors import RunRecordError

        for folder, name, about, command, task in groups:
            try:
                path = pack(folder, ns.records / f"{name}.json", name=name, about=about, command=command, task=task,
                            replace=ns.replace)
            except RunRecordError as err:
                parser.error(str(err))
            print(f"records: {path}")
        if not ns.from_records:
            return 0
    if ns.from_records:
        if ns.table is None:
            parser.error("--from-records writes the table: pass --table PAGE")
        if not any((ns.records / f"{a}-{t}.json").is_file() for t, a in ROWS):
            # the page's table from run folders would be replaced by rows that all say "no records yet"
            parser.error(f"--from-records needs the records of a row of the table in {ns.records}, got none; pack "
                         "them first (--root ROOT --pack-rows); the page is left as it is")
        print(write_table(None, ns.table, records=ns.records))
        if ns.curves is not None:
            for path in draw_curves(ns.records, ns.curves):
                print(f"curves: {path}")
        return 0
    if ns.root is None:
        parser.error("--root is required to run or tabulate")
    tasks = _names(ns.tasks, TASKS)
    algos = _names(ns.algos, set(ALGOS))
    seeds = [int(s) for s in ns.seeds.split(",") if s]
    runs = [(t, a, s) for s in seeds for t in tasks for a in algos if a in TASKS[t].algos]
    failed = run_all(ns.root, runs, jobs=ns.jobs, max_env_steps=ns.max_env_steps, every=ns.checkpoint_every,
                     population=ns.population) if runs else 0
    if ns.reevaluate:
        for task, algo in ROWS:
            if task in tasks:
                reevaluate(ns.root, task, algo)
    if ns.table is not None:
        print(write_table(ns.root, ns.table))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
