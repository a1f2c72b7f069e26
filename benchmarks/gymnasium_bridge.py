"""The gymnasium bridge's throughput: a plain gymnasium loop over rlstruct's torch CartPole vs gymnasium's own.

Every row runs ``obs, rewards, terminations, truncations, infos = envs.step(actions)`` on ``N`` CartPole-v1
envs with uniformly random actions drawn inside the timed loop (``torch.randint`` on the env's device for
the torch output, numpy's generator otherwise), and reports env steps per second (``N * steps / seconds``).
Columns:

* ``bridge torch``: ``to_gymnasium(CartPole(N, autoreset=True), output="torch")``: tensors in and out.
* ``bridge numpy``: the same with ``output="numpy"``: numpy arrays in and out (float64 rewards), and
  gymnasium's per-env ``infos["final_obs"]`` objects on the steps where envs finish.
* ``gymnasium``: ``gym.make_vec("CartPole-v1", N, vectorization_mode="vector_entry_point")``, gymnasium's
  numpy ``CartPoleVectorEnv`` (next-step auto-reset, no final observations in its infos).
* ``rlstruct VecEnv``: the simulator stepped directly (``env.step(DictTensor)``), without the bridge.

Every (implementation, N) runs in a fresh process (``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated
from round to round; within a process the best of ``--repeats`` timed runs is kept. The table gives the median and
the range over rounds, and ratios of medians with the range of the same-round ratios.

Usage::

    python benchmarks/gymnasium_bridge.py                       # cuda when available, else cpu
    python benchmarks/gymnasium_bridge.py --device cpu --sizes 64 1024 16384 --rounds 3
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from _common import Runner, device_sync, time_steps
from _fresh import Config, add_arguments, compiled_cpu_steps, measure_or_rounds, print_results

from rlstruct.envs import CartPole, to_gymnasium
from rlstruct.structures import DictTensor


def bridge_runner(n: int, device: str, output: str, warmup: int) -> Runner:
    envs = to_gymnasium(CartPole(n, device=device, seed=0, autoreset=True), output=output)
    envs.reset(seed=0)
    if output == "torch":
        gen = torch.Generator(device=device).manual_seed(0)

        def step() -> None:
            obs, rewards, terminations, truncations, infos = envs.step(
                torch.randint(0, 2, (n,), device=device, generator=gen)
            )

    else:
        rng = np.random.default_rng(0)

        def step() -> None:
            obs, rewards, terminations, truncations, infos = envs.step(rng.integers(0, 2, n))

    for _ in range(warmup):
        step()
    return step, device_sync(device)


def vecenv_runner(n: int, device: str, warmup: int) -> Runner:
    env = CartPole(n, device=device, seed=0, autoreset=True)
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        env.step(DictTensor._trusted({"action": torch.randint(0, 2, (n,), device=device, generator=gen)}))

    for _ in range(warmup):
        step()
    return step, device_sync(device)


def gym_runner(n: int, warmup: int) -> Runner:
    envs = gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")
    envs.reset(seed=0)
    rng = np.random.default_rng(0)

    def step() -> None:
        obs, rewards, terminations, truncations, infos = envs.step(rng.integers(0, 2, n))

    for _ in range(warmup):
        step()
    return step, lambda: None


RUNNERS = {
    "bridge torch": lambda n, device, warmup: bridge_runner(n, device, "torch", warmup),
    "bridge numpy": lambda n, device, warmup: bridge_runner(n, device, "numpy", warmup),
    "gymnasium": lambda n, device, warmup: gym_runner(n, warmup),
    "rlstruct VecEnv": vecenv_runner,
}


def configurations(args: argparse.Namespace) -> dict[str, Config]:
    """Every (implementation, N), in order (the same in the parent and in each fresh process)."""
    def measure(name: str, n: int) -> dict:
        if args.threads:
            torch.set_num_threads(args.threads)
        step, sync = RUNNERS[name](n, args.device, 10)
        rate = max(n / time_steps(step, sync, args.min_seconds) for _ in range(args.repeats))
        return {"env_steps_per_s": rate, "threads": torch.get_num_threads()}

    configs = {}
    for n in args.sizes:
        against = {"bridge torch": (("gymnasium", f"gymnasium N={n}"), ("VecEnv", f"rlstruct VecEnv N={n}")),
                   "bridge numpy": (("gymnasium", f"gymnasium N={n}"),)}
        for name in RUNNERS:
            configs[f"{name} N={n}"] = Config(lambda name=name, n=n: measure(name, n), against.get(name, ()))
    return configs


def main(argv: list[str] | None = None) -> None:
    compiled_cpu_steps()
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 16384], help="numbers of envs N")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device of the torch CartPole"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="minimum duration of one timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per process; the best is kept")
    add_arguments(parser)
    args = parser.parse_args(argv)
    configs = configurations(args)
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        threads = next(iter(results.values()))[0]["threads"]
        print(f"# gymnasium {gym.__version__}, numpy {np.__version__}, torch threads {threads}, device {args.device}")
        print_results(results, configs, "env_steps_per_s", fmt="{:.3g}")


if __name__ == "__main__":
    main()
