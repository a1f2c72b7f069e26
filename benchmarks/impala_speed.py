"""IMPALA's speed: wall time from launch to a confirmed score, with ``--max-lag`` 0, 1 and 2, against PPO's preset.

Each run is a fresh process, ``python -m rlstruct.algos.<algo> --env ENV --seed S ...`` with the algorithm's preset
for the env (``impala-cartpole``, ``ppo-cartpole``), stopped by the run's own rule: an evaluation at the target and
its confirmation on fresh episodes (the preset's target, or ``--target-return``). The figure is the run's
``time_to_target_s`` (``summary.json``: seconds from the process's launch, imports included, to the end of the
confirmation that stopped it) and ``eval_env_steps`` (the env steps at which the confirmed weights were taken). The
configurations of one seed run back to back, the order rotated from seed to seed (so that a drift of the machine's
load touches every configuration alike), as ``benchmarks/_fresh.py`` does; the table gives medians and ranges over
seeds, and each configuration's median time against synchronous PPO's (in process and over two workers). Each run's
steady pace (env steps per second from its first training row to its last, start-up excluded) is given beside it.
``--budget N`` trains every configuration for N env steps instead, with no target and no evaluation before the end:
the same work for every lag, so that the pace compares the loops alone, not how soon each seed learns.

IMPALA runs with ``--n-processes 2``: the actors are two worker processes and the learner this process, so that with
``--max-lag`` 1 or 2 the next acquisition is collected while the learner updates. PPO is its preset as a user runs
it (the envs step in the learner's process) and the same over two worker processes.

Usage::

    nice -n 5 python benchmarks/impala_speed.py --seeds 0,1,2,3,4
    nice -n 5 python benchmarks/impala_speed.py --seeds 0,1,2 --budget 100000
    python benchmarks/impala_speed.py --from-json a.json,b.json   # the table of files --json wrote
    python benchmarks/impala_speed.py --env MinAtar/Breakout-v1 --target-return 10 --seeds 0,1,2 \\
        --preset impala=impala-minatar-5m,ppo=ppo-minatar-5m --json benchmarks/results/impala-speed-breakout.json

``--preset ALGO=NAME,...`` runs an algorithm with a named preset (a published-budget one, which a named env alone does
not pick) instead of the one its env picks; with ``--target-return`` such a run still stops at the target
(``--stop-at-reward-threshold``), the preset's budget being only the longest it may take. A configuration's own flags
(``--n-processes``, ``--max-lag``) apply over the preset's.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _fresh import load_average, machine, med_range

#: each configuration's algorithm and flags (the preset for the env comes with the algorithm)
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "ppo in process": ("ppo", []),
    "ppo 2 workers": ("ppo", ["--n-processes", "2"]),
    "impala lag 0 2 workers": ("impala", ["--n-processes", "2", "--max-lag", "0"]),
    "impala lag 1 2 workers": ("impala", ["--n-processes", "2", "--max-lag", "1"]),
    "impala lag 2 2 workers": ("impala", ["--n-processes", "2", "--max-lag", "2"]),
}
#: the synchronous rows every configuration is compared with
BASELINES = ("ppo in process", "ppo 2 workers")


def run_one(name: str, env: str, seed: int, extra: list[str], timeout: float,
            presets: dict[str, str] | None = None) -> dict:
    """Trains configuration ``name`` on ``env`` with ``seed`` in a fresh process and reads its summary; ``presets``:
    algorithm -> the preset it runs with (else the one its env picks)."""
    algo, flags = CONFIGS[name]
    named = ["--preset", presets[algo], "--stop-at-reward-threshold"] if presets and algo in presets else []
    with tempfile.TemporaryDirectory(prefix="impala-speed-") as folder:
        logdir = Path(folder) / "run"
        cmd = [sys.executable, "-m", f"rlstruct.algos.{algo}", "--env", env, "--seed", str(seed), "--no-progress",
               "--no-tensorboard", "--logdir", str(logdir), *named, *flags, *extra]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        process_s = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {out.returncode}:\n{out.stderr[-3000:]}")
        summary = json.loads((logdir / "summary.json").read_text())
        with open(logdir / "progress.csv") as f:
            rows = [r for r in csv.DictReader(f) if not r.get("eval/return")]
    first, last = rows[0], rows[-1]
    pace = (int(last["env_steps"]) - int(first["env_steps"])) / (float(last["wall_time_s"])
                                                                 - float(first["wall_time_s"]))
    reached = bool(summary["reached_target"]) and summary.get("time_to_target_s") is not None
    return {"config": name, "seed": seed, "reached": reached, "preset": summary.get("preset"),
            "time_to_target_s": summary.get("time_to_target_s") if reached else None,
            "env_steps_to_target": summary.get("eval_env_steps") if reached else None,
            "eval_return": summary["eval_return"], "env_steps": summary["env_steps"],
            "stop_reason": summary["stop_reason"], "process_s": round(process_s, 2), "steady_steps_per_s": round(pace),
            "startup_s": summary.get("startup_s")}


def table(runs: list[dict], names: list[str]) -> list[str]:
    """The markdown table: per configuration, seeds reached, median [range] of the time and the env steps to the
    target, of the start-up (launch to the end of the first iteration), of the steady pace (env steps per second from
    the first training row to the last: collection and learning, not the start-up), and the ratio of each synchronous
    PPO row's median time to this one's (above 1: sooner than that PPO)."""
    by_name = {n: [r for r in runs if r["config"] == n] for n in names}
    medians = {n: statistics.median(r["time_to_target_s"] for r in rs if r["reached"])
               for n, rs in by_name.items() if any(r["reached"] for r in rs)}
    bases = [b for b in BASELINES if b in medians]
    lines = ["| configuration | reached | launch to target (s) | env steps to target | start-up (s) "
             "| steady env steps/s | " + " | ".join(f"{b} / this" for b in bases) + " |",
             "|:--|--:|--:|--:|--:|--:|" + "--:|" * len(bases)]
    for name, rs in by_name.items():
        ok = [r for r in rs if r["reached"]]
        ratios = " | ".join(f"{medians[b] / medians[name]:.2f}x" if name in medians else "-" for b in bases)
        lines.append(f"| {name} | {len(ok)}/{len(rs)} | {med_range([r['time_to_target_s'] for r in ok], '{:.1f}')} "
                     f"| {med_range([r['env_steps_to_target'] for r in ok])} "
                     f"| {med_range([r['startup_s'] for r in rs if r.get('startup_s') is not None], '{:.1f}')} "
                     f"| {med_range([r['steady_steps_per_s'] for r in rs])} | {ratios} |")
    return lines


def budget_table(runs: list[dict], names: list[str]) -> list[str]:
    """The markdown table of runs of a fixed budget (``--budget``): per configuration, median [range] of the process's
    wall time (launch to exit), of the start-up (launch to the end of the first iteration: imports, the workers'
    start, the first acquisition and update) and of the steady pace, and this pace against each synchronous PPO
    row's median (above 1: this one is faster)."""
    by_name = {n: [r for r in runs if r["config"] == n] for n in names}
    paces = {n: statistics.median(r["steady_steps_per_s"] for r in rs) for n, rs in by_name.items()}
    bases = [b for b in BASELINES if b in paces]
    lines = ["| configuration | env steps | launch to exit (s) | start-up (s) | steady env steps/s | "
             + " | ".join(f"this / {b}" for b in bases) + " |", "|:--|--:|--:|--:|--:|" + "--:|" * len(bases)]
    for name, rs in by_name.items():
        ratios = " | ".join(f"{paces[name] / paces[b]:.2f}x" for b in bases)
        startup = [r["startup_s"] for r in rs if r.get("startup_s") is not None]
        lines.append(f"| {name} | {med_range([r['env_steps'] for r in rs])} "
                     f"| {med_range([r['process_s'] for r in rs], '{:.1f}')} | {med_range(startup, '{:.1f}')} "
                     f"| {med_range([r['steady_steps_per_s'] for r in rs])} | {ratios} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one round each")
    parser.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    parser.add_argument("--target-return", type=float, default=None,
                        help="the target (default: each preset's, 475 on CartPole-v1)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds of wall clock a run may take")
    parser.add_argument("--budget", type=int, default=None,
                        help="train this many env steps, with no stop at a target and no evaluation before the end")
    parser.add_argument("--preset", default="", help="ALGO=NAME,...: the preset each algorithm runs with (default: "
                                                      "the one its env picks)")
    parser.add_argument("--json", default=None, help="also write every run's record to this file")
    parser.add_argument("--from-json", default=None,
                        help="print the table of the files --json wrote (comma-separated: their runs together)")
    args = parser.parse_args(argv)
    if args.from_json:
        files = [json.loads(Path(f).read_text()) for f in args.from_json.split(",")]
        for saved in files:
            print(f"{saved['command']}\n# {saved['machine']}\n# load average at the start: {saved['load_start']}, "
                  f"at the end: {saved['load_end']}")
        runs = [r for saved in files for r in saved["runs"]]
        make = budget_table if files[0].get("budget") else table
        print("\n".join(make(runs, [n for n in CONFIGS if any(r["config"] == n for r in runs)])))
        return
    unknown = set(args.only.split(",")) - set(CONFIGS) if args.only else set()
    if unknown:
        parser.error(f"--only takes names of {list(CONFIGS)}, got {sorted(unknown)}")
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    presets = dict(item.split("=", 1) for item in args.preset.split(",") if "=" in item)
    if args.preset and (len(presets) != len([i for i in args.preset.split(",") if i])
                        or not set(presets) <= {algo for algo, _ in CONFIGS.values()}):
        parser.error(f"--preset takes ALGO=NAME,... with ALGO one of {sorted({a for a, _ in CONFIGS.values()})}, got "
                     f"{args.preset!r}")
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = ([] if args.target_return is None else ["--target-return", str(args.target_return)]) + (
        [] if args.time_limit is None else ["--time-limit", str(args.time_limit)]) + (
        [] if args.budget is None else ["--max-env-steps", str(args.budget), "--no-stop-at-reward-threshold",
                                        "--eval-every", "1000000"])
    command = f"python benchmarks/impala_speed.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    print(command)
    print(f"# {machine()}")
    load_start = load_average()
    print(f"# load average at the start: {load_start}", flush=True)
    runs = []
    for r, seed in enumerate(seeds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs.append(run_one(name, args.env, seed, extra, timeout=(args.time_limit or 1800) + 300,
                                presets=presets))
            print(f"  seed {seed} {name}: {runs[-1]}", file=sys.stderr, flush=True)
    load_end = load_average()
    print(f"# load average at the end: {load_end}")
    print("\n".join((budget_table if args.budget else table)(runs, names)))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command,
                                               "machine": machine(), "load_start": load_start, "load_end": load_end,
                                               "budget": args.budget, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
