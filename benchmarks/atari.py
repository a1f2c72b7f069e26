"""Atari throughput: the CNN policy stepping Breakout through RL_Batcher beside the same loop on ale-py directly.

Both sides run the same Nature-DQN actor-critic (``EncoderActorCritic`` on uint8 ``[4, 84, 84]`` frames, sampled
actions) on ale-py's ``AtariVectorEnv`` (84x84 grayscale, frameskip 4, 4 stacked frames, its own thread pool), in
this process, on the CPU, in the same run:

* **rlstruct**: ``RL_Batcher(n_timesteps, create_policy_agent, ..., make_env(backend="ale", autoreset=True))``,
  ``execute(); get()`` per acquisition (frames written into the batcher's uint8 buffer, copied out by ``get``);
* **ale-py loop**: ``obs = vec.reset(); loop: actions = model.policy(torch.from_numpy(obs)).sample(generator);
  obs = vec.step(actions)``: the least a training loop must do, storing nothing.

Reported: agent steps/s and emulator frames/s (x4, the frameskip), and rlstruct's share of the bare loop.

Usage::

    python benchmarks/atari.py --envs 8,32 --steps 64 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from _common import print_table

from rlstruct import DictTensor, RL_Batcher
from rlstruct.algos import create_env, describe_env
from rlstruct.algos.policies import create_policy_agent

GAME = "ALE/Breakout-v5"
FRAMESKIP = 4


def rlstruct_rate(spec, weights, n_envs: int, steps: int, repeats: int) -> float:
    agent_args = {"spec": spec, "hidden_sizes": (64,), "device": "cpu"}
    env_args = {"name": GAME, "n_envs": n_envs, "autoreset": True, "backend": "ale"}
    with RL_Batcher(steps, create_policy_agent, agent_args, create_env, env_args, 0, [0],
                    agent_info=DictTensor({"stochastic": torch.tensor([True])}), agent_seeds=[1]) as batcher:
        batcher.update(weights)
        batcher.reset()
        batcher.execute()
        batcher.get()  # warm-up acquisition
        best = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            batcher.execute()
            traj, _ = batcher.get()
            best = max(best, n_envs * steps / (time.perf_counter() - t0))
        assert traj.trajectories["observation/frame"].dtype == torch.uint8
    return best


def ale_rate(model, n_envs: int, steps: int, repeats: int) -> float:
    from ale_py.vector_env import AtariVectorEnv

    vec = AtariVectorEnv("breakout", n_envs)
    generator = torch.Generator().manual_seed(1)
    try:
        obs, _ = vec.reset(seed=0)
        best = 0.0
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            for _ in range(steps):
                with torch.no_grad():
                    actions = model.policy(torch.from_numpy(obs)).sample(generator)
                obs, *_ = vec.step(actions.numpy().astype(np.int64))
            if r > 0:  # the first round is the warm-up
                best = max(best, n_envs * steps / (time.perf_counter() - t0))
    finally:
        vec.close()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="8,32", help="comma-separated env counts (default: 8,32)")
    parser.add_argument("--steps", type=int, default=64, help="steps per acquisition / timed round (default: 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds, best kept (default: 3)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    print(f"# torch {torch.__version__}, CPython {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} torch threads, load average {load}")
    spec = describe_env(GAME, "ale", 10_000)
    torch.manual_seed(0)
    model = create_policy_agent(spec, (64,)).model
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rows = []
    for n in (int(x) for x in args.envs.split(",")):
        ours = rlstruct_rate(spec, weights, n, args.steps, args.repeats)
        bare = ale_rate(model, n, args.steps, args.repeats)
        rows.append([str(n), f"{ours:,.0f}", f"{ours * FRAMESKIP:,.0f}", f"{bare:,.0f}", f"{bare * FRAMESKIP:,.0f}",
                     f"{ours / bare:.2f}"])
    print_table(["envs", "rlstruct steps/s", "rlstruct frames/s", "ale-py loop steps/s", "ale-py loop frames/s",
                 "rlstruct / loop"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
