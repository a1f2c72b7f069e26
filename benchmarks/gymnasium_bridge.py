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

The implementations are measured in turns, ``--repeats`` times, and the best run of each is kept, so that
load from other processes penalises every column alike.

Usage::

    python benchmarks/gymnasium_bridge.py                       # cuda when available, else cpu
    python benchmarks/gymnasium_bridge.py --device cpu --sizes 64 1024 16384
"""

from __future__ import annotations

import argparse
import platform
import sys

import gymnasium as gym
import numpy as np
import torch
from _common import Runner, device_sync, print_table, time_steps

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 16384], help="numbers of envs N")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device of the torch CartPole"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="minimum duration of one timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell, in turns; the best is kept")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"# {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(
        f"# torch {torch.__version__}, gymnasium {gym.__version__}, numpy {np.__version__}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}, "
        f"torch threads {torch.get_num_threads()}, device {args.device}"
    )
    names = ["bridge torch", "bridge numpy", "gymnasium", "rlstruct VecEnv"]
    header = ["N"] + [f"{k} steps/s" for k in names] + ["torch / gym", "numpy / gym", "bridge torch / VecEnv"]
    rows = []
    for n in args.sizes:
        warmup = 10
        runners = {
            "bridge torch": bridge_runner(n, args.device, "torch", warmup),
            "bridge numpy": bridge_runner(n, args.device, "numpy", warmup),
            "gymnasium": gym_runner(n, warmup),
            "rlstruct VecEnv": vecenv_runner(n, args.device, warmup),
        }
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, (step, sync) in runners.items():
                best[name] = max(best.get(name, 0.0), n / time_steps(step, sync, args.min_seconds))
        rows.append(
            [str(n)]
            + [f"{best[k]:.3g}" for k in names]
            + [
                f"{best['bridge torch'] / best['gymnasium']:.2f}x",
                f"{best['bridge numpy'] / best['gymnasium']:.2f}x",
                f"{best['bridge torch'] / best['rlstruct VecEnv']:.2f}",
            ]
        )
    print_table(header, rows)


if __name__ == "__main__":
    main()
