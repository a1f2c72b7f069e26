"""Two A2C training runs on the GPU fast path in one process: the sequence after which a CUDA graph's replay once
failed with ``unspecified launch failure`` (docs/benchmarks/gpu-end-to-end.md, "On an H200, with the counter-based
draws"), with each fast-path flag switchable, to find the one that leaves something behind.

Each variant runs in a fresh process (``--one NAME``), its two runs one after the other; a run's failure is
printed with its traceback and the next variant runs. ``all`` is the failing combination; each other variant drops
one flag or changes what happens between the runs.

Usage (on a GPU machine, from the repository root)::

    python benchmarks/gpu_two_runs.py                          # every variant, test-suite sizes (64 envs, then 64)
    python benchmarks/gpu_two_runs.py --log2-envs 18 20        # the throughput benchmark's sizes
    CUDA_LAUNCH_BLOCKING=1 python benchmarks/gpu_two_runs.py --only all
    RLSTRUCT_CHECK_GRAPH_INPUTS=1 python benchmarks/gpu_two_runs.py --only all   # torch 2.13: names a dead input
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

#: name -> (config overrides, what happens between the two runs)
VARIANTS: dict[str, tuple[dict[str, object], str]] = {
    "all": ({}, "nothing"),
    "all_reset": ({}, "reset"),
    "no_compile_update": ({"compile_update": False}, "nothing"),
    "no_cuda_graph": ({"cuda_graph": False}, "nothing"),
    "no_overlap": ({"overlap": False}, "nothing"),
    "no_eval_graph": ({"evaluation_device": "cpu"}, "nothing"),
}


def one(name: str, sizes: list[int], autocast: str) -> dict[str, object]:
    import torch

    from rlstruct.algos import a2c

    overrides, between = VARIANTS[name]
    done = []
    for k, n_envs in enumerate(sizes):
        with tempfile.TemporaryDirectory() as tmp:
            config = {"n_envs": n_envs, "max_env_steps": max(4_096, n_envs * 8 * 6), "eval_every": 4,
                      "hidden_sizes": (32,), "learner_device": "cuda", "batcher_device": "cuda",
                      "evaluation_device": "cuda", "cuda_graph": True, "compile_update": True, "overlap": True,
                      "autocast": autocast, "progress": False, "tensorboard": False, "logdir": tmp,
                      "time_limit": 600.0, "stop_at_reward_threshold": False, "preset": "none", **overrides}
            t0 = time.perf_counter()
            try:
                a2c.train(a2c.A2CConfig(**config))
                torch.cuda.synchronize()
            except Exception as e:
                traceback.print_exc()
                return {"variant": name, "runs_done": done, "failed_run": k, "error": f"{type(e).__name__}: {e}"[:300]}
            done.append({"n_envs": n_envs, "s": round(time.perf_counter() - t0, 1)})
        if between == "reset":
            torch.compiler.reset()
            gc.collect()
            torch.cuda.empty_cache()
    return {"variant": name, "runs_done": done, "failed_run": None, "error": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--log2-envs", nargs=2, type=int, default=[6, 6], help="the two runs' sizes (2**k envs)")
    parser.add_argument("--autocast", default="none", choices=["none", "bfloat16"])
    parser.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    sizes = [2 ** k for k in ns.log2_envs]
    if ns.one:
        print(json.dumps(one(ns.one, sizes, ns.autocast)), flush=True)
        return 0
    failed = 0
    for name in ns.only:
        cmd = [sys.executable, __file__, "--one", name, "--log2-envs", *map(str, ns.log2_envs),
               "--autocast", ns.autocast]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        last = proc.stdout.strip().splitlines()[-1:] or ["{}"]
        try:
            row = json.loads(last[0])
        except json.JSONDecodeError:
            row = {"variant": name, "error": f"exit {proc.returncode}, no result"}
        if row.get("error"):
            failed += 1
            print(proc.stderr[-4000:], file=sys.stderr)
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
