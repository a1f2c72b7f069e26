"""MinAtar throughput: rlstruct's torch simulators against the peers a user would pick, each in a fresh process.

(Not ``minatar.py``: a script of that name would shadow the minatar package it measures.)

Every configuration plays a uniform random policy with auto-reset and stores what a learner would read (frames,
rewards, dones) for ``--steps`` steps of ``--envs`` envs, and reports env steps per second:

* ``rlstruct torch``: ``make_env("MinAtar/<Game>-v1", N, backend="torch", autoreset=True)`` stepped with
  ``torch.randint`` actions, each step's frame (``bool``), reward and done copied into a preallocated
  ``[T, N, ...]`` buffer (zero-filled beforehand: its pages exist, as a reused buffer's do): what a CPU user
  gets, the compiled CPU step (``kernel`` "jit": numba installed, the game has a compiled step) from the first
  step.
* ``rlstruct torch, eager``: the same with ``RLSTRUCT_JIT=0``: the torch step, op by op (``kernel`` "torch").
* ``rlstruct torch step_into``: the env as ``RL_Batcher`` drives it, ``env.step_into(action, next_t, running_t+1)``
  into rows of zero-filled ``[T + 1, N, ...]`` buffers of every observation key (with the compiled step the
  kernel writes there; no observation tensors, no copies).
* ``gymnax``: gymnax's own ``<Game>-MinAtar`` (``jax.jit`` of a ``lax.scan`` over ``jax.vmap`` of ``env.step``,
  its auto-reset, actions drawn in JAX); the scan stacks the observations (``float32``) as its storage. The first
  call (compilation) is not timed.
* ``rlstruct gymnax adapter``: ``make_env("<Game>-MinAtar", N, backend="gymnax", autoreset=True)``, stepped and
  stored as ``rlstruct torch``.
* ``reference``: minatar's gymnasium ids in ``gymnasium.vector.SyncVectorEnv`` (``--ref-envs`` envs,
  ``--ref-steps`` steps: it is slow), numpy random actions and a numpy buffer.
* with ``--device cuda``: the torch simulator in ``RL_Batcher(n_processes=0, cuda_graph=True)`` with a random
  agent on the GPU (``--gpu-envs`` envs, ``T=--gpu-steps`` steps per acquisition), frames counted as env steps.

``--cores K`` pins each process to K cores with K compute threads (torch's and XLA's), so that every configuration
gets the same share of a shared machine.

Run: python benchmarks/minatar_speed.py [--game Breakout] [--envs 4096] [--steps 100] [--rounds 3] [--cores 1]
     [--device cuda --gpu-envs 1048576]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _fresh import Config, add_arguments, compiled_cpu_steps, measure_or_rounds, print_results

REF = "reference (minatar via gymnasium SyncVectorEnv)"


def _pin(cores: int | None) -> None:
    if cores is None:
        return
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(allowed[:cores]))
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen={'true' if cores > 1 else 'false'}".strip()
    import torch

    torch.set_num_threads(cores)


def _torch_loop(env, n: int, steps: int) -> dict:
    import torch

    from rlstruct import DictTensor

    obs, _ = env.reset()
    dev = env.device
    # Zero-filled, so that its pages exist before the timing: a learner's buffer is written again at every
    # acquisition, and the first writes into fresh memory (page faults) would cost more than the step itself.
    frames = torch.zeros((steps,) + tuple(obs["frame"].shape), dtype=obs["frame"].dtype, device=dev)
    rewards = torch.zeros(steps, n, device=dev)
    dones = torch.zeros(steps, n, dtype=torch.bool, device=dev)
    n_actions = env.action_space.n

    def run(t_steps: int) -> None:
        for t in range(t_steps):
            a = torch.randint(0, n_actions, (n,), device=dev)
            (nxt, _), _ = env.step(DictTensor({"action": a}))
            frames[t].copy_(nxt["frame"])
            rewards[t].copy_(nxt["reward"])
            dones[t].copy_(nxt["done"])

    run(3)
    start = time.perf_counter()
    run(steps)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {"env_steps_per_s": n * steps / (time.perf_counter() - start), "kernel": getattr(env, "kernel", "")}


def measure_torch(args, eager: bool = False) -> dict:
    _pin(args.cores)
    if eager:
        os.environ["RLSTRUCT_JIT"] = "0"
    from rlstruct.envs import make_env

    env = make_env(f"MinAtar/{args.game}-v1", args.envs, backend="torch", autoreset=True, device=args.device)
    return _torch_loop(env, args.envs, args.steps)


def measure_step_into(args) -> dict:
    _pin(args.cores)
    import torch

    from rlstruct import DictTensor
    from rlstruct.envs import make_env

    n, steps = args.envs, args.steps
    env = make_env(f"MinAtar/{args.game}-v1", n, backend="torch", autoreset=True, device=args.device)
    obs, _ = env.reset()
    views = []
    for _ in range(2):
        buf = {k: torch.zeros((steps + 1,) + tuple(obs[k].shape), dtype=obs[k].dtype, device=env.device)
               for k in obs.keys()}
        views.append([DictTensor({k: v[t] for k, v in buf.items()}) for t in range(steps + 1)])
    nxt, running = views
    n_actions = env.action_space.n

    def run(t_steps: int) -> None:
        for t in range(t_steps):
            a = torch.randint(0, n_actions, (n,), device=env.device)
            env.step_into(DictTensor({"action": a}), nxt[t], running[t + 1])

    run(3)
    start = time.perf_counter()
    run(steps)
    return {"env_steps_per_s": n * steps / (time.perf_counter() - start), "kernel": env.kernel}


def measure_adapter(args) -> dict:
    _pin(args.cores)
    from rlstruct.envs import make_env

    env = make_env(f"{args.game}-MinAtar", args.envs, backend="gymnax", autoreset=True)
    return _torch_loop(env, args.envs, args.steps)


def measure_gymnax(args) -> dict:
    _pin(args.cores)
    import gymnax
    import jax

    n, steps = args.envs, args.steps
    env, params = gymnax.make(f"{args.game}-MinAtar")

    def rollout(key):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), params)

        def body(carry, _):
            state, key = carry
            key, ka, ks = jax.random.split(key, 3)
            a = jax.random.randint(ka, (n,), 0, env.num_actions)
            obs, state, r, d, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(jax.random.split(ks, n), state, a,
                                                                               params)
            return (state, key), (obs, r, d)

        return jax.lax.scan(body, (state, key), None, length=steps)[1]

    f = jax.jit(rollout)
    jax.block_until_ready(f(jax.random.PRNGKey(0)))
    start = time.perf_counter()
    jax.block_until_ready(f(jax.random.PRNGKey(1)))
    return {"env_steps_per_s": n * steps / (time.perf_counter() - start)}


def measure_reference(args) -> dict:
    _pin(args.cores)
    import gymnasium as gym

    import rlstruct.envs  # noqa: F401  (registers the MinAtar ids)

    n, steps = args.ref_envs, args.ref_steps
    env = gym.vector.SyncVectorEnv([lambda: gym.make(f"MinAtar/{args.game}-v1") for _ in range(n)])
    obs, _ = env.reset(seed=0)
    frames = np.empty((steps,) + obs.shape, dtype=obs.dtype)
    rewards, dones = np.empty((steps, n), np.float32), np.empty((steps, n), bool)
    rng = np.random.default_rng(0)
    n_actions = env.single_action_space.n
    start = time.perf_counter()
    for t in range(steps):
        obs, r, term, trunc, _ = env.step(rng.integers(0, n_actions, n))
        frames[t], rewards[t], dones[t] = obs, r, term | trunc
    return {"env_steps_per_s": n * steps / (time.perf_counter() - start)}


def measure_graph(args) -> dict:
    import torch
    from _common import batcher_steps_per_s

    from rlstruct import RL_Agent
    from rlstruct.batchers import RL_Batcher
    from rlstruct.envs import make_env

    class RandomAgent(RL_Agent):
        def __init__(self, n_actions: int):
            self.n_actions = n_actions

        def __call__(self, state, observation, agent_info, history=None):
            from rlstruct import DictTensor

            n, dev = observation["reward"].shape[0], observation["reward"].device
            return DictTensor._trusted({"action": torch.randint(0, self.n_actions, (n,), device=dev)}), state

    name = f"MinAtar/{args.game}-v1"
    n_actions = make_env(name, 1, backend="torch").action_space.n
    with RL_Batcher(args.gpu_steps, RandomAgent, {"n_actions": n_actions}, make_env,
                    {"name": name, "n_envs": args.gpu_envs, "backend": "torch", "autoreset": True,
                     "device": args.device}, 0, [0], device=args.device, cuda_graph=True) as batcher:
        return {"env_steps_per_s": batcher_steps_per_s(batcher, args.iters, warmup=2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--game", default="Breakout",
                        help="Asterix, Breakout, Freeway, Seaquest or SpaceInvaders (gymnasium's spelling)")
    parser.add_argument("--envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ref-envs", type=int, default=64)
    parser.add_argument("--ref-steps", type=int, default=100)
    parser.add_argument("--cores", type=int, default=None, help="pin each process to this many cores and threads")
    parser.add_argument("--device", default="cpu", help="cuda: add the CUDA-graph batcher row")
    parser.add_argument("--gpu-envs", type=int, default=2**20)
    parser.add_argument("--gpu-steps", type=int, default=16)
    parser.add_argument("--iters", type=int, default=5, help="acquisitions timed in the CUDA-graph row")
    parser.add_argument("--skip", nargs="*", default=[], choices=["torch", "eager", "into", "gymnax",
                                                                   "adapter", "reference"])
    add_arguments(parser)
    args = parser.parse_args(argv)
    compiled_cpu_steps()
    eager_row = f"rlstruct torch, eager {args.game} N={args.envs}"
    rows = {
        "torch": (f"rlstruct torch {args.game} N={args.envs}", Config(
            lambda: measure_torch(args), (("gymnax", f"gymnax N={args.envs}"), ("reference", REF),
                                          ("eager", eager_row)))),
        "eager": (eager_row, Config(lambda: measure_torch(args, eager=True), (("gymnax", f"gymnax N={args.envs}"),
                                                                              ("reference", REF)))),
        "into": (f"rlstruct torch step_into {args.game} N={args.envs}", Config(
            lambda: measure_step_into(args), (("gymnax", f"gymnax N={args.envs}"), ("reference", REF)))),
        "gymnax": (f"gymnax N={args.envs}", Config(lambda: measure_gymnax(args))),
        "adapter": (f"rlstruct gymnax adapter N={args.envs}",
                    Config(lambda: measure_adapter(args), (("gymnax", f"gymnax N={args.envs}"),))),
        "reference": (REF, Config(lambda: measure_reference(args))),
    }
    configs = {label: config for key, (label, config) in rows.items() if key not in args.skip}
    if args.device.startswith("cuda"):
        configs[f"rlstruct torch RL_Batcher cuda_graph N={args.gpu_envs} T={args.gpu_steps}"] = Config(
            lambda: measure_graph(args))
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        print_results(results, configs, "env_steps_per_s", note=lambda r: r.get("kernel", ""))


if __name__ == "__main__":
    main()
