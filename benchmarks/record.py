"""Env steps written per second to a Minari dataset: ``rlstruct.algos.datasets.record`` (a batcher, episodes cut
from its acquisitions and written into Minari's HDF5 storage as they end) against Minari's own ``DataCollector`` (one
gymnasium env wrapped, stepped one step at a time, the dataset created at the end), the same uniformly random policy
and the same number of episodes, each configuration in a fresh process::

    python benchmarks/record.py --steps 100000 --rounds 3

Both write Minari's HDF5 storage, observations unencoded (``jpeg_encoding=False``). The figure is steps written over
the whole recording's seconds (the dataset created, its metadata written), from the first env built on.
``DataCollector`` steps gymnasium's env (CartPole, and minatar's own Breakout through gymnasium); ``record`` steps
rlstruct's torch simulators of the same games (the ``torch`` rows) or gymnasium's envs (``gymnasium`` rows). What each
side loads once per process is loaded before the clock: the modules it imports, and for the ``torch`` rows the
simulator's compiled CPU kernels (numba's cache), which then step from the first step; the seconds that load took are
reported beside the figure (``kernel_load_s``). Results and the machine: docs/benchmarks/datasets.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from _fresh import Config, add_arguments, compiled_cpu_steps, measure_or_rounds, print_results, selected

ENVS = ("CartPole-v1", "MinAtar/Breakout-v1")
#: a random policy's mean episode length (1,000 episodes of record, seed 0): the episodes that make ``--steps``
MEAN_LENGTH = {"CartPole-v1": 21.8, "MinAtar/Breakout-v1": 10.1}


def _episodes(env: str, steps: int) -> int:
    return max(1, round(steps / MEAN_LENGTH[env]))


def data_collector(env: str, steps: int) -> dict[str, Any]:
    import gymnasium as gym
    import jax.tree_util  # noqa: F401  (what DataCollector imports at its first step: imported before the clock)
    import minari

    import rlstruct.envs  # noqa: F401  (registers the MinAtar ids)

    episodes = _episodes(env, steps)
    t0 = time.perf_counter()
    collector = minari.DataCollector(gym.make(env), jpeg_encoding=False)
    collector.action_space.seed(0)
    # Seeded by hand: DataCollector's own seeds are 64-bit, which minatar's env refuses.
    collector.reset(seed=0)
    done = 0
    while done < episodes:
        _, _, terminated, truncated, _ = collector.step(collector.action_space.sample())
        if terminated or truncated:
            done += 1
            collector.reset(seed=done)
    dataset = collector.create_dataset(dataset_id="bench/collector-v0", algorithm_name="random", author="bench",
                                       author_email="bench", code_permalink="bench", description="bench")
    seconds = time.perf_counter() - t0
    written = dataset.total_steps
    collector.close()
    return {"steps_per_s": written / seconds, "steps": written, "episodes": dataset.total_episodes,
            "seconds": seconds}


def _load_kernels(env: str, n_envs: int) -> float:
    """Steps the torch simulator of ``env`` so that its compiled CPU kernels load (once per process); returns the
    seconds that took."""
    import torch

    from rlstruct.algos import create_env
    from rlstruct.structures import DictTensor

    compiled_cpu_steps()
    t0 = time.perf_counter()
    sim = create_env(env, n_envs, seed=0, autoreset=True, backend="torch")
    sim.reset()
    sim.step(DictTensor({"action": torch.zeros(n_envs, dtype=torch.int64)}))
    sim.close()
    return time.perf_counter() - t0


def rlstruct_record(env: str, steps: int, backend: str, n_envs: int) -> dict[str, Any]:
    import h5py  # noqa: F401  (what record imports at its start: imported before the clock, as for the peer)
    import minari  # noqa: F401
    import numba  # noqa: F401  (what the torch simulators import when they load their compiled kernels)

    from rlstruct.algos import create_env
    from rlstruct.algos.datasets import record

    kernel_load_s = _load_kernels(env, n_envs) if backend == "torch" else 0.0
    episodes = _episodes(env, steps)
    t0 = time.perf_counter()
    result = record("bench/record-v0", None, None, create_env, {"name": env, "n_envs": n_envs, "backend": backend},
                    episodes=episodes, seeds=0, agent_seeds=0, n_timesteps=64)
    seconds = time.perf_counter() - t0
    return {"steps_per_s": result.steps / seconds, "steps": result.steps, "episodes": result.episodes,
            "seconds": seconds, "kernel_load_s": kernel_load_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=100_000, help="env steps to write, about (default: 100,000)")
    parser.add_argument("--n-envs", type=int, default=64, help="envs of record's batcher (default: 64)")
    parser.add_argument("--only", default="", help="comma-separated configurations to run (default: all)")
    add_arguments(parser)
    args = parser.parse_args()
    if args.one is not None:  # each configuration writes into a folder of its own
        os.environ["MINARI_DATASETS_PATH"] = tempfile.mkdtemp(prefix="rlstruct-bench-")
    configs: dict[str, Config] = {}
    for env in ENVS:
        peer = f"{env} DataCollector"
        configs[peer] = Config(lambda env=env: data_collector(env, args.steps))
        for backend in ("torch", "gymnasium"):
            configs[f"{env} record {backend}"] = Config(
                lambda env=env, backend=backend: rlstruct_record(env, args.steps, backend, args.n_envs),
                against=(("vs DataCollector", peer),))
    configs = selected(configs, args.only)
    results = measure_or_rounds(__file__, configs, args)
    if results is not None:
        print_results(results, configs, "steps_per_s",
                      note=lambda run: f"{run['steps']:,} steps, {run['episodes']:,} episodes, {run['seconds']:.1f} s"
                                       + (f", kernels {run['kernel_load_s']:.1f} s before" if run.get("kernel_load_s")
                                          else ""))


if __name__ == "__main__":
    main()
