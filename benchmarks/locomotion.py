"""gymnasium's MuJoCo locomotion tasks: each rlstruct backend against its own native loop, in the same run.

(a) env only, MJX: the loop a user writes around MJX itself (a jitted, vmapped ``mjx.step`` x frame_skip with the
    controls set to random actions drawn in JAX, each step's positions read), against
    ``make_env(name, n, backend="mjx", autoreset=True)`` stepped with random torch actions (the task's observation,
    reward, termination and auto-reset, DLPack both ways).
(b) env only, mujoco-torch: ``torch.vmap(mujoco_torch.step)`` x frame_skip on one batched ``Data`` with random
    controls, against ``make_env(name, n, backend="mujoco_torch", autoreset=True)``.
(c) env only, MuJoCo's C engine: gymnasium's own env in a ``SyncVectorEnv`` (numpy random actions), the peer a user
    would pick on a CPU.
(d) through the batcher: ``RL_Batcher(n_processes=0)`` over the auto-reset MJX env with a small MLP policy (tanh of a
    2x64 MLP), T steps per acquisition, against the same policy and loop written directly on MJX's native step
    (the frames stored into a preallocated buffer as the batcher does).

Run (2-core CPU): python benchmarks/locomotion.py --mjx-sizes 64 --torch-sizes 16 --gym-sizes 16
On a GPU: python benchmarks/locomotion.py --device cuda --mjx-sizes 1024 4096 16384 65536 --torch-sizes 1024 4096
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
from rlstruct.envs._locomotion import locomotion_task

T = 32


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------------- MJX
@functools.lru_cache(maxsize=None)
def mjx_native_step(name: str, device: str):
    """MJX's own jitted, vmapped env step (controls, frame_skip physics steps), and the initial batched Data."""
    import jax
    import mujoco
    from mujoco import mjx

    from rlstruct.envs.jax_env import jax_device

    task = locomotion_task(name, "mjx")
    m = mujoco.MjModel.from_xml_path(task.xml_path())
    model = mjx.put_model(m, device=jax_device(device))

    def physics(data, action):
        data = data.replace(ctrl=action)
        return jax.lax.fori_loop(0, task.frame_skip, lambda _, d: mjx.step(model, d), data)

    def batch(n):
        """``n`` envs in the task's reset distribution (diverse envs: MJX's vmapped solver iterates until the
        slowest env converges, so identical envs would flatter a loop)."""
        jnp = jax.numpy
        data0 = mjx.make_data(model)

        def one(key):
            k_pos, k_vel = jax.random.split(key)
            draw = jax.random.normal if task.qvel_noise == "normal" else jax.random.uniform
            qpos, qvel = task.initial_state(jnp, jnp.asarray(m.qpos0, jnp.float32), jax.random.uniform(k_pos, (m.nq,)),
                                            draw(k_vel, (m.nv,)))
            return data0.replace(qpos=qpos, qvel=qvel)

        return jax.vmap(one)(jax.random.split(jax.random.PRNGKey(1), n))

    return m, physics, batch


@functools.lru_cache(maxsize=None)
def mjx_native_loop(name: str, n: int, device: str):
    """The jitted step of :func:`mjx_native` (built once per size: rounds reuse its compilation)."""
    import jax

    m, physics, batch = mjx_native_step(name, device)

    @jax.jit
    def step(key, data):
        key, k_act = jax.random.split(key)
        action = jax.random.uniform(k_act, (n, m.nu), minval=-1.0, maxval=1.0)
        data = jax.vmap(physics)(data, action)
        return key, data

    return step, batch


def mjx_native(name: str, n: int, steps: int, device: str) -> float:
    import jax

    step, batch = mjx_native_loop(name, n, device)
    key, data = jax.random.PRNGKey(0), batch(n)
    key, data = step(key, data)
    data.qpos.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(steps):
        key, data = step(key, data)
        data.qpos.block_until_ready()
    return n * steps / (time.perf_counter() - t0)


def env_rlstruct(name: str, backend: str, n: int, steps: int, device: str) -> float:
    env = make_env(name, n, backend=backend, autoreset=True, device=device)
    nu = env.action_space.shape[0]
    gen = torch.Generator(device=device).manual_seed(0)
    env.reset()
    env.step(DictTensor({"action": torch.zeros(n, nu, device=device)}))
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        (nxt, _), (obs, _) = env.step(DictTensor._trusted({
            "action": torch.rand(n, nu, generator=gen, device=device) * 2 - 1}))
    obs["frame"].sum().item()  # the last outputs are there
    return n * steps / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------- mujoco-torch
def torch_native(name: str, n: int, steps: int, device: str) -> float:
    import mujoco
    import mujoco_torch

    from rlstruct.envs._imports import import_mujoco_torch

    import_mujoco_torch()  # points mujoco-torch's solver loop at one that runs under vmap
    task = locomotion_task(name, "mujoco_torch")
    m = mujoco.MjModel.from_xml_path(task.xml_path())
    mx = mujoco_torch.device_put(m).to(device)
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    data = mujoco_torch.step(mx, mujoco_torch.device_put(d).to(device)).expand(n).clone()
    vstep = torch.vmap(lambda x: mujoco_torch.step(mx, x))

    def step(data):
        data = data.copy()
        data.ctrl = torch.rand(n, m.nu, dtype=torch.float64, device=device) * 2 - 1
        for _ in range(task.frame_skip):
            data = vstep(data)
        return data

    data = step(data)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        data = step(data)
    data.qpos.sum().item()
    return n * steps / (time.perf_counter() - t0)


# -------------------------------------------------------------------------------------------- MuJoCo C
def gymnasium_sync(name: str, n: int, steps: int) -> float:
    import gymnasium as gym

    vec = gym.vector.SyncVectorEnv([lambda: gym.make(name) for _ in range(n)])
    rng = np.random.default_rng(0)
    vec.reset(seed=0)
    nu = vec.single_action_space.shape[0]
    vec.step(rng.uniform(-1, 1, (n, nu)).astype(np.float32))
    t0 = time.perf_counter()
    for _ in range(steps):
        vec.step(rng.uniform(-1, 1, (n, nu)).astype(np.float32))
    dt = time.perf_counter() - t0
    vec.close()
    return n * steps / dt


# ------------------------------------------------------------------------------------------- the batcher
def mlp(obs_dim: int, nu: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(obs_dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, nu), torch.nn.Tanh()).to(device)


class MLPAgent(RL_Agent):
    """A small deterministic MLP policy (float32 actions in (-1, 1))."""

    def __init__(self, obs_dim: int, nu: int, device: str = "cpu"):
        self.model = mlp(obs_dim, nu, device)

    @torch.no_grad()
    def __call__(self, state, observation, agent_info, history=None):
        return DictTensor._trusted({"action": self.model(observation["frame"])}), state


@functools.lru_cache(maxsize=None)
def mjx_direct_step(name: str, device: str):
    import jax
    import jax.numpy as jnp

    task = locomotion_task(name, "mjx")
    m, physics, batch = mjx_native_step(name, device)

    @jax.jit
    def step(data, action):
        data = jax.vmap(physics)(data, action)
        return data, task.observation(jnp, data.qpos, data.qvel)

    return step, batch, m


def mjx_direct(name: str, n: int, iters: int, device: str) -> float:
    """The batcher's job written directly on MJX's native step: T steps per acquisition, the MLP's actions handed
    over by DLPack, each step's observation kept (stacked into one [T, n, obs_dim] tensor at the end)."""
    import jax
    import jax.numpy as jnp

    step, batch, m = mjx_direct_step(name, device)
    task = locomotion_task(name, "mjx")
    policy = mlp(m.nq - 1 + m.nv, m.nu, device)
    data = batch(n)
    obs = torch.from_dlpack(task.observation(jnp, data.qpos, data.qvel))
    t0 = None
    for it in range(iters + 1):
        if it == 1:
            t0 = time.perf_counter()
        frames = []
        for _ in range(T):
            with torch.no_grad():
                a = policy(obs)
            data, o = step(data, jax.dlpack.from_dlpack(a) if device != "cpu" else a.numpy())
            obs = torch.from_dlpack(o)
            frames.append(obs)
        traj = torch.stack(frames)
    traj.sum().item()
    return n * T * iters / (time.perf_counter() - t0)


def batcher(name: str, n: int, backend: str, device: str) -> RL_Batcher:
    env = make_env(name, 1, backend=backend)
    obs_dim, nu = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    create_env = functools.partial(make_env, name, n, backend=backend, autoreset=True, device=device)
    return RL_Batcher(T, MLPAgent, {"obs_dim": obs_dim, "nu": nu, "device": device}, create_env, {}, 0, [0],
                      device=device)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each loop is shown")
    p.add_argument("--steps", type=int, default=50, help="steps timed per MJX and gymnasium env-only row")
    p.add_argument("--torch-steps", type=int, default=5, help="steps timed per mujoco-torch row")
    p.add_argument("--iters", type=int, default=2, help=f"acquisitions of T={T} steps timed per batcher row")
    p.add_argument("--mjx-sizes", type=int, nargs="*", default=[64])
    p.add_argument("--torch-sizes", type=int, nargs="*", default=[16])
    p.add_argument("--gym-sizes", type=int, nargs="*", default=[16])
    p.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c", "d"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows: list[tuple[str, str, float, str]] = []
    r, name, dev = args.rounds, args.env, args.device

    if "a" not in args.skip:
        print(f"(a) MJX {name}, env only", flush=True)
        for n in args.mjx_sizes:
            native, mine = best_of_rounds(r, lambda: mjx_native(name, n, args.steps, dev),
                                          lambda: env_rlstruct(name, "mjx", n, args.steps, dev))
            rows.append(("a", f"MJX jitted vmapped step N={n}", native, ""))
            rows.append(("a", f"make_env(backend='mjx') N={n}", mine, f"{mine / native:.2f}x native"))
    if "b" not in args.skip:
        print(f"(b) mujoco-torch {name}, env only", flush=True)
        for n in args.torch_sizes:
            native, mine = best_of_rounds(r, lambda: torch_native(name, n, args.torch_steps, dev),
                                          lambda: env_rlstruct(name, "mujoco_torch", n, args.torch_steps, dev))
            rows.append(("b", f"vmap(mujoco_torch.step) N={n}", native, ""))
            rows.append(("b", f"make_env(backend='mujoco_torch') N={n}", mine, f"{mine / native:.2f}x native"))
    if "c" not in args.skip:
        print(f"(c) gymnasium {name} (MuJoCo C), env only", flush=True)
        for n in args.gym_sizes:
            [sps] = best_of_rounds(r, lambda: gymnasium_sync(name, n, args.steps))
            rows.append(("c", f"gymnasium SyncVectorEnv N={n}", sps, ""))
    if "d" not in args.skip:
        print("(d) through RL_Batcher(n_processes=0), MLP policy", flush=True)
        for n in args.mjx_sizes:
            with batcher(name, n, "mjx", dev) as b:
                direct, sps = best_of_rounds(r, lambda: mjx_direct(name, n, args.iters, dev),
                                             lambda: batcher_steps_per_s(b, args.iters))
            rows.append(("d", f"direct loop on MJX N={n}, T={T}", direct, ""))
            rows.append(("d", f"RL_Batcher mjx N={n}, T={T}", sps, f"{sps / direct:.2f}x direct"))

    print_rows(rows)


if __name__ == "__main__":
    main()
