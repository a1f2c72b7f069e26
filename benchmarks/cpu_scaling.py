"""Multi-process scaling of the CPU batcher: k worker processes of gymnasium CartPole-v1, k = 1, 2, 4, 8.

Weak scaling: every worker steps E envs (a list of gymnasium envs, as ``SyncVectorEnv`` does) with the MLP policy
of ``benchmarks/batchers.py``, T = 128 steps per acquisition. For each k, side by side in the same run:

* ``RL_Batcher(n_processes=k)``, the workers placed by the OS;
* the same with worker ``i`` pinned to core ``i + 1`` (``WorkerPlacement(cpus=(i + 1,))``), core 0 left to the
  parent (when the machine has more than k cores);
* the machine's own ceiling: k independent processes, each stepping ``SyncVectorEnv(E)`` with the same policy and
  no batcher, started together (a barrier) and timed over the same number of steps; their summed throughput is
  what k cores give this job on this host (memory bandwidth, shared caches, SMT siblings, frequency).

Columns: env steps/s; the speed-up over one worker of the same kind (target: >= 0.8 k up to 8 workers); the
batcher against the independent processes at the same k (the batcher's own cost); and the batcher's
``timings()`` shares (the workers' agent, env and buffer phases, the parent's ``wait`` and ``gather``), which say
where a loss goes.

Every row runs in a fresh process (``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated from round to
round: medians and ranges, ratios of medians with the range of the same-round ratios.

Run: python benchmarks/cpu_scaling.py [--workers 1 2 4 8] [--envs 32] [--iters 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import gymnasium as gym
import torch
from _fresh import Config, add_arguments, compiled_cpu_steps, measure_or_rounds, print_results

from batchers import MLPAgent, T, bench_batcher, gym_list_env, mlp, timings_note
from rlstruct.batchers import RL_Batcher, WorkerPlacement


@torch.no_grad()
def _independent(n_envs: int, iters: int, barrier, out) -> None:
    """One process of the ceiling: ``SyncVectorEnv(n_envs)`` and the policy, ``iters`` x T steps after a warm-up
    acquisition; puts its seconds in ``out``."""
    torch.set_num_threads(1)
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_envs)])
    model = mlp()
    obs, _ = env.reset(seed=0)

    def run(steps: int) -> None:
        nonlocal obs
        for _ in range(steps):
            logits = model(torch.from_numpy(obs))
            action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
            obs, *_ = env.step(action.numpy())

    run(T)
    barrier.wait()
    t0 = time.perf_counter()
    run(iters * T)
    out.put(time.perf_counter() - t0)
    env.close()


def independent_processes(k: int, n_envs: int, iters: int) -> float:
    """Summed env steps/s of ``k`` independent processes started together (the slowest one's time)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=_independent, args=(n_envs, iters, barrier, out)) for _ in range(k)]
    for p in procs:
        p.start()
    seconds = max(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return k * n_envs * iters * T / seconds


def batcher(k: int, n_envs: int, pinned: bool) -> RL_Batcher:
    placements = [WorkerPlacement("cpu", cpus=(1 + i,)) for i in range(k)] if pinned else None
    return RL_Batcher(T, MLPAgent, {}, gym_list_env, {"n_envs": n_envs}, k, list(range(k)),
                      worker_placements=placements)


def configurations(args: argparse.Namespace) -> dict[str, Config]:
    """Every row of the table, in order (the same in the parent and in each fresh process)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    configs: dict[str, Config] = {}
    first = args.workers[0]

    def run_batcher(k: int, pinned: bool) -> dict:
        with batcher(k, args.envs, pinned) as b:
            sps, tm = bench_batcher(b, args.iters)
        return {"env_steps_per_s": sps, "timings": tm}

    for k in args.workers:
        can_pin = hasattr(os, "sched_setaffinity") and k + 1 <= len(cores) and cores == list(range(len(cores)))
        ceiling = f"independent k={k}"
        configs[ceiling] = Config(lambda k=k: {"env_steps_per_s": independent_processes(k, args.envs, args.iters)},
                                  ((f"k={first}", f"independent k={first}"),) if k != first else ())
        for kind, pinned in (("batcher", False), ("batcher pinned", True)):
            if pinned and not can_pin:
                continue
            against = ((f"k={first}", f"{kind} k={first}"),) if k != first else ()
            configs[f"{kind} k={k}"] = Config(lambda k=k, pinned=pinned: run_batcher(k, pinned),
                                              against + (("independent", ceiling),))
    return configs


def main(argv=None) -> None:
    compiled_cpu_steps()
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--envs", type=int, default=32, help="gymnasium CartPoles per worker")
    p.add_argument("--iters", type=int, default=5, help=f"acquisitions of T={T} steps timed per row")
    add_arguments(p)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    configs = configurations(args)
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        print(f"# gymnasium {gym.__version__}, {args.envs} envs per worker, T={T}")
        print_results(results, configs, "env_steps_per_s", note=timings_note)


if __name__ == "__main__":
    main()
