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
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from rlstruct.envs import CartPole, to_gymnasium
from rlstruct.structures import DictTensor

Runner = tuple[Callable[[], None], Callable[[], None]]


def _time_steps(step: Callable[[], None], sync: Callable[[], None], min_seconds: float) -> float:
    """Seconds per call of ``step``, over at least ``min_seconds`` (growing the number of calls)."""
    n = 4
    while True:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return dt / n
        n *= 2 if dt <= 0 else max(2, min(16, int(1.5 * min_seconds / dt) + 1))


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


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
    return step, _sync(device)


def vecenv_runner(n: int, device: str, warmup: int) -> Runner:
    env = CartPole(n, device=device, seed=0, autoreset=True)
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        env.step(DictTensor._trusted({"action": torch.randint(0, 2, (n,), device=device, generator=gen)}))

    for _ in range(warmup):
        step()
    return step, _sync(device)


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
        f"{platform.python_implementation()} {platform.python_version()}, {platform.processor() or platform.machine()}, "
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
                best[name] = max(best.get(name, 0.0), n / _time_steps(step, sync, args.min_seconds))
        rows.append(
            [str(n)]
            + [f"{best[k]:.3g}" for k in names]
            + [
                f"{best['bridge torch'] / best['gymnasium']:.2f}x",
                f"{best['bridge numpy'] / best['gymnasium']:.2f}x",
                f"{best['bridge torch'] / best['rlstruct VecEnv']:.2f}",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.rjust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
