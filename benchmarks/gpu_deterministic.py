"""``--deterministic`` on one device (issue 66, item 5): whether two runs of one seed give the same bits, and what the
mode costs in env steps per second against the default, for A2C, PPO and DQN.

Each run is a fresh process (``python -m rlstruct.algos train ALGO``) with a fixed env-step budget and a constant
learning rate; per algorithm, rounds of three runs in a rotating order: the default, then ``--deterministic`` twice.
**same bits**: the two deterministic runs' ``progress.csv`` (the columns that measure time aside) and final weights
are equal bit for bit (the default's pair is reported beside it, as the control: on a GPU it is not promised).
**env steps/s**: between the end of iteration 2 (the warm-up: compiles, captures) and the last logged iteration,
learner included; the median over rounds and the range.

On a GPU, A2C and PPO run with every fast-path flag (``--cuda-graph --compile-update --overlap``, the learner, the
batcher and the evaluation on ``cuda``) at ``--n-envs`` envs; DQN with its own (``--cuda-graph --compile-update``: it
has no overlap). Without CUDA a small CPU version runs, so that the script is exercised (the CPU is deterministic
either way).

Usage::

    python benchmarks/gpu_deterministic.py                        # on a GPU: 2 rounds, 4,096 envs
    python benchmarks/gpu_deterministic.py --algos ppo --rounds 3 --n-envs 65536 --json det.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _common import print_table

FAST = ["--learner-device", "cuda", "--batcher-device", "cuda", "--evaluation-device", "cuda"]
FLAGS = {"a2c": [*FAST, "--cuda-graph", "--compile-update", "--overlap"],
         "ppo": [*FAST, "--cuda-graph", "--compile-update", "--overlap"],
         "dqn": [*FAST, "--cuda-graph", "--compile-update"]}
WARMUP_ITERATIONS = 2


def _run(algo: str, mode: str, seed: int, n_envs: int, iterations: int, gpu: bool, folder: Path) -> dict:
    logdir = folder / f"{algo}-{mode}"
    steps = ["--n-steps", "16"] if algo != "dqn" else ["--rollout-steps", "16", "--learning-starts", str(n_envs * 16)]
    cmd = [sys.executable, "-m", "rlstruct.algos", "train", algo, "--env", "CartPole-v1", "--seed", str(seed),
           "--n-envs", str(n_envs), *steps, "--max-env-steps", str(n_envs * 16 * (iterations + WARMUP_ITERATIONS)),
           "--eval-every", "1000000", "--n-evaluation-envs", "4", "--preset", "none", "--no-progress",
           "--no-tensorboard", "--no-stop-at-reward-threshold", "--time-limit", "3600", "--logdir", str(logdir),
           *(["--no-anneal-lr"] if algo != "dqn" else []), *(FLAGS[algo] if gpu else []),
           *(["--deterministic"] if mode.startswith("deterministic") else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{algo} {mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {"algo": algo, "mode": mode, "env_steps_per_s": math.nan, "rows": None, "weights": None}
    with open(logdir / "progress.csv") as f:
        rows = list(csv.reader(f))
    keep = [i for i, name in enumerate(rows[0]) if not name.endswith("_s")]
    timed = [dict(zip(rows[0], r)) for r in rows[1:] if r[rows[0].index("iteration")]]
    start = next(r for r in timed if int(r["iteration"]) >= WARMUP_ITERATIONS)
    end = timed[-1]
    sps = ((int(end["env_steps"]) - int(start["env_steps"]))
           / max(float(end["wall_time_s"]) - float(start["wall_time_s"]), 1e-9))
    weights = torch.load(logdir / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
    return {"algo": algo, "mode": mode, "env_steps_per_s": sps,
            "rows": [[r[i] if i < len(r) else "" for i in keep] for r in rows], "weights": weights}


def _same(a: dict, b: dict) -> bool:
    if a["rows"] is None or b["rows"] is None or a["rows"] != b["rows"]:
        return False
    return a["weights"].keys() == b["weights"].keys() and all(
        torch.equal(v.view(torch.uint8), b["weights"][k].view(torch.uint8)) for k, v in a["weights"].items())


def main() -> None:
    gpu = torch.cuda.is_available()  # counting GPUs makes no CUDA context here: the runs are child processes
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--algos", nargs="+", default=["a2c", "ppo", "dqn"], choices=sorted(FLAGS))
    parser.add_argument("--rounds", type=int, default=2 if gpu else 1)
    parser.add_argument("--n-envs", type=int, default=4096 if gpu else 16)
    parser.add_argument("--iterations", type=int, default=30 if gpu else 4, help="timed iterations a run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'cpu (no CUDA: the small CPU version)'}; torch "
          f"{torch.__version__}", flush=True)
    modes = ["default", "deterministic", "deterministic_again"]
    results = []
    for algo in args.algos:
        for r in range(args.rounds):
            order = modes[r % 3:] + modes[:r % 3]
            with tempfile.TemporaryDirectory() as tmp:
                runs = {m: _run(algo, m, args.seed, args.n_envs, args.iterations, gpu, Path(tmp)) for m in order}
            row = {"algo": algo, "round": r, "n_envs": args.n_envs,
                   "default_sps": runs["default"]["env_steps_per_s"],
                   "deterministic_sps": statistics.median([runs["deterministic"]["env_steps_per_s"],
                                                           runs["deterministic_again"]["env_steps_per_s"]]),
                   "same_bits": _same(runs["deterministic"], runs["deterministic_again"]),
                   "default_same_as_deterministic": _same(runs["default"], runs["deterministic"])}
            print(json.dumps(row), flush=True)
            results.append(row)
    table = []
    for algo in args.algos:
        mine = [r for r in results if r["algo"] == algo]
        d, k = [r["default_sps"] for r in mine], [r["deterministic_sps"] for r in mine]
        ratio = [b / a for a, b in zip(d, k)]
        table.append([algo, f"{args.n_envs:,}", f"{statistics.median(d):.3g}", f"{statistics.median(k):.3g}",
                      f"{statistics.median(ratio):.2f} [{min(ratio):.2f}, {max(ratio):.2f}]",
                      f"{sum(r['same_bits'] for r in mine)}/{len(mine)}",
                      f"{sum(r['default_same_as_deterministic'] for r in mine)}/{len(mine)}"])
    print_table(["algo", "envs", "default env steps/s", "deterministic", "ratio [range]", "same bits",
                 "default = deterministic"], table)
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": gpu, "results": results}, indent=2))


if __name__ == "__main__":
    main()
