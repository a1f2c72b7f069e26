"""The cost of counter-based sampling: collection env steps/s of the algorithms' policy agent drawing from a
per-process ``torch.Generator`` (a batcher given one seed per worker) against counter-based draws keyed by
``(seed, env, step)`` (a batcher given one seed), in process and with worker processes.

The same batcher, envs (rlstruct's CartPole on the CPU, or Pendulum for the Gaussian's draws), policy (a 64x64
actor-critic) and work in both; only the source of the agent's draws differs. Every row runs in a fresh process
(``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated from round to round; the table gives the median
and the range.

Usage::

    python benchmarks/counter_noise.py                      # CartPole and Pendulum, in process and 2 workers
    python benchmarks/counter_noise.py --n-envs 256 --rounds 5
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


def measure(env: str, n_processes: int, counter: bool, n_envs: int, n_timesteps: int, seconds: float) -> dict:
    import torch

    from rlstruct import DictTensor, RL_Batcher
    from rlstruct.algos import create_env, describe_env
    from rlstruct.algos.networks import build_actor_critic
    from rlstruct.algos.policies import create_policy_agent

    torch.set_num_threads(1)
    spec = describe_env(env, "torch", None)
    n_workers = max(n_processes, 1)
    env_args = {"name": env, "n_envs": n_envs // n_workers, "autoreset": True}
    seeds = 0 if counter else list(range(n_workers))
    agent_seeds = 100 if counter else [100 + k for k in range(n_workers)]
    with RL_Batcher(n_timesteps, create_policy_agent, {"spec": spec, "hidden_sizes": (64, 64)}, create_env, env_args,
                    n_processes, seeds, agent_seeds=agent_seeds,
                    agent_info=DictTensor({"stochastic": torch.tensor([True])})) as b:
        b.update(build_actor_critic(spec, (64, 64)).state_dict())
        b.reset()
        n, dt = timed_acquisitions(b, seconds)
    return {"env_steps_per_s": n * n_envs * n_timesteps / dt, "acquisitions": n}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "Pendulum-v1"])
    p.add_argument("--processes", nargs="+", type=int, default=[0, 2])
    p.add_argument("--n-envs", type=int, default=64, help="envs in all, split over the workers")
    p.add_argument("--n-timesteps", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per configuration")
    add_arguments(p)
    args = p.parse_args(argv)
    compiled_cpu_steps()
    configs = paired_configs(args.envs, args.processes, ("generator", "counter"), "of the generator's",
                             lambda env, n_processes, counter: measure(env, n_processes, counter, args.n_envs,
                                                                      args.n_timesteps, args.seconds))
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        print_results(results, configs, "env_steps_per_s")


if __name__ == "__main__":
    main()
