"""How long worker processes take to start: an ``RL_Batcher`` whose workers are forked from its fork server against
the same batcher with spawned workers (``RLSTRUCT_START_METHOD=spawn``, how every worker started before the fork
server), beside the multi-process vector envs a user would pick instead: gymnasium's ``AsyncVectorEnv`` (``spawn``,
and Linux's default ``fork``) and Stable-Baselines3's ``SubprocVecEnv`` (``forkserver``, its default).

Each configuration runs in a fresh process: it builds K workers stepping CartPole-v1 (rlstruct's torch simulator for
the batcher, gymnasium's for the peers), takes one batch of steps, closes; then builds them again in the same process.
``first_s`` is the first start to the first batch (the fork server's own start included), ``again_s`` the second
(a program's evaluation batcher, a restarted worker, the next trial of a sweep); ``cpu_s`` the CPU seconds of the
process and every process it started, both starts together (the fork server and the workers it forked included).

Usage::

    python benchmarks/worker_start.py                 # 2 and 4 workers, 3 rounds
    python benchmarks/worker_start.py --workers 8 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

from _fresh import Config, add_arguments, measure_or_rounds, print_results


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _rlstruct(n_workers: int) -> float:
    from _constant_agent import ConstantAgent

    from rlstruct.batchers import RL_Batcher
    from rlstruct.envs import CartPole

    start = time.perf_counter()
    with RL_Batcher(16, ConstantAgent, {}, CartPole, {"n_envs": 4, "autoreset": True}, n_workers,
                    list(range(n_workers))) as batcher:
        batcher.reset()
        batcher.execute()
        batcher.get()
    return time.perf_counter() - start


def _gymnasium(n_workers: int, context: str) -> float:
    import gymnasium as gym
    import numpy as np

    start = time.perf_counter()
    envs = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * n_workers, context=context)
    envs.reset(seed=0)
    for _ in range(16):
        envs.step(np.zeros(n_workers, dtype=np.int64))
    envs.close()
    return time.perf_counter() - start


def _sb3(n_workers: int) -> float:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import SubprocVecEnv

    start = time.perf_counter()
    envs = SubprocVecEnv([lambda: gym.make("CartPole-v1")] * n_workers)
    envs.reset()
    for _ in range(16):
        envs.step(np.zeros(n_workers, dtype=np.int64))
    envs.close()
    return time.perf_counter() - start


def _measure(kind: str, n_workers: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    if kind == "rlstruct spawn":
        os.environ["RLSTRUCT_START_METHOD"] = "spawn"
    run = {
        "rlstruct fork server": lambda: _rlstruct(n_workers),
        "rlstruct spawn": lambda: _rlstruct(n_workers),
        "gymnasium AsyncVectorEnv spawn": lambda: _gymnasium(n_workers, "spawn"),
        "gymnasium AsyncVectorEnv fork": lambda: _gymnasium(n_workers, "fork"),
        "SB3 SubprocVecEnv forkserver": lambda: _sb3(n_workers),
    }[kind]
    cpu = _cpu_s()
    first = run()
    again = run()
    from rlstruct.batchers._lifecycle import reap_fork_server

    reap_fork_server(10.0)  # its CPU seconds, and those of the workers it reaped, are this process's children's now
    return {"first_s": first, "again_s": again, "cpu_s": _cpu_s() - cpu}


KINDS = ("rlstruct fork server", "rlstruct spawn", "gymnasium AsyncVectorEnv spawn", "gymnasium AsyncVectorEnv fork",
         "SB3 SubprocVecEnv forkserver")


def configs(workers: list[int]) -> dict[str, Config]:
    out = {}
    for k in workers:
        for kind in KINDS:
            against = () if kind == KINDS[0] else (("of the fork server's", f"{KINDS[0]}, {k} workers"),)
            out[f"{kind}, {k} workers"] = Config(lambda kind=kind, k=k: _measure(kind, k), against=against)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    add_arguments(parser)
    args = parser.parse_args()
    table = configs(args.workers)
    results = measure_or_rounds(__file__, table, args)
    if results is None:
        return
    for key, header in (("first_s", "first start to first batch, s"), ("again_s", "second start, s"),
                        ("cpu_s", "CPU s, both starts")):
        print_results(results, table, key, header, fmt="{:.2f}")


if __name__ == "__main__":
    main()
