"""RayBatcher against RL_Batcher on the same env and agent, same run: Ray's overhead per collection.

RayBatcher runs 2 actors on a local Ray cluster (loopback only), each hosting an in-process RL_Batcher;
RL_Batcher runs 2 worker processes. Both step the torch CartPole (auto-reset) with the policy agent of
rlstruct.algos.networks (64-64 actor-critic), N envs per actor/worker and T steps per collection, and every
collection is ``update`` (fresh weights) + ``execute`` + ``get``, as in a training loop. The two are timed in turns in
the same run; the overhead is the difference of the median seconds per collection (and of the fastest
ones); the tiny configuration (N=16, T=8) shows the fixed cost.

Run: python benchmarks/ray_batcher.py [--iters 20] [--sizes 16x8 1024x64]
"""

from __future__ import annotations

import argparse
import os
import time

# Read by Ray when it is imported: without it a local cluster listens on every interface.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from rlstruct.algos import EnvSpec  # noqa: E402
from rlstruct.algos._train.session import seeded_model  # noqa: E402
from rlstruct.algos.networks import ActorCritic  # noqa: E402
from rlstruct.algos.policies import create_policy_agent  # noqa: E402
from rlstruct.batchers import RayBatcher, RL_Batcher  # noqa: E402
from rlstruct.devices import cpu_state_dict  # noqa: E402
from rlstruct.envs import make_env  # noqa: E402

AGENT = {"spec": EnvSpec((4,), "float32", 2, 500), "hidden_sizes": (64, 64)}


def env_args(n_envs: int) -> dict:
    return {"name": "CartPole-v1", "n_envs": n_envs, "autoreset": True}


def collect(batcher, weights) -> float:
    t0 = time.perf_counter()
    batcher.update(weights)
    batcher.execute()
    batcher.get()
    return time.perf_counter() - t0


def time_pair(local, remote, iters: int) -> tuple[list[float], list[float]]:
    """Seconds per update + execute + get of each batcher, measured in turns (so that a change in the
    machine's load hits both), after two warm-up collections each; sorted."""
    weights = cpu_state_dict(seeded_model(1, ActorCritic, 4, 2, (64, 64)))
    for b in (local, remote):
        b.reset()
        for _ in range(2):
            collect(b, weights)
        b.reset_timings()
    laps: tuple[list[float], list[float]] = ([], [])
    for _ in range(iters):
        laps[0].append(collect(local, weights))
        laps[1].append(collect(remote, weights))
    return sorted(laps[0]), sorted(laps[1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20, help="timed collections per configuration")
    p.add_argument("--sizes", nargs="*", default=["16x8", "1024x64"], help="NxT: envs per actor/worker x steps")
    args = p.parse_args(argv)
    import ray

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    rows = []
    try:
        for size in args.sizes:
            n, T = (int(x) for x in size.split("x"))
            with RL_Batcher(T, create_policy_agent, AGENT, make_env, env_args(n), 2, [0, 1]) as local, \
                    RayBatcher(T, create_policy_agent, AGENT, make_env, env_args(n), 0, [0, 1], n_actors=2,
                               num_cpus=1) as remote:
                lap_local, lap_ray = time_pair(local, remote, args.iters)
                tm = remote.timings()
            local_med, local_min = lap_local[len(lap_local) // 2], lap_local[0]
            ray_med, ray_min = lap_ray[len(lap_ray) // 2], lap_ray[0]
            steps = 2 * n * T
            rows.append((n, T, local_med, ray_med, ray_med - local_med, ray_min - local_min, steps / local_med,
                         steps / ray_med, tm))
            print(f"N={n} T={T}: RL_Batcher {1e3 * local_med:.2f} ms, RayBatcher {1e3 * ray_med:.2f} ms; RayBatcher "
                  f"timings {({k: round(v, 4) for k, v in tm.items()})}", flush=True)
    finally:
        ray.shutdown()
    print(f"\n# torch {torch.__version__}, ray {ray.__version__}, {args.iters} timed collections per cell")
    print("| envs per actor/worker x T | RL_Batcher 2 workers (ms/collection) | RayBatcher 2 actors (ms/collection) "
          "| overhead per collection, median (min) | env steps/s RL_Batcher | env steps/s RayBatcher |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, T, lm, rm, over, over_min, lsps, rsps, _tm in rows:
        print(f"| {n} x {T} | {1e3 * lm:.2f} | {1e3 * rm:.2f} | {1e3 * over:+.2f} ms ({1e3 * over_min:+.2f} ms) "
              f"| {lsps:,.0f} | {rsps:,.0f} |")


if __name__ == "__main__":
    main()
