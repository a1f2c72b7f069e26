"""Two data-parallel ranks solve CartPole-v1: ``torchrun --nproc-per-node 2`` runs of PPO (300k env steps) and of
the dqn-cartpole preset (its 100k env steps), each stopping at the preset's target of 475, over several seeds.

These are the learning proofs of the torchrun tests (tests/algos/test_distributed.py checks the plumbing at a few
iterations, and that 2 ranks of n envs end with the parameters of 1 process of 2n envs). One seed's run is not a
claim about the algorithm: its last bits depend on the CPU's rounding, so the table gives every seed's result and the
share that reached the target.

Usage::

    python benchmarks/torchrun_learning.py [--seeds 0 1 2] [--algos ppo dqn]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fresh import machine  # noqa: E402

#: algorithm -> the flags of its run (the presets for CartPole-v1 pick everything else)
RUNS = {
    "ppo": ["--max-env-steps", "300000"],
    "dqn": ["--max-env-steps", "100000"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(algo: str, seed: int) -> dict:
    """One ``torchrun`` run of 2 ranks; its summary.json with the wall clock the launcher took."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                              str(free_port()), "--no-python", "rlstruct", "train", algo, "--env", "CartPole-v1",
                              "--seed", str(seed), "--logdir", "run", "--no-progress", "--no-tensorboard",
                              *RUNS[algo]], capture_output=True, text=True, env=env, cwd=folder)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise RuntimeError(f"{algo} seed {seed} exited with {out.returncode}: {out.stderr[-2000:]}")
        summary = json.loads((Path(folder) / "run" / "summary.json").read_text())
    return {**summary, "launcher_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", choices=sorted(RUNS), default=sorted(RUNS, reverse=True))
    args = parser.parse_args()
    print(f"# {machine()}")
    print("| algorithm | seed | reached 475 | final evaluation | env steps | wall clock (s) |")
    print("|---|---|---|---|---|---|")
    for algo in args.algos:
        reached = 0
        for seed in args.seeds:
            s = run(algo, seed)
            reached += bool(s["reached_target"])
            print(f"| {algo} | {seed} | {'yes' if s['reached_target'] else 'no'} | {s['eval_return']:.1f} | "
                  f"{s['env_steps']:,} | {s['launcher_wall_s']:.0f} |", flush=True)
        print(f"| {algo} | all | {reached} of {len(args.seeds)} | | | |", flush=True)


if __name__ == "__main__":
    main()
