"""What data-parallel learners cost and give on this machine: train-inclusive env steps/s of 1 and 2 ranks, and
the all-reduce of the gradients against the update's compute.

Two parts, every configuration in a fresh process (``benchmarks/_fresh.py``), the order rotated over rounds:

* **Training**: ``rlstruct train ppo --env CartPole-v1`` over a fixed budget (no target: every run does the same
  iterations), as 1 process of 8 envs, 1 process of 16 envs (the global batch of 2 ranks), and ``torchrun`` 2 ranks
  of 8 envs. Env steps/s counts the training clock (``wall_time_s - startup_s`` of ``summary.json``), collection,
  updates and evaluations included.
* **All-reduce**: 2 ``gloo`` ranks on loopback; for the 64-64 MLP (CartPole), the 256-256 MLP (Hopper-v5's
  observation) and the Nature CNN (Atari 84x84x4), the forward and backward of a PPO-sized minibatch, against the
  all-reduce of its gradients as one flattened buffer (what ``average_gradients`` issues
  once per backward) and as one all-reduce per tensor (what it issued before, and DDP without buckets).

Usage::

    python benchmarks/distributed.py [--rounds 3] [--budget 131072] [--parts training,allreduce]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fresh import machine, med_range, rotated_rounds  # noqa: E402

TRAINING = {
    "1 process, 8 envs": (1, 8),
    "1 process, 16 envs": (1, 16),
    "torchrun 2 ranks x 8 envs": (2, 8),
}
# name -> (env id, backend, hidden sizes, minibatch rows): PPO's minibatches (CartPole: 8 envs x 128 steps / 2;
# Hopper: CleanRL's 2,048 / 32; Atari: CleanRL's 8 x 128 / 4)
MODELS = {
    "MLP 64-64 (CartPole-v1)": ("CartPole-v1", "torch", (64, 64), 512),
    "MLP 256-256 (Hopper-v5)": ("Hopper-v5", "gymnasium", (256, 256), 64),
    "Nature CNN (ALE/Pong-v5)": ("ALE/Pong-v5", "ale", (512,), 256),
}
REPEATS = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_training(name: str, budget: int) -> dict:
    """One training run of ``name`` in its own process(es); its env steps/s over the training clock."""
    ranks, n_envs = TRAINING[name]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    flags = ["train", "ppo", "--env", "CartPole-v1", "--preset", "none", "--no-stop-at-reward-threshold",
             "--max-env-steps", str(budget), "--n-envs", str(n_envs), "--eval-every", "10", "--no-progress",
             "--no-tensorboard"]
    with tempfile.TemporaryDirectory() as tmp:
        if ranks == 1:
            cmd = [str(bin_dir / "rlstruct"), *flags, "--logdir", "run"]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port",
                   str(_free_port()), "--no-python", "rlstruct", *flags, "--logdir", "run"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    clock = summary["wall_time_s"] - summary["startup_s"]
    return {"env_steps": summary["env_steps"], "training_s": clock, "steps_per_s": summary["env_steps"] / clock,
            "eval_return": summary["eval_return"], "world_size": summary["world_size"]}


def _allreduce_rank(rank: int, port: int, name: str, out) -> None:
    import torch
    import torch.distributed as dist

    from rlstruct.algos import describe_env
    from rlstruct.algos.networks import build_actor_critic

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    env_id, backend, hidden, rows = MODELS[name]
    spec = describe_env(env_id, backend, None)
    torch.manual_seed(0)
    model = build_actor_critic(spec, hidden)
    if spec.obs_dtype == "uint8":
        frame = torch.randint(0, 256, (rows, *spec.obs_shape), dtype=torch.uint8)
    else:
        frame = torch.randn(rows, *spec.obs_shape)

    def backward() -> None:
        model.zero_grad(set_to_none=True)
        dist_ = model.policy(frame)
        action = dist_.sample(torch.Generator().manual_seed(0))
        (-dist_.log_prob(action).mean() + model.value(frame).pow(2).mean()).backward()

    grads = [p for p in model.parameters()]
    backward()
    timings = {"compute": [], "per_tensor": [], "flat": []}
    for _ in range(REPEATS):
        dist.barrier()
        t = time.perf_counter()
        backward()
        timings["compute"].append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter()
        for p in grads:
            dist.all_reduce(p.grad)
        timings["per_tensor"].append(time.perf_counter() - t)
        flat = torch.cat([p.grad.reshape(-1) for p in grads])
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(flat)
        timings["flat"].append(time.perf_counter() - t)
    if rank == 0:
        out.update({k: statistics.median(v) * 1e3 for k, v in timings.items()})
        out.update({"parameters": sum(p.numel() for p in grads), "tensors": len(grads), "rows": rows})
    dist.destroy_process_group()


def one_allreduce(name: str) -> dict:
    """The medians (ms) of one forward-backward and of the gradients' all-reduce, 2 gloo ranks."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_allreduce_rank, args=(_free_port(), name, out), nprocs=2, join=True)
        return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=131_072, help="env steps of each training run")
    parser.add_argument("--parts", default="training,allreduce")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        result = one_training(args.one, args.budget) if args.one in TRAINING else one_allreduce(args.one)
        print(json.dumps(result))
        return
    parts = args.parts.split(",")
    load = os.getloadavg()
    print(f"python benchmarks/distributed.py --rounds {args.rounds} --budget {args.budget} --parts {args.parts}")
    print(f"# {machine()}, load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    script = str(Path(__file__).resolve())
    if "training" in parts:
        results = rotated_rounds(script, list(TRAINING), args.rounds, ["--budget", str(args.budget)])
        base = statistics.median(r["steps_per_s"] for r in results["1 process, 8 envs"])
        print("\n| PPO CartPole-v1, train-inclusive | env steps/s | vs 1 process of 8 envs | final return |")
        print("|:--|--:|--:|--:|")
        for name, runs in results.items():
            rates = [r["steps_per_s"] for r in runs]
            print(f"| {name} | {med_range(rates)} | {statistics.median(rates) / base:.2f}x | "
                  f"{med_range([r['eval_return'] for r in runs], '{:.0f}')} |")
    if "allreduce" in parts:
        results = rotated_rounds(script, list(MODELS), args.rounds)
        print("\n| model (minibatch rows) | parameters (tensors) | forward+backward (ms) | all-reduce, one buffer (ms) "
              "| one per tensor (ms) | one buffer / compute |")
        print("|:--|--:|--:|--:|--:|--:|")
        for name, runs in results.items():
            r0 = runs[0]
            compute = [r["compute"] for r in runs]
            per_tensor = [r["per_tensor"] for r in runs]
            flat = [r["flat"] for r in runs]
            print(f"| {name} ({r0['rows']}) | {r0['parameters']:,} ({r0['tensors']}) | {med_range(compute, '{:.2f}')} "
                  f"| {med_range(flat, '{:.2f}')} | {med_range(per_tensor, '{:.2f}')} | "
                  f"{statistics.median(flat) / statistics.median(compute):.2f} |")
    end = os.getloadavg()
    print(f"\n# load average at end {end[0]:.1f} {end[1]:.1f} {end[2]:.1f}")


if __name__ == "__main__":
    main()
