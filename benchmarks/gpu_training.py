"""GPU end to end (issue 20): time to solve CartPole-v1 on one GPU, and training throughput with the learner.

Two measurements, each over the fast path (``--learner-device cuda --batcher-device cuda --cuda-graph
--compile-update``, and ``--overlap`` for the algorithms that have it, all but DQN; the training batcher in process,
sharing the learner's weights):

* **solve**: A2C, PPO, PQN and DQN on CartPole-v1 until an evaluation reaches 475 (gymnasium's threshold), one
  fresh process per seed (``python -m rlstruct.algos.<algo> ...``, so that every run pays its own compilation), in
  two configurations (``SOLVE_CONFIGS``): ``default``, the algorithms' default settings (32 envs for A2C, PPO and
  PQN; DQN's 4 envs of 16 steps, 32 gradient steps an iteration, its replay buffer on the GPU), and ``wide`` (A2C
  and PPO), 2,048 envs x 16 steps an iteration (``benchmarks/learning.py``'s ``*_CARTPOLE_WIDE``: about 11 A2C and
  18 PPO iterations to 475, where the defaults take about 226 and 25, and on a GPU an iteration costs about the same
  at 32 or 2,048 envs). Each has an env-step budget (the learning rate anneals over env steps, PQN's epsilon decays
  over them, the same on every device; the time limit only stops a run that does not get there). From
  the run's ``progress.csv``: **warm-up** is the wall clock at the end of iteration 2, or of the first iteration that
  learned when that comes later (DQN's, after ``learning_starts`` env steps): setup, the first acquisition, the
  update's compilation on the first update, the acquisition's CUDA-graph capture on the second;
  **training** the wall clock of the first evaluation at or above the target minus the warm-up, of which
  **evaluating** is the time the loop waited on its evaluations (``eval/blocked_s``: all of each in-process one).
* **throughput**: A2C and PPO (``THROUGHPUT_ALGOS``) at ``2**14 .. 2**20`` envs for a fixed number of iterations;
  env steps per second between the end of the warm-up and the last logged iteration, learner included. Rows are
  logged every ``log_every`` iterations (one host sync each), so the clock runs at most that many iterations ahead
  of the device; the span covers many more.

Without CUDA it runs a small CPU version of both (a few thousand env steps, a few hundred envs; no compilation
unless ``--compile``) so that the script is exercised, and says that the GPU numbers need a GPU.

Usage::

    python benchmarks/gpu_training.py                      # on a GPU machine: 5 seeds, 2**14 .. 2**20 envs
    python benchmarks/gpu_training.py --seeds 0 --log2-envs 14 16 --algos ppo
    python benchmarks/gpu_training.py --json gpu_training.json
    python benchmarks/gpu_training.py --algos dqn pqn --skip-throughput --solve-configs default --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import json
import math
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from _common import print_table
from learning import A2C_CARTPOLE_WIDE, PPO_CARTPOLE_WIDE

TARGET = 475.0
FAST_FLAGS = ["--learner-device", "cuda", "--batcher-device", "cuda", "--evaluation-device", "cuda",
              "--cuda-graph", "--compile-update"]
WARMUP_ITERATIONS = 2
# The solve runs' settings, each with an env-step budget. With a step budget the learning rate anneals over env
# steps; over the default time limit it would anneal by the clock, so a device's warm-up and speed would change
# what the run learns. DQN's and PQN's budgets are their CartPole presets' (dqn-cartpole, pqn-cartpole).
SOLVE_CONFIGS = {
    "default": {"a2c": ["--max-env-steps", "500000"], "ppo": ["--max-env-steps", "500000"],
                "pqn": ["--max-env-steps", "200000"], "dqn": ["--max-env-steps", "100000"]},
    "wide": {"a2c": A2C_CARTPOLE_WIDE, "ppo": PPO_CARTPOLE_WIDE},
}
#: the algorithms the throughput measurement trains
THROUGHPUT_ALGOS = ("a2c", "ppo")


def overlap_flags(algo: str) -> list[str]:
    """``["--overlap"]`` for an algorithm whose config has it (all but DQN, whose acquisitions and gradient steps
    alternate), else none."""
    from rlstruct.algos.harness import algorithm

    return ["--overlap"] if "overlap" in {f.name for f in dataclasses.fields(algorithm(algo).config_cls)} else []


def _rows(logdir: Path) -> list[dict[str, float]]:
    with open(logdir / "progress.csv") as f:
        return [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def _warmup(rows: list[dict[str, float]]) -> float:
    """The wall clock at the end of iteration :data:`WARMUP_ITERATIONS`, or of the first iteration that learned (a
    row with a loss) when that comes later: DQN's first update waits for ``learning_starts`` env steps."""
    train = [r for r in rows if "eval/return" not in r]
    learned = [r["iteration"] for r in train if any(k.startswith("loss/") for k in r)]
    start = max(WARMUP_ITERATIONS, learned[0] if learned else 0)
    done = [r for r in train if r["iteration"] >= start]
    return done[0]["wall_time_s"] if done else math.nan


def solve(algo: str, seed: int, gpu: bool, *, compile_update: bool, time_limit: float, config: str = "default",
          physics_dtype: str = "float64", extra: Sequence[str] = ()) -> dict[str, float]:
    """One run of ``algo`` on CartPole-v1 until an evaluation reaches the target, in a fresh process, in one of
    ``SOLVE_CONFIGS`` (``extra``: more flags of ``rlstruct train``)."""
    with tempfile.TemporaryDirectory() as tmp:
        flags = overlap_flags(algo) + (FAST_FLAGS if gpu else (["--compile-update"] if compile_update else []))
        cmd = [sys.executable, "-m", f"rlstruct.algos.{algo}", "--seed", str(seed), "--logdir", tmp, "--no-progress",
               "--no-tensorboard", "--target-return", str(TARGET), "--time-limit", str(time_limit),
               "--physics-dtype", physics_dtype, *SOLVE_CONFIGS[config][algo], *flags, *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:  # say why, and go on with the other runs
            print(f"{algo} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            return {"algo": algo, "config": config, "seed": seed, "warmup_s": math.nan, "train_s": math.nan,
                    "eval_s": math.nan, "reached": False, "iterations": 0, "env_steps": 0, "process_s": wall,
                    "error": proc.stderr[-3000:]}
        rows = _rows(Path(tmp))
        # What the launch spent compiling, and whether it found its graphs in the compile cache (a warm launch).
        compiled = json.loads((Path(tmp) / "summary.json").read_text()).get("compile") or {}
    warm = _warmup(rows)
    reached = [r for r in rows if r.get("eval/return", -math.inf) >= TARGET and r.get("eval/launch_env_steps", 0) > 0]
    at = reached[0]["wall_time_s"] if reached else math.nan
    end = at if reached else rows[-1]["wall_time_s"]
    # The time training waited on its (in-process) evaluations, a part of the training time.
    eval_s = sum(r["eval/blocked_s"] for r in rows if "eval/blocked_s" in r and warm < r["wall_time_s"] <= end)
    last = reached[0] if reached else rows[-1]
    run = {"algo": algo, "config": config, "seed": seed, "warmup_s": warm, "train_s": at - warm, "eval_s": eval_s,
           "reached": bool(reached), "iterations": last["iteration"], "env_steps": last["env_steps"],
           "process_s": wall, "compile_s": compiled.get("seconds"),
           "compile_cache_hits": compiled.get("fx_graph_cache_hits"),
           "compile_cache_misses": compiled.get("fx_graph_cache_misses")}
    print(json.dumps(run), flush=True)  # one line a run, so that a run cut short still shows the finished ones
    return run


def throughput(algo: str, n_envs: int, device: str, *, compile_update: bool, iterations: int,
               physics_dtype: str = "float64", matmul_precision: str = "highest",
               autocast: str = "none", compile_policy: bool = False) -> dict[str, float]:
    """Env steps per second of ``algo``'s training loop (collection and learning) at ``n_envs`` envs."""
    from rlstruct.algos import a2c, ppo

    module, cls = {"a2c": (a2c, a2c.A2CConfig), "ppo": (ppo, ppo.PPOConfig)}[algo]
    n_steps = cls.n_steps
    gpu = device.startswith("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        config = cls(n_envs=n_envs, learner_device=device, batcher_device=device, evaluation_device=device,
                     cuda_graph=gpu, compile_update=compile_update, overlap=True, anneal_lr=False,
                     max_env_steps=n_envs * n_steps * (iterations + WARMUP_ITERATIONS), time_limit=3600.0,
                     eval_every=10 ** 9, n_evaluation_envs=4, stop_at_reward_threshold=False, progress=False,
                     tensorboard=False, logdir=tmp, physics_dtype=physics_dtype, matmul_precision=matmul_precision,
                     autocast=autocast, compile_policy=compile_policy)
        result = module.train(config)
    # Free this size's compiled update and its CUDA-graph memory pools before the next size (all seven sizes'
    # pools together do not fit in 80 GB).
    torch.compiler.reset()
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    rows = [r for r in result.history if "eval/return" not in r]
    start = next(r for r in rows if r["iteration"] >= WARMUP_ITERATIONS)
    end = rows[-1]
    sps = (end["env_steps"] - start["env_steps"]) / max(end["wall_time_s"] - start["wall_time_s"], 1e-9)
    row = {"algo": algo, "n_envs": n_envs, "device": device, "env_steps_per_s": sps,
           "warmup_s": start["wall_time_s"], "iterations": end["iteration"] - start["iteration"]}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["a2c", "ppo"], choices=["a2c", "ppo", "pqn", "dqn"],
                        help="the solve runs' algorithms; the throughput measurement trains those of them that "
                             f"are in {list(THROUGHPUT_ALGOS)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 0..4 on a GPU, 0 on the CPU")
    parser.add_argument("--log2-envs", nargs="+", type=int, default=None,
                        help="throughput at 2**k envs (default: 14..20 on a GPU, 8 10 on the CPU)")
    parser.add_argument("--iterations", type=int, default=None, help="timed iterations (default: 50 GPU, 5 CPU)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds per solve run (default: 120 GPU, 20 CPU)")
    parser.add_argument("--compile", action="store_true", help="on the CPU, also compile the update (slow to start)")
    parser.add_argument("--physics-dtype", default="float64", choices=["float64", "float32"],
                        help="the torch CartPole's physics precision")
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"],
                        help="the runs' float32 matmul precision (high: TF32 on the GPU)")
    parser.add_argument("--autocast", default="none", choices=["none", "bfloat16"],
                        help="the update's and the training policy's forward in bfloat16 (rlstruct train --autocast)")
    parser.add_argument("--compile-policy", action="store_true",
                        help="compile the training batcher's policy step (rlstruct train --compile-policy)")
    parser.add_argument("--solve-configs", nargs="+", default=list(SOLVE_CONFIGS), choices=list(SOLVE_CONFIGS),
                        help="the solve runs' settings: the algorithms' defaults and/or the wide batches")
    parser.add_argument("--solve-args", default="",
                        help="more flags for the solve runs' `rlstruct train`, e.g. '--n-envs 256 --max-env-steps 5e5'")
    parser.add_argument("--skip-solve", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--json", default=None, help="write the results to this file")
    ns = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    seeds = ns.seeds if ns.seeds is not None else ([0, 1, 2, 3, 4] if gpu else [0])
    log2 = ns.log2_envs if ns.log2_envs is not None else (list(range(14, 21)) if gpu else [8, 10])
    iterations = ns.iterations if ns.iterations is not None else (50 if gpu else 5)
    time_limit = ns.time_limit if ns.time_limit is not None else (120.0 if gpu else 20.0)
    compile_update = gpu or ns.compile
    machine = torch.cuda.get_device_name() if gpu else platform.processor() or platform.machine()
    print(f"device: {device} ({machine}), torch {torch.__version__}, compile_update={compile_update}, "
          f"physics {ns.physics_dtype}, matmul precision {ns.matmul_precision}, autocast {ns.autocast}, "
          f"compile_policy={ns.compile_policy}")
    if not gpu:
        print("no CUDA device: running the small CPU version; the GPU numbers (solve time on one GPU, throughput at "
              "2**14..2**20 envs) need a GPU machine")
    out: dict[str, object] = {"device": device, "machine": machine, "torch": torch.__version__, "gpu": gpu,
                              "matmul_precision": ns.matmul_precision, "autocast": ns.autocast,
                              "compile_policy": ns.compile_policy}

    if not ns.skip_solve:
        runs = []
        for a in ns.algos:
            for c in [c for c in ns.solve_configs if a in SOLVE_CONFIGS[c]]:
                for s in seeds:
                    runs.append(solve(a, s, gpu, compile_update=compile_update, time_limit=time_limit, config=c,
                                      physics_dtype=ns.physics_dtype,
                                      extra=["--matmul-precision", ns.matmul_precision, "--autocast", ns.autocast,
                                             *(["--compile-policy"] if ns.compile_policy else []),
                                             *shlex.split(ns.solve_args)]))
                    if "error" in runs[-1]:  # the other seeds would fail the same way
                        break
        out["solve"] = runs
        rows = []
        for a, c in [(a, c) for a in ns.algos for c in ns.solve_configs if a in SOLVE_CONFIGS[c]]:
            mine = [r for r in runs if r["algo"] == a and r["config"] == c]
            ok = [r for r in mine if r["reached"]]
            def med(k: str, fmt: str = ".1f") -> str:
                return format(statistics.median(r[k] for r in ok), fmt) if ok else "-"

            rows.append([a, c, f"{len(ok)}/{len(mine)}", med("warmup_s"), med("train_s", ".2f"), med("eval_s", ".2f"),
                         med("iterations", ".0f"), med("env_steps", ",.0f"),
                         f"{statistics.median(r['warmup_s'] for r in mine):.1f}"])
        print(f"\nCartPole-v1 to an evaluation >= {TARGET:g} ({device}, seeds {seeds}; medians over the runs that "
              "reached it):")
        print_table(["algo", "config", "reached", "warm-up s", "training s", "of which evaluating s", "iterations",
                     "env steps", "warm-up s (all runs)"], rows)

    if not ns.skip_throughput:
        tp = [throughput(a, 2 ** k, device, compile_update=compile_update, iterations=iterations,
                         physics_dtype=ns.physics_dtype, matmul_precision=ns.matmul_precision,
                         autocast=ns.autocast, compile_policy=ns.compile_policy)
              for a in ns.algos if a in THROUGHPUT_ALGOS for k in log2]
        out["throughput"] = tp
        print(f"\nTraining throughput, learner included ({device}, {iterations} timed iterations):")
        print_table(["algo", "envs", "env steps/s", "warm-up s"],
                    [[r["algo"], f"2^{int(math.log2(r['n_envs']))}", f"{r['env_steps_per_s']:,.0f}",
                      f"{r['warmup_s']:.1f}"] for r in tp])
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
