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

Every (implementation, N) runs in a fresh process (``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated
from round to round, so that no ratio depends on what ran before in the process; within a process the best of
``--repeats`` timed runs is kept. The table gives the median and the range over rounds, and each ratio to gymnasium
is of medians, with the range of the same-round ratios.

Usage::

    python benchmarks/envs.py                      # cuda when available, else cpu
    python benchmarks/envs.py --device cpu --threads 1 --sizes 64 1024 16384 262144 --rounds 3
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
from _common import Runner, device_sync, numpy_runner, time_steps
from _fresh import Config, add_arguments, compiled_cpu_steps, measure_or_rounds, print_results

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


def runner(name: str, n: int, device: str, warmup: int) -> Runner:
    """The runner of implementation ``name`` (a row label of the table) over ``n`` envs."""
    if name == "gymnasium":
        return gym_runner(n, warmup)
    if name == "envpool":
        return envpool_runner(n, warmup)
    return torch_runner(n, device, fused=name == "torch fused", warmup=warmup,
                        force={"torch numpy": "numpy", "torch dense": "dense"}.get(name),
                        physics_dtype=torch.float32 if name == "torch float32" else torch.float64)


def configurations(args: argparse.Namespace) -> dict[str, Config]:
    """Every (implementation, N), in order (the same in the parent and in each fresh process)."""
    on_cpu = torch.device(args.device).type == "cpu"
    names = ["torch eager"] + (["torch numpy"] if on_cpu else []) + ([] if args.no_fused else ["torch fused"])
    names += (["torch dense"] if on_cpu and not args.no_dense else []) + (["torch float32"] if args.float32 else [])
    if not args.no_gym:
        names += ["gymnasium"] + (["envpool"] if importlib.util.find_spec("envpool") else [])

    def measure(name: str, n: int) -> dict:
        if args.threads:
            torch.set_num_threads(args.threads)
        step, sync = runner(name, n, args.device, warmup=10)
        rate = max(n / time_steps(step, sync, args.min_seconds) for _ in range(args.repeats))
        return {"env_steps_per_s": rate, "threads": torch.get_num_threads()}

    configs = {}
    for n in args.sizes:
        gym = f"gymnasium N={n}"
        for name in names:
            against = (("gymnasium", gym),) if name in RATIOS and not args.no_gym else ()
            configs[f"{name} N={n}"] = Config(lambda name=name, n=n: measure(name, n), against)
    return configs


def main(argv: list[str] | None = None) -> None:
    compiled_cpu_steps()
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 16384, 262144], help="numbers of envs N")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device of the torch envs"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="minimum duration of one timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per process; the best is kept")
    add_arguments(parser)
    parser.add_argument("--no-fused", action="store_true", help="skip the compile=True row")
    parser.add_argument("--no-gym", action="store_true", help="skip gymnasium (and envpool)")
    parser.add_argument("--no-dense", action="store_true", help="skip the forced dense-draw row on the CPU")
    parser.add_argument("--float32", action="store_true", help="add the single-precision physics row")
    args = parser.parse_args(argv)
    configs = configurations(args)
    if args.one is None and CartPole(1, device=args.device).kernel != "jit":  # the numpy kernels are the default
        configs = {name: c for name, c in configs.items() if not name.startswith("torch numpy ")}
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is None:
        return
    first = next(iter(results.values()))[0]
    kernel = CartPole(1, device=args.device).kernel
    print(f"# device {args.device}, torch threads {first['threads']}, default step kernel: {kernel}"
          + ("" if args.no_gym or importlib.util.find_spec("envpool") else "; envpool: not installed"))
    print_results(results, configs, "env_steps_per_s", fmt="{:.3g}")


if __name__ == "__main__":
    main()
