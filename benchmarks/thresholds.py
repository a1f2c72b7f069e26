"""A learning test over seeds and torch threads: the distribution its thresholds are set from.

A learning test runs one seed at one budget, and its verdict is a claim about the algorithm only where every seed and
both thread counts measured clear its thresholds with a margin. This script runs the test function itself (its
configuration and its assertions, unchanged) in a fresh process per (seed, threads), with every training run the test
starts given that ``seed`` and ``torch_threads``, and records for each run its best evaluation of trained weights,
its final evaluation, its env steps and stop reason, and whether the test's assertions held.

Usage::

    python benchmarks/thresholds.py CHECK [--seeds 0-9] [--threads 1 2] [--json PATH]
    python benchmarks/thresholds.py --list
    python benchmarks/thresholds.py --table   # every recorded check, as docs/benchmarks/learning-tests.md shows it

``--json`` defaults to ``benchmarks/results/thresholds-CHECK.json``, rewritten after each run (an interrupted
measurement keeps what it measured). A check is a test's node id, written in :data:`CHECKS`; a parametrized test
names the parameters it runs with.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fresh import load_average, machine  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Check:
    """A learning test: its module and function, and the keyword arguments of the parametrization it runs with
    (besides ``tmp_path``, given to a test that takes it)."""

    module: str
    function: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def node_id(self) -> str:
        params = "-".join(str(v) for _, v in self.kwargs)
        return f"tests/{self.module.replace('.', '/')}.py::{self.function}" + (f"[{params}]" if params else "")


#: the checks, cheapest first (CPU seconds per run on the 2-core machine)
CHECKS: dict[str, Check] = {
    "a2c-cartpole": Check("algos.test_learning", "test_a2c_learns_cartpole"),
    "a2c-cartpole-wide": Check("algos.test_learning", "test_a2c_solves_cartpole_in_a_few_wide_iterations"),
    "dqn-cartpole": Check("algos.test_learning", "test_dqn_learns_cartpole"),
    "dqn-cartpole-bf16": Check("algos.test_learning", "test_dqn_learns_cartpole_in_bfloat16_and_as_plain_dqn",
                               (("variant", "bfloat16"),)),
    "dqn-cartpole-plain": Check("algos.test_learning", "test_dqn_learns_cartpole_in_bfloat16_and_as_plain_dqn",
                                (("variant", "plain"),)),
    "dqn-cartpole-per": Check("algos.test_learning",
                              "test_dqn_with_prioritized_replay_learns_cartpole_within_the_uniform_budget"),
    "pqn-cartpole": Check("algos.test_pqn", "test_pqn_learns_cartpole"),
    "pqn-cartpole-preset": Check("algos.test_learning", "test_pqn_solves_cartpole_with_its_preset"),
    "ppo-acrobot-preset": Check("algos.test_presets", "test_ppo_acrobot_preset_reaches_minus_100"),
    "ppo-mountaincar-preset": Check("algos.test_presets", "test_ppo_mountaincar_preset_climbs_out_of_the_valley"),
    "ppo-pendulum-preset": Check("algos.test_presets", "test_ppo_pendulum_preset_nears_minus_200_within_its_budget"),
    "ppo-minatar-breakout": Check("algos.test_learning", "test_ppo_learns_torch_minatar_breakout_with_its_preset"),
    "recurrent-ppo": Check("algos.test_recurrent", "test_recurrent_ppo_learns_cartpole_without_velocities"),
    "recurrent-a2c": Check("algos.test_recurrent", "test_recurrent_a2c_learns_cartpole_without_velocities"),
    "tutorial-09-ppo": Check("project.test_tutorials", "test_tutorial_09_ppo_learns_pendulum_in_100k_steps"),
    "tutorial-09-normalised": Check("project.test_tutorials",
                                    "test_tutorial_09_normalised_ppo_learns_pendulum_in_60k_steps"),
    "tutorial-11-gymnax": Check("project.test_tutorials",
                                "test_tutorial_11_ppo_learns_cartpole_on_gymnax_in_100k_steps"),
    "sac-pendulum": Check("algos.test_sac", "test_sac_learns_pendulum"),
    "td3-pendulum": Check("algos.test_td3", "test_td3_learns_pendulum"),
    "brax-inverted-pendulum": Check("envs.test_brax", "test_ppo_learns_brax_inverted_pendulum"),
}


def _trained_evals(result: Any) -> list[float]:
    return [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]


def _summary(result: Any) -> dict[str, Any]:
    evals = _trained_evals(result)
    return {"best": max(evals) if evals else math.nan, "final": result.eval_return, "env_steps": result.env_steps,
            "iterations": result.iterations, "stop_reason": result.stop_reason,
            "reached_target": result.reached_target, "wall_time_s": round(result.wall_time_s, 1)}


def run_check(name: str, seed: int, threads: int) -> dict[str, Any]:
    """Runs the test ``CHECKS[name]`` in this process, every training run it starts given ``seed`` and ``threads``
    torch threads; returns whether its assertions held and what each of its runs reached."""
    import pytest

    sys.path.insert(0, str(ROOT))
    from tests.helpers import training_runs_with

    check = CHECKS[name]
    test = getattr(importlib.import_module(f"tests.{check.module}"), check.function)
    outcome, error = "passed", ""
    cpu0, wall0 = _cpu_seconds(), time.perf_counter()
    results: list[Any] = []
    with tempfile.TemporaryDirectory() as folder, training_runs_with(seed=seed, torch_threads=threads,
                                                                     results=results):
        try:
            given = {"tmp_path": Path(folder)} if "tmp_path" in inspect.signature(test).parameters else {}
            test(**given, **dict(check.kwargs))
        except AssertionError as e:
            outcome, error = "failed", str(e).splitlines()[0][:300] if str(e) else "AssertionError"
        except pytest.skip.Exception as e:
            outcome, error = "skipped", str(e)
    runs = [_summary(r) for r in results]
    return {"check": name, "seed": seed, "threads": threads, "outcome": outcome, "error": error, "runs": runs,
            "cpu_s": round(_cpu_seconds() - cpu0, 1), "wall_s": round(time.perf_counter() - wall0, 1)}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def seeds_from(text: str) -> list[int]:
    """``"0-9"`` or ``"0,3,5"`` (or both: ``"0-2,7"``) as a list of seeds.

    >>> seeds_from("0-2,7")
    [0, 1, 2, 7]
    """
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def spread(values: list[float]) -> str:
    """``min / median / max`` of the finite ``values``."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "-"
    return f"{min(finite):.1f} / {statistics.median(finite):.1f} / {max(finite):.1f}"


def report(results: list[dict[str, Any]]) -> None:
    """One row per thread count: the test's verdicts and the spread of its runs' best and final evaluations."""
    print("\n| threads | passed | best evaluation min / median / max | final evaluation min / median / max | "
          "env steps min / max | CPU s per test median |")
    print("|--:|--:|--:|--:|--:|--:|")
    for threads in sorted({r["threads"] for r in results}):
        rows = [r for r in results if r["threads"] == threads]
        runs = [run for r in rows for run in r["runs"]]
        steps = [run["env_steps"] for run in runs]
        print(f"| {threads} | {sum(r['outcome'] == 'passed' for r in rows)} of {len(rows)} | "
              f"{spread([run['best'] for run in runs])} | {spread([run['final'] for run in runs])} | "
              f"{min(steps, default=0):,} / {max(steps, default=0):,} | "
              f"{statistics.median(r['cpu_s'] for r in rows):.1f} |")
    print("\nper seed (best, final):")
    for r in results:
        runs = ", ".join(f"{run['best']:.1f}, {run['final']:.1f} at {run['env_steps']:,}" for run in r["runs"])
        print(f"  seed {r['seed']} threads {r['threads']}: {r['outcome']} ({runs}) {r['error']}")


def table(folder: Path) -> None:
    """One row per recorded check and thread count (``folder/thresholds-*.json``), in :data:`CHECKS`' order."""
    print("| check (test) | torch threads | seeds | passed | best evaluation min / median / max | "
          "final evaluation min / median / max | env steps min / max |")
    print("|:--|--:|--:|--:|--:|--:|--:|")
    for name in CHECKS:
        path = folder / f"thresholds-{name}.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        for threads in sorted({r["threads"] for r in record["results"]}):
            rows = [r for r in record["results"] if r["threads"] == threads]
            runs = [run for r in rows for run in r["runs"]]
            steps = [run["env_steps"] for run in runs]
            seeds = sorted(r["seed"] for r in rows)
            print(f"| `{name}` | {threads} | {seeds[0]}-{seeds[-1]} | {sum(r['outcome'] == 'passed' for r in rows)}"
                  f" of {len(rows)} | {spread([run['best'] for run in runs])} | "
                  f"{spread([run['final'] for run in runs])} | {min(steps, default=0):,} / {max(steps, default=0):,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("check", nargs="?", choices=sorted(CHECKS))
    parser.add_argument("--seeds", type=seeds_from, default=list(range(10)), help="e.g. 0-9 or 0,1,5")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--list", action="store_true", help="list the checks and their tests")
    parser.add_argument("--table", action="store_true", help="print every recorded check as one markdown table")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs the check's record holds and run only the missing (seed, threads)")
    parser.add_argument("--one", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        table(ROOT / "benchmarks" / "results")
        return
    if args.list or args.check is None:
        for name, check in CHECKS.items():
            print(f"{name:24} {check.node_id}")
        return
    if args.one is not None:
        print(json.dumps(run_check(args.check, *args.one)), flush=True)
        return
    path = args.json or ROOT / "benchmarks" / "results" / f"thresholds-{args.check}.json"
    command = f"python benchmarks/thresholds.py {args.check} --seeds {','.join(map(str, args.seeds))} " \
              f"--threads {' '.join(map(str, args.threads))}"
    record: dict[str, Any] = {"command": command, "test": CHECKS[args.check].node_id, "machine": machine(),
                              "niceness": os.nice(0), "load_average_start": load_average(), "results": []}
    if args.resume and path.exists():  # the runs already recorded stay; only the missing (seed, threads) run
        earlier = json.loads(path.read_text())
        if earlier["test"] == record["test"]:
            record["results"] = [r for r in earlier["results"] if r["outcome"] != "error"]
            record["command"] = f"{earlier['command']}; resumed: {command}"
    done = {(r["seed"], r["threads"]) for r in record["results"]}
    print(command, f"\n# {record['machine']}; load average {record['load_average_start']}", flush=True)
    # Threads that wait for work sleep instead of spinning: on a busy 2-core machine two spinning torch threads took
    # 147 CPU seconds for a run that one thread did in 6 (PQN's CartPole test), while the wait policy changes where
    # they wait, not what they compute (the same run gave the same returns with either policy).
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    for seed in args.seeds:
        for threads in args.threads:
            if (seed, threads) in done:
                continue
            cmd = [sys.executable, __file__, args.check, "--one", str(seed), str(threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                result = {"check": args.check, "seed": seed, "threads": threads, "outcome": "error",
                          "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output",
                          "runs": [], "cpu_s": math.nan, "wall_s": math.nan}
            else:
                result = json.loads(lines[-1])
            record["results"].append(result)
            record["load_average_end"] = load_average()
            path.write_text(json.dumps(record, indent=1) + "\n")
            print(f"  seed {seed} threads {threads}: {result['outcome']} "
                  f"{[(round(r['best'], 1), round(r['final'], 1), r['env_steps']) for r in result['runs']]} "
                  f"{result['cpu_s']} CPU s {result['error']}", flush=True)
    report(record["results"])


if __name__ == "__main__":
    main()
