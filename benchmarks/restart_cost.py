"""The cost of exact restarts: collection env steps/s of a batcher given one seed, with ``restart_workers=0`` (nothing
kept) against ``restart_workers=1`` (each worker keeps its env's state, the carried observation and agent state, the
agent's draw counter and torch's generator at every acquisition's end, in shared memory the batcher owns).

The same batcher, envs (rlstruct's torch simulators on the CPU), policy (a 64x64 actor-critic sampling through
counter-based draws) and work in both; only ``restart_workers`` differs. Nothing fails during the measurement. Every
row runs in a fresh process (``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated from round to round;
the table gives the median and the range, and ``copy_ms`` the mean per acquisition of the workers' ``copy`` phase,
which holds the writes of the kept state.

Usage::

    python benchmarks/restart_cost.py                       # CartPole and MinAtar Breakout, 2 workers
    python benchmarks/restart_cost.py --n-envs 1024 --rounds 5
"""

from __future__ import annotations

import argparse

from _fresh import (
    add_arguments,
    compiled_cpu_steps,
    measure_or_rounds,
    paired_configs,
    print_results,
    timed_acquisitions,
)


def measure(env: str, n_processes: int, restarts: int, n_envs: int, n_timesteps: int, seconds: float) -> dict:
    import torch

    from rlstruct import DictTensor, RL_Batcher
    from rlstruct.algos import create_env, describe_env
    from rlstruct.algos.networks import build_actor_critic
    from rlstruct.algos.policies import create_policy_agent

    torch.set_num_threads(1)
    spec = describe_env(env, "torch", None)
    env_args = {"name": env, "n_envs": n_envs // max(n_processes, 1), "autoreset": True}
    with RL_Batcher(n_timesteps, create_policy_agent, {"spec": spec, "hidden_sizes": (64, 64)}, create_env, env_args,
                    n_processes, 0, agent_seeds=100, agent_info=DictTensor({"stochastic": torch.tensor([True])}),
                    restart_workers=restarts) as b:
        b.update(build_actor_critic(spec, (64, 64)).state_dict())
        b.reset()
        n, dt = timed_acquisitions(b, seconds, before=b.reset_timings)
        copy_s = b.timings()["copy"]
    return {"env_steps_per_s": n * n_envs * n_timesteps / dt, "acquisitions": n, "acquisition_ms": 1000 * dt / n,
            "copy_ms": 1000 * copy_s / n}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "MinAtar/Breakout-v1"])
    p.add_argument("--processes", nargs="+", type=int, default=[2])
    p.add_argument("--n-envs", type=int, default=256, help="envs in all, split over the workers")
    p.add_argument("--n-timesteps", type=int, default=32)
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per configuration")
    add_arguments(p)
    args = p.parse_args(argv)
    compiled_cpu_steps()
    configs = paired_configs(args.envs, args.processes, ("restart_workers=0", "restart_workers=1"), "of nothing kept",
                             lambda env, n_processes, kept: measure(env, n_processes, int(kept), args.n_envs,
                                                                   args.n_timesteps, args.seconds))
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        print_results(results, configs, "env_steps_per_s",
                      note=lambda r: f"{r['acquisition_ms']:.1f} ms an acquisition, copy {r['copy_ms']:.2f} ms")


if __name__ == "__main__":
    main()
