"""Env-only throughput: rlstruct's torch CartPole against gymnasium's vectorized CartPole.

Every row steps ``N`` CartPole-v1 envs with uniformly random actions (drawn on the env's device for
the torch envs, with numpy for gymnasium, inside the timed loop in both cases) and reports env
steps per second (``N * steps / seconds``). Rows:

* ``torch eager``: :class:`rlstruct.envs.CartPole` with ``autoreset=True``, the default step: on the CPU,
  one compiled call per step when numba is installed (``env.kernel == "jit"``), else the numpy kernels.
* ``torch numpy`` (CPU, when the default is the compiled step): the same env forced onto its numpy
  kernels, what it runs without numba (or with ``RLSTRUCT_JIT=0``); the same bits, more calls.
* ``torch fused``: the same env with ``compile=True`` (the torch kernels fused by ``torch.compile``;
  the compilation happens in the warm-up, outside the timed loop).
* ``torch dense`` (CPU only): the eager env forced onto the torch kernels with dense draws (fresh
  initial states for every env, selected with ``torch.where``: what it runs on accelerators); this
  row shows what the CPU path is worth.
* ``torch float32`` (``--float32``): the eager env with ``physics_dtype=torch.float32`` (single-precision
  physics, within float32 rounding of gymnasium's: on the CPU its numpy kernels, the compiled ones are float64).
* ``gymnasium``: ``gym.make_vec("CartPole-v1", N, vectorization_mode="vector_entry_point")``, the
  numpy ``CartPoleVectorEnv`` (next-step auto-reset).
* ``envpool``: ``envpool.make("CartPole-v1", env_type="gymnasium", num_envs=N)``, when importable.

The implementations are measured in turns, ``--repeats`` times, and the best run of each is kept,
so that load from other processes on a shared machine penalises every row alike.

Usage::

    python benchmarks/envs.py                      # cuda when available, else cpu
    python benchmarks/envs.py --device cpu --threads 1 --sizes 64 1024 16384 262144
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch
from _common import Runner, device_sync, numpy_runner, print_table, time_steps

from rlstruct.envs import CartPole
from rlstruct.structures import DictTensor

RATIOS = ("torch eager", "torch numpy", "torch fused", "torch float32")


def torch_runner(
    n: int, device: str, fused: bool, warmup: int, force: str | None = None, physics_dtype: torch.dtype = torch.float64
) -> Runner:
    env = CartPole(n, device=device, seed=0, autoreset=True, compile=fused, physics_dtype=physics_dtype)
    if force == "dense":  # the branch-free draws of every env that accelerators use, forced on this device
        env._use_kernels("torch")
    elif force == "numpy":  # the kernels the CPU runs without numba
        env._use_kernels("numpy")
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        a = torch.randint(0, 2, (n,), device=device, generator=gen)
        env.step(DictTensor._trusted({"action": a}))

    sync = device_sync(device)
    for _ in range(warmup):
        step()
    sync()
    return step, sync


def gym_runner(n: int, warmup: int) -> Runner:
    import gymnasium as gym

    env = gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    return numpy_runner(env, n, warmup)


def envpool_runner(n: int, warmup: int) -> Runner | None:
    try:
        import envpool
    except ImportError:
        return None
    env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=n, batch_size=n, seed=0)
    env.reset()
    return numpy_runner(env, n, warmup)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 16384, 262144], help="numbers of envs N")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device of the torch envs"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="minimum duration of one timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per row, in turns; the best is kept")
    parser.add_argument("--no-fused", action="store_true", help="skip the compile=True row")
    parser.add_argument("--no-gym", action="store_true", help="skip gymnasium (and envpool)")
    parser.add_argument("--no-dense", action="store_true", help="skip the forced dense-draw row on the CPU")
    parser.add_argument("--float32", action="store_true", help="add the single-precision physics row")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"# {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(
        f"# torch {torch.__version__}, {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}, "
        f"device {args.device}"
    )
    on_cpu = torch.device(args.device).type == "cpu"
    kernel = CartPole(1, device=args.device).kernel
    print(f"# default step kernel: {kernel}")
    names = ["torch eager"] + (["torch numpy"] if kernel == "jit" else []) + ([] if args.no_fused else ["torch fused"])
    if on_cpu and not args.no_dense:
        names.append("torch dense")
    if args.float32:
        names.append("torch float32")
    if not args.no_gym:
        names.append("gymnasium")
    header = ["N"] + [f"{n} steps/s" for n in names]
    if "gymnasium" in names:
        header += [f"{n} / gym" for n in names if n in RATIOS]
    rows = []
    envpool_seen = False
    for n in args.sizes:
        warmup = 10
        runners: dict[str, Runner] = {
            "torch eager": torch_runner(n, args.device, fused=False, warmup=warmup)
        }
        if not args.no_fused:
            runners["torch fused"] = torch_runner(n, args.device, fused=True, warmup=warmup)
        if "torch numpy" in names:
            runners["torch numpy"] = torch_runner(n, args.device, fused=False, warmup=warmup, force="numpy")
        if "torch dense" in names:
            runners["torch dense"] = torch_runner(n, args.device, fused=False, warmup=warmup, force="dense")
        if "torch float32" in names:
            runners["torch float32"] = torch_runner(n, args.device, fused=False, warmup=warmup,
                                                    physics_dtype=torch.float32)
        if not args.no_gym:
            runners["gymnasium"] = gym_runner(n, warmup)
            pool = envpool_runner(n, warmup)
            if pool is not None:
                runners["envpool"] = pool
                envpool_seen = True
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, (step, sync) in runners.items():
                rate = n / time_steps(step, sync, args.min_seconds)
                best[name] = max(best.get(name, 0.0), rate)
        row = [str(n)] + [f"{best[k]:.3g}" for k in names]
        if "gymnasium" in best:
            row += [f"{best[k] / best['gymnasium']:.2f}x" for k in names if k in RATIOS]
        if envpool_seen:
            row.append(f"{best['envpool']:.3g}" if "envpool" in best else "-")
        rows.append(row)
    if envpool_seen:
        header.append("envpool steps/s")
    print_table(header, rows)
    if not envpool_seen and not args.no_gym:
        print("# envpool: not installed")


if __name__ == "__main__":
    main()
