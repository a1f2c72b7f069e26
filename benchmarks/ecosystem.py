"""Simulators from the ecosystem: each rlstruct backend against its own native loop, in the same run.

(a) env only, gymnax (JAX on the CPU): gymnax's own jitted, vmapped ``env.step`` (its auto-reset) with random
    actions drawn in JAX, one dispatch per step, against ``make_env(name, n, backend="gymnax", autoreset=True)``
    stepped with random torch actions (on the CPU, numpy's views of JAX's buffers both ways; DLPack on a GPU).
(b) env only, ale-py: the raw ``AtariVectorEnv`` loop (numpy random actions) against ``backend="ale"``
    (auto-reset, torch actions).
(c) through the batcher: ``RL_Batcher(n_processes=0)`` over the auto-reset env with a random agent, T steps per
    acquisition, against the same loop written directly on the native env (the same random actions, the
    observations stored into a preallocated buffer as the batcher does); for gymnax also with the batcher's
    ``zero_copy=True`` (``get`` returns views of its buffer, as the direct loop hands over its stacked frames).
(d) ale-py: one process whose AtariVectorEnv runs its own thread pool (2 threads), against two worker processes
    (``n_processes=2``) of N/2 envs with one thread each.
(e) Brax (JAX on the CPU): the loop a Brax user writes, ``brax.envs.training.wrap(env, episode_length=1000)``
    (Brax's vmap, time limit and auto-reset wrappers) and ``jax.jit`` of its ``step`` with random actions drawn in
    JAX, against ``make_env(name, n, backend="brax", autoreset=True)`` stepped with random torch actions; then
    ``RL_Batcher(n_processes=0)`` over the latter with a random agent, T steps per acquisition.

Run: python benchmarks/ecosystem.py [--rounds 3] [--steps 200] [--gymnax-sizes 256 4096] [--ale-envs 8]
     [--brax-env inverted_pendulum] [--brax-pipeline generalized] [--brax-sizes 64 1024]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch
from _common import batcher_steps_per_s, best_of_rounds, print_rows

from rlstruct import DictTensor, RL_Agent
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import make_env

T = 64


class RandomAgent(RL_Agent):
    """Uniform random Discrete actions (``n_actions``), one per observation row."""

    def __init__(self, n_actions: int):
        self.n_actions = n_actions

    def __call__(self, state, observation, agent_info, history=None):
        n = observation["reward"].shape[0]
        return DictTensor._trusted({"action": torch.randint(0, self.n_actions, (n,))}), state


class RandomBoxAgent(RL_Agent):
    """Uniform random actions in ``[-1, 1)`` of ``action_dim`` values (Brax's action convention), one per row."""

    def __init__(self, action_dim: int):
        self.action_dim = action_dim

    def __call__(self, state, observation, agent_info, history=None):
        n = observation["reward"].shape[0]
        return DictTensor._trusted({"action": torch.rand(n, self.action_dim) * 2 - 1}), state


# ------------------------------------------------------------------------------------------------ gymnax
def gymnax_native(name: str, n: int, steps: int, read_each_step: bool = False) -> float:
    """gymnax's own loop; ``read_each_step``: wait for each step's observation (what an agent acting on it needs;
    JAX otherwise queues the next steps while the current one runs)."""
    import gymnax
    import jax

    env, params = gymnax.make(name)
    n_actions = env.action_space(params).n

    @jax.jit
    def step(key, state):
        key, k_act, k_step = jax.random.split(key, 3)
        action = jax.random.randint(k_act, (n,), 0, n_actions)
        # gymnax >= 1.0 returns (obs, state, reward, terminated, truncated, info), 0.0.x (obs, state, reward, done,
        # info): the native loop keeps whatever flags its version gives.
        obs, state, reward, *flags = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, n), state, action, params)
        return key, state, obs, reward, flags[:-1]

    key = jax.random.PRNGKey(0)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), params)
    out = step(key, state)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = step(out[0], out[1])
        if read_each_step:
            out[2].block_until_ready()
    jax.block_until_ready(out)
    return n * steps / (time.perf_counter() - t0)


def gymnax_rlstruct(name: str, n: int, steps: int) -> float:
    env = make_env(name, n, backend="gymnax", autoreset=True)
    gen = torch.Generator().manual_seed(0)
    env.reset()
    env.step(DictTensor({"action": torch.zeros(n, dtype=torch.int64)}))
    n_actions = env.action_space.n
    t0 = time.perf_counter()
    for _ in range(steps):
        (nxt, _), (obs, _) = env.step(DictTensor._trusted({"action": torch.randint(0, n_actions, (n,), generator=gen)}))
    obs["frame"].sum()  # the last outputs are there
    return n * steps / (time.perf_counter() - t0)


def gymnax_direct(name: str, n: int, iters: int) -> float:
    """The batcher's job written directly on gymnax: T jitted steps per acquisition, each step's observation kept
    (stacked into one [T, n, ...] array at the end), random actions drawn in torch and handed over by DLPack."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, params = gymnax.make(name)
    n_actions = env.action_space(params).n

    @jax.jit
    def step(keys, state, action):
        split = jax.vmap(jax.random.split)(keys)
        obs, state, reward, *flags = jax.vmap(env.step, in_axes=(0, 0, 0, None))(split[:, 1], state, action, params)
        done = flags[0] | flags[1] if len(flags) == 3 else flags[0]  # gymnax >= 1.0 / 0.0.x, as in gymnax_native
        return split[:, 0], state, obs, reward, done

    keys = jax.random.split(jax.random.PRNGKey(0), n)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    stack = jax.jit(lambda xs: jnp.stack(xs))
    t0 = None
    for it in range(iters + 1):
        if it == 1:
            t0 = time.perf_counter()
        frames = []
        for _ in range(T):
            a = jax.dlpack.from_dlpack(torch.randint(0, n_actions, (n,), dtype=torch.int32))
            keys, state, obs, reward, done = step(keys, state, a)
            frames.append(obs)
        traj = torch.from_dlpack(stack(frames))
    traj.sum()
    return n * T * iters / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------ ale-py
def ale_vec(n: int, threads: int):
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv("breakout", n, num_threads=threads)


def ale_native(n: int, steps: int, threads: int) -> float:
    vec = ale_vec(n, threads)
    rng = np.random.default_rng(0)
    vec.reset(seed=np.arange(n))
    vec.step(rng.integers(0, 4, n))
    t0 = time.perf_counter()
    for _ in range(steps):
        vec.step(rng.integers(0, 4, n))
    dt = time.perf_counter() - t0
    vec.close()
    return n * steps / dt


def ale_rlstruct(n: int, steps: int, threads: int) -> float:
    env = make_env("ALE/Breakout-v5", n, backend="ale", autoreset=True, backend_kwargs={"num_threads": threads})
    env.reset()
    gen = torch.Generator().manual_seed(0)
    env.step(DictTensor({"action": torch.zeros(n, dtype=torch.int64)}))
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(DictTensor._trusted({"action": torch.randint(0, 4, (n,), generator=gen)}))
    dt = time.perf_counter() - t0
    env.close()
    return n * steps / dt


def ale_direct(n: int, iters: int, threads: int) -> float:
    """The batcher's job written directly on AtariVectorEnv: T steps per acquisition, random torch actions, each
    step's frames, rewards and flags copied into a preallocated [T, n, ...] buffer."""
    vec = ale_vec(n, threads)
    obs, _ = vec.reset(seed=np.arange(n))
    frames = np.empty((T, n) + obs.shape[1:], np.uint8)
    rewards = np.empty((T, n), np.float32)
    dones = np.empty((T, n), bool)
    t0 = None
    for it in range(iters + 1):
        if it == 1:
            t0 = time.perf_counter()
        for t in range(T):
            obs, reward, term, trunc, _ = vec.step(torch.randint(0, 4, (n,)).numpy())
            frames[t] = obs
            rewards[t] = reward
            np.logical_or(term, trunc, out=dones[t])
    dt = time.perf_counter() - t0
    vec.close()
    return n * T * iters / dt


# -------------------------------------------------------------------------------------------------- Brax
@functools.lru_cache(maxsize=None)
def brax_native_loop(name: str, n: int, pipeline: str | None):
    """Brax's training wrappers around the env and the jitted step with its random actions (compiled once per size:
    a Brax step compiles in seconds), and the initial ``(key, state)``."""
    import jax
    from brax import envs

    env = envs.training.wrap(envs.get_environment(name, **brax_kwargs(pipeline)), episode_length=1000)
    n_actions = env.action_size

    @jax.jit
    def step(key, state):
        key, k_act = jax.random.split(key)
        state = env.step(state, jax.random.uniform(k_act, (n, n_actions), minval=-1.0, maxval=1.0))
        return key, state

    key = jax.random.PRNGKey(0)
    state = jax.jit(env.reset)(jax.random.split(key, n))
    # Two untimed steps: the first compiles for the reset's state, the second for the step's own output (an env whose
    # step returns weakly typed values, as Brax's do, is compiled again for them).
    out = step(*step(key, state))
    jax.block_until_ready(out)
    return step, out


def brax_kwargs(pipeline: str | None) -> dict:
    return {} if pipeline is None else {"backend": pipeline}


def brax_native(name: str, n: int, steps: int, pipeline: str | None, read_each_step: bool = False) -> float:
    """Brax's own loop; ``read_each_step``: wait for each step's observation (as in gymnax_native)."""
    import jax

    step, out = brax_native_loop(name, n, pipeline)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = step(*out)
        if read_each_step:
            out[1].obs.block_until_ready()
    jax.block_until_ready(out)
    return n * steps / (time.perf_counter() - t0)


def brax_rlstruct(name: str, n: int, steps: int, pipeline: str | None) -> float:
    # Envs of one name, settings and size share their compiled step: only the first round compiles.
    env = make_env(name, n, backend="brax", autoreset=True, backend_kwargs=brax_kwargs(pipeline))
    gen = torch.Generator().manual_seed(0)
    shape = (n,) + env.action_space.shape
    env.reset()
    env.step(DictTensor({"action": torch.zeros(shape)}))
    t0 = time.perf_counter()
    for _ in range(steps):
        (nxt, _), (obs, _) = env.step(DictTensor._trusted({"action": torch.rand(shape, generator=gen) * 2 - 1}))
    obs["frame"].sum()  # the last outputs are there
    return n * steps / (time.perf_counter() - t0)


def brax_batcher(name: str, n: int, pipeline: str | None) -> RL_Batcher:
    create_env = functools.partial(make_env, name, n, backend="brax", autoreset=True,
                                   backend_kwargs=brax_kwargs(pipeline))
    action_dim = create_env().action_space.shape[0]
    return RL_Batcher(T, RandomBoxAgent, {"action_dim": action_dim}, create_env, {}, 0, [0])


def batcher(name: str, n: int, backend: str, n_actions: int, n_processes: int = 0, zero_copy: bool = False,
            **backend_kwargs) -> RL_Batcher:
    create_env = functools.partial(make_env, name, n, backend=backend, autoreset=True,
                                   backend_kwargs=backend_kwargs or None)
    seeds = list(range(max(n_processes, 1)))
    return RL_Batcher(T, RandomAgent, {"n_actions": n_actions}, create_env, {}, n_processes, seeds, zero_copy=zero_copy)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each loop is shown")
    p.add_argument("--steps", type=int, default=200, help="steps timed per env-only row")
    p.add_argument("--iters", type=int, default=3, help=f"acquisitions of T={T} steps timed per batcher row")
    p.add_argument("--gymnax-env", default="CartPole-v1")
    p.add_argument("--gymnax-sizes", type=int, nargs="*", default=[256, 4096])
    p.add_argument("--ale-envs", type=int, default=8)
    p.add_argument("--brax-env", default="inverted_pendulum")
    p.add_argument("--brax-pipeline", default=None,
                   help="Brax's physics pipeline (generalized, positional, spring, mjx; default: the env's own)")
    p.add_argument("--brax-sizes", type=int, nargs="*", default=[64, 1024])
    p.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c", "d", "e"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows: list[tuple[str, str, float, str]] = []
    r = args.rounds

    if "a" not in args.skip:
        print(f"(a) gymnax {args.gymnax_env}, env only", flush=True)
        for n in args.gymnax_sizes:
            native, blocking, mine = best_of_rounds(
                r, lambda: gymnax_native(args.gymnax_env, n, args.steps),
                lambda: gymnax_native(args.gymnax_env, n, args.steps, read_each_step=True),
                lambda: gymnax_rlstruct(args.gymnax_env, n, args.steps))
            rows.append(("a", f"gymnax jitted vmapped step N={n} (queued)", native, ""))
            rows.append(("a", f"gymnax jitted vmapped step N={n}, each obs read", blocking, ""))
            rows.append(("a", f"make_env(backend='gymnax') N={n}", mine,
                         f"{mine / native:.2f}x queued, {mine / blocking:.2f}x obs read; "
                         f"+{1e6 * n * (1 / mine - 1 / blocking):.0f} us/step"))

    n = args.ale_envs
    if "b" not in args.skip:
        print(f"(b) ale-py Breakout, env only, N={n}", flush=True)
        native, mine = best_of_rounds(r, lambda: ale_native(n, args.steps, 2), lambda: ale_rlstruct(n, args.steps, 2))
        rows.append(("b", f"AtariVectorEnv loop N={n}, 2 threads", native, ""))
        rows.append(("b", f"make_env(backend='ale') N={n}, 2 threads", mine,
                     f"{mine / native:.2f}x native; +{1e6 * n * (1 / mine - 1 / native):.0f} us/step"))

    if "c" not in args.skip:
        print("(c) through RL_Batcher(n_processes=0), random agent", flush=True)
        for size in args.gymnax_sizes:
            with batcher(args.gymnax_env, size, "gymnax", 2) as b, \
                    batcher(args.gymnax_env, size, "gymnax", 2, zero_copy=True) as zb:
                direct, sps, zsps = best_of_rounds(
                    r, lambda: gymnax_direct(args.gymnax_env, size, args.iters),
                    lambda: batcher_steps_per_s(b, args.iters), lambda: batcher_steps_per_s(zb, args.iters))
            rows.append(("c", f"direct loop on gymnax N={size}, T={T}", direct, ""))
            rows.append(("c", f"RL_Batcher gymnax N={size}, T={T}", sps, f"{sps / direct:.2f}x direct"))
            rows.append(("c", f"RL_Batcher gymnax N={size}, T={T}, zero_copy", zsps, f"{zsps / direct:.2f}x direct"))
        with batcher("ALE/Breakout-v5", n, "ale", 4, num_threads=2) as b:
            direct, sps = best_of_rounds(r, lambda: ale_direct(n, args.iters, 2),
                                         lambda: batcher_steps_per_s(b, args.iters))
        rows.append(("c", f"direct loop on AtariVectorEnv N={n}, T={T}", direct, ""))
        rows.append(("c", f"RL_Batcher ale N={n}, T={T} (step_into)", sps, f"{sps / direct:.2f}x direct"))

    if "d" not in args.skip:
        print(f"(d) ale-py N={n}: one process with its thread pool vs two worker processes", flush=True)
        with batcher("ALE/Breakout-v5", n, "ale", 4, num_threads=2) as b1, \
                batcher("ALE/Breakout-v5", n // 2, "ale", 4, n_processes=2, num_threads=1) as b2:
            one, two = best_of_rounds(r, lambda: batcher_steps_per_s(b1, args.iters),
                                      lambda: batcher_steps_per_s(b2, args.iters))
        rows.append(("d", f"1 process, AtariVectorEnv({n}) 2 threads", one, ""))
        rows.append(("d", f"2 worker processes x AtariVectorEnv({n // 2}) 1 thread", two, f"{two / one:.2f}x"))

    if "e" not in args.skip:
        name, pipeline = args.brax_env, args.brax_pipeline
        print(f"(e) Brax {name} ({pipeline or 'default'} pipeline): env only, then RL_Batcher", flush=True)
        for size in args.brax_sizes:
            with brax_batcher(name, size, pipeline) as b:
                native, blocking, mine, sps = best_of_rounds(
                    r, lambda: brax_native(name, size, args.steps, pipeline),
                    lambda: brax_native(name, size, args.steps, pipeline, read_each_step=True),
                    lambda: brax_rlstruct(name, size, args.steps, pipeline),
                    lambda: batcher_steps_per_s(b, args.iters))
            rows.append(("e", f"Brax wrap + jitted step N={size} (queued)", native, ""))
            rows.append(("e", f"Brax wrap + jitted step N={size}, each obs read", blocking, ""))
            rows.append(("e", f"make_env(backend='brax') N={size}", mine,
                         f"{mine / native:.2f}x queued, {mine / blocking:.2f}x obs read; "
                         f"+{1e6 * size * (1 / mine - 1 / blocking):.0f} us/step"))
            rows.append(("e", f"RL_Batcher brax N={size}, T={T} (step_into)", sps,
                         f"{sps / blocking:.2f}x native, obs read"))

    print_rows(rows)


if __name__ == "__main__":
    main()
