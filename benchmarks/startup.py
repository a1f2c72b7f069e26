"""Launch to a solved CartPole-v1, and where the fixed costs of a run go: every figure from a fresh process.

Two parts:

- ``costs``: the one-off costs a run meets, each timed alone in a fresh interpreter (rounds rotated): ``import torch``;
  importing PPO's module after torch; the ``torch._dynamo`` import that every ``torch.optim`` optimizer makes at its
  construction and first step (rlstruct's :class:`~rlstruct.algos.networks.Adam` avoids it); numba's import and its
  cached CartPole kernels, loaded at the first compiled step (deferred by ``RLSTRUCT_JIT_AFTER``, 65,536 env steps).
- ``runs``: ``rlstruct train ALGO --env CartPole-v1 --seed S`` with no other flag, one fresh process per seed and
  algorithm, rotated: ``startup_s`` (launch to the end of the first training iteration), ``time_to_target_s``
  (launch to the end of the evaluation that reached 475) and the training clock between them, from the run's
  ``summary.json``; and the process's launch to exit (the final evaluation, checkpoint and plot come after the target).

Usage::

    python benchmarks/startup.py                          # both parts, PPO and A2C, seeds 0-4, 3 rounds of costs
    python benchmarks/startup.py --part runs --algos ppo --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _fresh import machine, med_range, rotated_rounds

COSTS = {
    "import torch": ("", "import torch"),
    "import rlstruct.algos.ppo (after torch)": ("import torch", "import rlstruct.algos.ppo"),
    "import torch._dynamo (what a torch.optim optimizer adds)": ("import torch", "import torch._dynamo"),
    "numba + CartPole's compiled kernels (first compiled step)": (
        "import torch\nfrom rlstruct import DictTensor\nfrom rlstruct.envs import CartPole\n"
        "import os; os.environ['RLSTRUCT_JIT_AFTER'] = '0'\n"
        "a = DictTensor({'action': torch.zeros(32, dtype=torch.int64)})",
        "env = CartPole(32, seed=0, autoreset=True); env.reset(); env.step(a)"),
}


def one_cost(name: str) -> dict:
    setup, timed = COSTS[name]
    exec(setup, globals())
    t = time.perf_counter()
    exec(timed, globals())
    return {"s": time.perf_counter() - t}


def run(algo: str, seed: int) -> dict:
    rlstruct = str(Path(sys.executable).with_name("rlstruct"))
    with tempfile.TemporaryDirectory() as logdir:
        t = time.perf_counter()
        subprocess.run([rlstruct, "train", algo, "--env", "CartPole-v1", "--seed", str(seed), "--logdir", logdir,
                        "--no-progress"], check=True, capture_output=True)
        process_s = time.perf_counter() - t
        summary = json.loads(Path(logdir, "summary.json").read_text())
    return {"startup_s": summary["startup_s"], "time_to_target_s": summary["time_to_target_s"],
            "env_steps": summary["env_steps"], "process_s": process_s}


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["costs", "runs", "all"], default="all")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the costs part (order rotated each round)")
    p.add_argument("--algos", default="ppo,a2c", help="algorithms of the runs part")
    p.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the runs part, one fresh process each")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(one_cost(args.one)))
        return
    print(f"# {machine()}, load average at start {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.part in ("costs", "all"):
        results = rotated_rounds(__file__, list(COSTS), args.rounds)
        print("\n| one-off cost | s, median [range] over rounds |\n|---|---:|")
        for name, rs in results.items():
            print(f"| {name} | {med_range([r['s'] for r in rs], '{:.2f}')} |")
    if args.part in ("runs", "all"):
        algos, seeds = args.algos.split(","), [int(s) for s in args.seeds.split(",")]
        runs = {a: [] for a in algos}
        for s in seeds:  # the algorithms alternate, so that a drift of the load touches both alike
            for a in (algos if s % 2 == 0 else algos[::-1]):
                runs[a].append(run(a, s))
                print(f"  {a} seed {s}: {runs[a][-1]}", file=sys.stderr, flush=True)
        print("\n| `rlstruct train ALGO --env CartPole-v1` | reached 475 | launch -> first iteration, s | launch -> "
              "target, s | training clock -> target, s | env steps | launch -> exit, s |\n|---|---:|---:|---:|---:|"
              "---:|---:|")
        for a, rs in runs.items():
            ok = [r for r in rs if r["time_to_target_s"] is not None]
            print(f"| {a} (seeds {args.seeds}) | {len(ok)}/{len(rs)} "
                  f"| {med_range([r['startup_s'] for r in rs], '{:.2f}')} "
                  f"| {med_range([r['time_to_target_s'] for r in ok], '{:.2f}')} "
                  f"| {med_range([r['time_to_target_s'] - r['startup_s'] for r in ok], '{:.2f}')} "
                  f"| {med_range([r['env_steps'] for r in ok])} "
                  f"| {med_range([r['process_s'] for r in rs], '{:.2f}')} |")
            if len(ok) < len(rs):  # a seed that did not reach: the median over all seeds counts it as never
                print(f"|  | median over all seeds, a miss counted as never: "
                      f"{statistics.median([r['time_to_target_s'] or float('inf') for r in rs]):.2f} s | | | | | |")
    print(f"\n# load average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
