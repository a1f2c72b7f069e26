"""A small sweep and a comparison over seeds, each command in a fresh process, as docs/benchmarks/sweeps.md records:

* ``rlstruct sweep ppo --env CartPole-v1`` for a few trials at a small step budget (the study in a SQLite file);
* two presets (``ppo-cartpole``, ``a2c-cartpole``) trained over five seeds at a small budget, then
  ``rlstruct compare`` over the two groups, with the performance profiles drawn.

Usage::

    python benchmarks/sweeps.py
    python benchmarks/sweeps.py --trials 6 --sweep-steps 30000 --seeds 0,1,2,3,4 --compare-steps 50000 \\
        --plot docs/assets/compare-profiles.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

QUIET = ["--no-progress", "--no-tensorboard"]


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def rlstruct(*args: str, cwd: Path) -> str:
    """Runs ``rlstruct ARGS`` in a fresh process in ``cwd``; returns its stdout (raises with its stderr)."""
    out = subprocess.run([sys.executable, "-m", "rlstruct.algos", *args], cwd=cwd, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"rlstruct {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--trials", type=int, default=6, help="trials of the sweep (default: 6)")
    parser.add_argument("--sweep-steps", type=int, default=30_000, help="env steps per trial (default: 30000)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of each preset (default: 0,1,2,3,4)")
    parser.add_argument("--compare-steps", type=int, default=50_000, help="env steps per seed (default: 50000)")
    parser.add_argument("--presets", default="ppo,a2c", help="the algorithms whose CartPole-v1 presets are compared")
    parser.add_argument("--plot", default=None, help="also write the performance profiles' PNG here")
    args = parser.parse_args(argv)
    print(f"# torch {torch.__version__}, CPython {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average at start {load_average()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        print(rlstruct("sweep", "ppo", "--env", "CartPole-v1", "--trials", str(args.trials), "--", "--max-env-steps",
                       str(args.sweep_steps), *QUIET, cwd=work), end="")
        print(f"# the sweep took {time.perf_counter() - t0:.0f} s", flush=True)
        groups = []
        for algo in args.presets.split(","):
            group = f"runs/compare/{algo}-cartpole"
            for seed in args.seeds.split(","):
                summary = json.loads(rlstruct("train", algo, "--env", "CartPole-v1", "--seed", seed,
                                              "--max-env-steps", str(args.compare_steps), "--logdir",
                                              f"{group}/seed-{seed}", *QUIET, cwd=work).strip().splitlines()[-1])
                print(json.dumps({k: summary[k] for k in ("logdir", "eval_return", "env_steps", "stop_reason",
                                                          "preset")}), flush=True)
            groups.append(group)
        plot = ["--plot", str(Path(args.plot).resolve())] if args.plot else []
        print(rlstruct("compare", *groups, *plot, cwd=work), end="")
    print(f"# load average at end {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
