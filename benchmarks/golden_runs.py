"""Golden runs: short ``rlstruct train`` runs whose ``progress.csv`` must not change under a refactor.

Every run is a fresh ``rlstruct train ...`` process with a small ``--max-env-steps`` budget, ``--seed 0``, no progress
bar, no TensorBoard and a generous ``--time-limit`` (the step budget ends every run, so nothing depends on the
machine's speed). Each run's ``progress.csv`` is stored with its wall-clock columns dropped; ``--compare DIR``
runs them again and diffs every file against the stored set, value for value (bit for bit: the CSV's text).

A stored set holds only for the machine that wrote it: the same CPU model, torch build and thread count. Another CPU's
kernels may round a sum differently (AVX-512 against AVX2 blocks a matrix product differently), and a learning run
amplifies the last bit into different numbers from then on. Store the "before" set and compare the "after" runs on
one machine; a set from another machine tells nothing about a change of the code.

The list covers the seven algorithms (TD3 too); feed-forward, recurrent, normalised and overlapped actor-critics; pixels
(MinAtar Breakout through DQN and A2C); prioritized replay (DQN and SAC); worker processes (``--n-processes 2``); and a
resumed run (trained with ``--checkpoint-every``, then continued with ``--resume`` to a larger budget).

Usage::

    python benchmarks/golden_runs.py --out /tmp/golden-before            # store a set
    python benchmarks/golden_runs.py --compare /tmp/golden-before        # run again, diff against it
    python benchmarks/golden_runs.py --compare /tmp/golden-before --only ppo-ff a2c-recurrent

The exit status is 0 when every compared file is identical, 1 otherwise (the differing runs are listed).
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: flags every run shares: the step budget ends it, so the wall clock plays no part; the bare defaults (no preset), so
#: that a preset's change does not read as a change of the code
COMMON = ["--seed", "0", "--no-progress", "--no-tensorboard", "--time-limit", "900", "--preset", "none",
          "--no-stop-at-reward-threshold", "--n-evaluation-envs", "4", "--evaluation-max-steps", "200"]

#: name -> (algorithm, flags). The resumed pair is special-cased: ``resume-second`` continues ``resume-first``.
RUNS: dict[str, tuple[str, list[str]]] = {
    "a2c-ff": ("a2c", ["--n-envs", "8", "--max-env-steps", "3000", "--eval-every", "15"]),
    "a2c-recurrent": ("a2c", ["--n-envs", "8", "--max-env-steps", "2000", "--eval-every", "15", "--recurrent"]),
    "a2c-normalized": ("a2c", ["--env", "Pendulum-v1", "--n-envs", "8", "--max-env-steps", "3000", "--eval-every",
                               "15", "--normalize-observations", "--normalize-rewards"]),
    "a2c-overlap": ("a2c", ["--n-envs", "8", "--max-env-steps", "3000", "--eval-every", "15", "--overlap"]),
    "a2c-processes": ("a2c", ["--n-envs", "8", "--n-processes", "2", "--max-env-steps", "2000", "--eval-every",
                              "15"]),
    "a2c-pixels": ("a2c", ["--env", "MinAtar/Breakout-v1", "--backend", "gymnasium", "--n-envs", "4",
                           "--max-env-steps", "512", "--eval-every", "8", "--evaluation-max-steps", "50"]),
    "ppo-ff": ("ppo", ["--n-envs", "8", "--n-steps", "32", "--max-env-steps", "3000", "--eval-every", "4"]),
    "ppo-recurrent": ("ppo", ["--n-envs", "8", "--n-steps", "32", "--max-env-steps", "2000", "--eval-every", "4",
                              "--recurrent"]),
    "ppo-normalized": ("ppo", ["--env", "Pendulum-v1", "--n-envs", "8", "--n-steps", "32", "--max-env-steps",
                               "3000", "--eval-every", "4", "--normalize-observations", "--normalize-rewards"]),
    "ppo-overlap": ("ppo", ["--n-envs", "8", "--n-steps", "32", "--max-env-steps", "3000", "--eval-every", "4",
                            "--overlap"]),
    "reinforce-ff": ("reinforce", ["--n-envs", "8", "--max-env-steps", "3000", "--eval-every", "3"]),
    "reinforce-normalized": ("reinforce", ["--n-envs", "8", "--max-env-steps", "3000", "--eval-every", "3",
                                           "--normalize-observations", "--normalize-rewards"]),
    "dqn-ff": ("dqn", ["--n-envs", "4", "--max-env-steps", "3000", "--learning-starts", "500", "--gradient-steps",
                       "4", "--eval-every", "15", "--epsilon-decay-steps", "2000"]),
    "dqn-pixels": ("dqn", ["--env", "MinAtar/Breakout-v1", "--backend", "gymnasium", "--n-envs", "4",
                           "--max-env-steps", "1024", "--learning-starts", "256", "--gradient-steps", "2",
                           "--batch-size", "32", "--buffer-size", "2048", "--eval-every", "8",
                           "--evaluation-max-steps", "50"]),
    "pqn-ff": ("pqn", ["--n-envs", "8", "--n-steps", "16", "--n-minibatches", "4", "--max-env-steps", "3000",
                       "--eval-every", "4"]),
    "sac-ff": ("sac", ["--n-envs", "4", "--max-env-steps", "1500", "--learning-starts", "400",
                       "--gradient-steps-per-env-step", "0.25", "--batch-size", "64", "--eval-every", "15"]),
    "td3-ff": ("td3", ["--n-envs", "4", "--max-env-steps", "1500", "--learning-starts", "400",
                       "--gradient-steps-per-env-step", "0.25", "--batch-size", "64", "--eval-every", "15"]),
    "dqn-prioritized": ("dqn", ["--n-envs", "4", "--max-env-steps", "3000", "--learning-starts", "500",
                                "--gradient-steps", "4", "--eval-every", "15", "--epsilon-decay-steps", "2000",
                                "--prioritized-replay"]),
    "sac-prioritized": ("sac", ["--n-envs", "4", "--max-env-steps", "1500", "--learning-starts", "400",
                                "--gradient-steps-per-env-step", "0.25", "--batch-size", "64", "--eval-every", "15",
                                "--prioritized-replay"]),
    "resume-first": ("ppo", ["--n-envs", "8", "--n-steps", "32", "--max-env-steps", "1536", "--eval-every", "4",
                             "--checkpoint-every", "3"]),
    "resume-second": ("ppo", ["--max-env-steps", "3072"]),
}

#: columns that hold wall-clock measurements (they differ from run to run by nature)
WALL_COLUMNS = ("wall_time_s",)


def _is_wall(column: str) -> bool:
    name = column.rsplit("/", 1)[-1]
    return column in WALL_COLUMNS or name.endswith("_s") or "per_s" in name or name in ("sps", "steps_per_s")


def strip_wall(text: str) -> str:
    """The CSV ``text`` without its wall-clock columns, the other cells verbatim."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return ""
    keep = [i for i, c in enumerate(rows[0]) if not _is_wall(c)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow([row[i] if i < len(row) else "" for i in keep])
    return out.getvalue()


def _train(algo: str, flags: list[str], logdir: Path, log_file: Path) -> None:
    script = Path(sys.executable).with_name("rlstruct")
    entry = [str(script)] if script.is_file() else [sys.executable, "-m", "rlstruct.algos"]
    cmd = [*entry, "train", algo, *COMMON, *flags, "--logdir", str(logdir)]
    with open(log_file, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}; see {log_file}")


def run_one(name: str, work: Path) -> tuple[str, str, float]:
    """Runs golden run ``name`` in ``work``; returns ``(name, progress.csv without wall columns, seconds)``."""
    t0 = time.perf_counter()
    algo, flags = RUNS[name]
    logdir = work / name
    if name == "resume-second":
        first = work / "resume-first"
        if not (first / "checkpoint.pt").is_file():
            algo1, flags1 = RUNS["resume-first"]
            _train(algo1, flags1, first, work / "resume-first.log")
        shutil.copytree(first, logdir, dirs_exist_ok=True)
        _train(algo, [*flags, "--resume", str(logdir)], logdir, work / f"{name}.log")
    else:
        _train(algo, flags, logdir, work / f"{name}.log")
    return name, strip_wall((logdir / "progress.csv").read_text()), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="store the runs' progress.csv (wall columns dropped) here")
    mode.add_argument("--compare", type=Path, help="run again and diff against the set stored here")
    p.add_argument("--only", nargs="+", choices=list(RUNS), help="these runs only (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default: 1)")
    p.add_argument("--keep", type=Path, default=None, help="keep the runs' log folders here (default: a temp dir)")
    ns = p.parse_args(argv)
    names = ns.only or list(RUNS)
    # resume-second needs resume-first's folder: run the pair in one task.
    tasks = [n for n in names if n != "resume-first" or "resume-second" not in names]
    work = ns.keep or Path(tempfile.mkdtemp(prefix="golden-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, str] = {}
    with ThreadPoolExecutor(ns.jobs) as pool:
        for name, text, seconds in pool.map(lambda n: run_one(n, work), tasks):
            print(f"{name}: {seconds:.1f} s", flush=True)
            results[name] = text
            if name == "resume-second" and "resume-first" in names:
                results["resume-first"] = strip_wall((work / "resume-first" / "progress.csv").read_text())
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        for name, text in results.items():
            (ns.out / f"{name}.csv").write_text(text)
        print(f"stored {len(results)} runs in {ns.out}")
        return 0
    differ = []
    for name in names:
        stored = ns.compare / f"{name}.csv"
        if not stored.is_file():
            print(f"{name}: no stored {stored}")
            differ.append(name)
        elif stored.read_text() != results[name]:
            print(f"{name}: DIFFERS from {stored} (logs in {work / name})")
            differ.append(name)
        else:
            print(f"{name}: identical")
    if ns.keep is None and not differ:
        shutil.rmtree(work, ignore_errors=True)
    print("all identical" if not differ else f"{len(differ)} of {len(names)} differ: {' '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
