"""MinAtar throughput: rlstruct's torch simulators against the peers a user would pick, each in a fresh process.

(Not ``minatar.py``: a script of that name would shadow the minatar package it measures.)

Every configuration plays a policy with auto-reset and stores what a learner would read (frames, rewards, dones) in
a buffer of ``--steps`` steps of ``N`` envs (for each ``N`` of ``--envs``), filled again and again for at least
``--seconds`` (at least once; the first steps, and with them any compilation, are not timed), and reports env steps
per second. The policy (``--policies``): ``none``, uniform random actions (the step alone), or ``cnn``, the MinAtar
CNN (conv 16x3x3, linear 128, the actions' logits; float32, with TF32 products on a GPU on both sides) acting on the
frame each env acts on next, its action drawn from the logits by the Gumbel-max trick (the policy in the loop).
Configurations:

* ``rlstruct torch``: ``make_env("MinAtar/<Game>-v1", N, backend="torch", autoreset=True)`` stepped with
  ``torch.randint`` actions (or the CNN's, in ``torch.no_grad``), each step's frame (``bool``), reward and done
  copied into a preallocated ``[T, N, ...]`` buffer (zero-filled beforehand: its pages exist, as a reused buffer's
  do): what a CPU user gets, the compiled CPU step (``kernel`` "jit": numba installed, the game has a compiled step)
  from the first step. On a GPU it is the eager step (``kernel`` "torch").
* ``rlstruct torch, eager``: the same with ``RLSTRUCT_JIT=0``: the torch step, op by op (``kernel`` "torch").
* ``rlstruct torch, compiled``: the same with ``backend_kwargs={"compile": True}``: the whole auto-reset step as one
  ``torch.compile`` graph (``kernel`` "compiled"); the policy runs eagerly, as in the eager row.
* ``rlstruct torch step_into`` (step alone only): the env as ``RL_Batcher`` drives it,
  ``env.step_into(action, next_t, running_t+1)`` into rows of zero-filled ``[T + 1, N, ...]`` buffers of every
  observation key (with the compiled step the kernel writes there; no observation tensors, no copies).
* ``gymnax``: gymnax's own ``<Game>-MinAtar``, ``jax.jit`` of a ``lax.scan`` over ``jax.vmap`` of ``env.step``
  (its auto-reset), actions drawn in JAX (the CNN's: the same layers in ``jax.lax``, compiled into the scan by XLA),
  the env state carried from one scan to the next; the scan stacks the observations (``float32``) as its storage.
* ``rlstruct gymnax adapter``: ``make_env("<Game>-MinAtar", N, backend="gymnax", autoreset=True)``, stepped and
  stored as ``rlstruct torch``.
* ``reference`` (step alone only): minatar's gymnasium ids in ``gymnasium.vector.SyncVectorEnv`` (``--ref-envs``
  envs, ``--ref-steps`` steps: it is slow), numpy random actions and a numpy buffer.
* with ``--device cuda``: the torch simulator in ``RL_Batcher(n_processes=0, cuda_graph=True)`` with a random
  agent on the GPU (``--gpu-envs`` envs, ``T=--gpu-steps`` steps per acquisition), frames counted as env steps.

Each row's notes give its ``kernel`` and the seconds of its first step or scan (a compilation, when there is one).
``--cores K`` pins each process to K cores with K compute threads (torch's and XLA's), so that every configuration
gets the same share of a shared machine.

Run: python benchmarks/minatar_speed.py [--game Breakout] [--envs 4096] [--steps 100] [--rounds 3] [--cores 1]
     [--device cuda --envs 4096 65536 1048576 --policies none cnn --steps 16 --seconds 1 --gpu-envs 1048576]
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


def _repeated(run, steps: int, n: int, seconds: float, sync) -> dict:
    """``run(k)`` steps ``k`` steps of ``n`` envs: its first step (a compilation, if any) and up to two more
    untimed, then rollouts of ``steps`` steps until ``seconds`` have passed (at least one); ``sync()`` waits for the
    device."""
    t0 = time.perf_counter()
    run(1)
    sync()
    first = time.perf_counter() - t0
    run(min(2, steps))
    sync()
    rollouts, start = 0, time.perf_counter()
    while True:
        run(steps)
        sync()
        rollouts += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return {"env_steps_per_s": n * steps * rollouts / elapsed, "first_step_s": first}


def _device_sync(device):
    import torch

    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _torch_policy(env, policy: str):
    """``act(frame) -> actions int64 [N]``: uniform random (``"none"``) or the MinAtar CNN's Gumbel-max draw."""
    import torch

    n, dev, n_actions = env.n_envs(), env.device, env.action_space.n
    if policy == "none":
        return lambda frame: torch.randint(0, n_actions, (n,), device=dev)
    from rlstruct.algos.encoders import CNNEncoder

    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32, as the JAX policy's (convolutions are TF32 by default)
    torch.manual_seed(0)
    encoder = CNNEncoder(env.observation_space.shape, obs_dtype="bool")
    model = torch.nn.Sequential(encoder, torch.nn.Linear(encoder.out_dim, n_actions)).to(dev)

    def act(frame):
        logits = model(frame)
        return (logits - torch.empty_like(logits).exponential_().log()).argmax(1)

    return act


def _torch_loop(env, args, policy: str) -> dict:
    import torch

    from rlstruct import DictTensor

    obs, _ = env.reset()
    n, dev, steps = env.n_envs(), env.device, args.steps
    # Zero-filled, so that its pages exist before the timing: a learner's buffer is written again at every
    # acquisition, and the first writes into fresh memory (page faults) would cost more than the step itself.
    frames = torch.zeros((steps,) + tuple(obs["frame"].shape), dtype=obs["frame"].dtype, device=dev)
    rewards = torch.zeros(steps, n, device=dev)
    dones = torch.zeros(steps, n, dtype=torch.bool, device=dev)
    act = _torch_policy(env, policy)
    acting = [obs["frame"]]

    def run(t_steps: int) -> None:
        for t in range(t_steps):
            (nxt, _), (running, _) = env.step(DictTensor({"action": act(acting[0])}))
            frames[t].copy_(nxt["frame"])
            rewards[t].copy_(nxt["reward"])
            dones[t].copy_(nxt["done"])
            acting[0] = running["frame"]

    with torch.no_grad():
        out = _repeated(run, steps, n, args.seconds, _device_sync(dev))
    return {**out, "kernel": getattr(env, "kernel", "")}


def measure_torch(args, n: int, policy: str, kernel: str = "default") -> dict:
    """``kernel``: ``"default"`` (what ``make_env`` gives), ``"eager"`` (``RLSTRUCT_JIT=0``) or ``"compiled"``."""
    _pin(args.cores)
    if kernel == "eager":
        os.environ["RLSTRUCT_JIT"] = "0"
    from rlstruct.envs import make_env

    env = make_env(f"MinAtar/{args.game}-v1", n, backend="torch", autoreset=True, device=args.device,
                   backend_kwargs={"compile": True} if kernel == "compiled" else None)
    return _torch_loop(env, args, policy)


def measure_step_into(args, n: int) -> dict:
    _pin(args.cores)
    import torch

    from rlstruct import DictTensor
    from rlstruct.envs import make_env

    steps = args.steps
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

    return {**_repeated(run, steps, n, args.seconds, _device_sync(env.device)), "kernel": env.kernel}


def measure_adapter(args, n: int, policy: str) -> dict:
    _pin(args.cores)
    from rlstruct.envs import make_env

    env = make_env(f"{args.game}-MinAtar", n, backend="gymnax", autoreset=True)
    return _torch_loop(env, args, policy)


def _jax_policy(n_channels: int, n_actions: int):
    """``(params, act)``: the MinAtar CNN of :func:`_torch_policy` in ``jax.lax`` (NHWC frames, He-initialised), and
    ``act(params, frames float32 [N, 10, 10, C], key) -> actions [N]``, a Gumbel-max draw
    (``jax.random.categorical``)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    shapes = ((3, 3, n_channels, 16), (8 * 8 * 16, 128), (128, n_actions))
    params = [(jax.random.normal(k, shape) * (2.0 / (shape[0] if len(shape) == 2 else 9 * n_channels)) ** 0.5,
               jnp.zeros(shape[-1])) for k, shape in zip(keys, shapes)]

    def act(params, frames, key):
        (conv, b0), (dense, b1), (head, b2) = params
        x = jax.lax.conv_general_dilated(frames, conv, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x + b0).reshape(frames.shape[0], -1)
        x = jax.nn.relu(x @ dense + b1)
        return jax.random.categorical(key, x @ head + b2)

    return params, act


def measure_gymnax(args, n: int, policy: str) -> dict:
    _pin(args.cores)
    import gymnax
    import jax

    if args.device.startswith("cuda"):
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")  # TF32, as the torch policy's
    steps = args.steps
    env, env_params = gymnax.make(f"{args.game}-MinAtar")
    obs_shape = env.observation_space(env_params).shape
    params, act = _jax_policy(obs_shape[-1], env.num_actions)

    def begin(key):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), env_params)
        return state, obs, key

    def rollout(params, carry):
        def body(carry, _):
            state, obs, key = carry
            key, ka, ks = jax.random.split(key, 3)
            if policy == "cnn":
                a = act(params, obs, ka)
            else:
                a = jax.random.randint(ka, (n,), 0, env.num_actions)
            obs, state, r, d, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(jax.random.split(ks, n), state, a,
                                                                               env_params)
            return (state, obs, key), (obs, r, d)

        return jax.lax.scan(body, carry, None, length=steps)

    f = jax.jit(rollout)
    carry = jax.block_until_ready(jax.jit(begin)(jax.random.PRNGKey(0)))
    t0 = time.perf_counter()
    carry, stored = f(params, carry)
    jax.block_until_ready(stored)
    first = time.perf_counter() - t0
    rollouts, start = 0, time.perf_counter()
    while True:
        del stored  # the buffer of one scan at a time: at 2^20 envs it is gigabytes
        carry, stored = f(params, carry)
        jax.block_until_ready(stored)
        rollouts += 1
        elapsed = time.perf_counter() - start
        if elapsed >= args.seconds:
            return {"env_steps_per_s": n * steps * rollouts / elapsed, "first_step_s": first}


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


def configs_of(args) -> dict[str, Config]:
    """Every configuration of ``args``: per env count and policy, the rows not in ``--skip``; the reference once; the
    CUDA-graph batcher with ``--device cuda``."""
    out: dict[str, Config] = {}
    for n in args.envs:
        for policy in args.policies:
            tail = f"{args.game} N={n}" + (", CNN policy" if policy == "cnn" else "")
            label = {"torch": f"rlstruct torch {tail}", "eager": f"rlstruct torch, eager {tail}",
                     "compiled": f"rlstruct torch, compiled {tail}", "into": f"rlstruct torch step_into {tail}",
                     "gymnax": f"gymnax {tail}", "adapter": f"rlstruct gymnax adapter {tail}"}
            gymnax, eager = ("gymnax", label["gymnax"]), ("eager", label["eager"])
            reference = (("reference", REF),) if policy == "none" else ()
            rows = {
                "torch": Config(lambda n=n, p=policy: measure_torch(args, n, p), (gymnax, *reference, eager)),
                "eager": Config(lambda n=n, p=policy: measure_torch(args, n, p, "eager"), (gymnax, *reference)),
                "compiled": Config(lambda n=n, p=policy: measure_torch(args, n, p, "compiled"), (gymnax, eager)),
                "gymnax": Config(lambda n=n, p=policy: measure_gymnax(args, n, p)),
                "adapter": Config(lambda n=n, p=policy: measure_adapter(args, n, p), (gymnax,)),
            }
            if policy == "none":
                rows["into"] = Config(lambda n=n: measure_step_into(args, n), (gymnax, *reference))
            out.update({label[key]: config for key, config in rows.items() if key not in args.skip})
    if "reference" not in args.skip:
        out[REF] = Config(lambda: measure_reference(args))
    if args.device.startswith("cuda") and "graph" not in args.skip:
        out[f"rlstruct torch RL_Batcher cuda_graph N={args.gpu_envs} T={args.gpu_steps}"] = Config(
            lambda: measure_graph(args))
    return out


def _note(run: dict) -> str:
    first = run.get("first_step_s")
    return " ".join(x for x in (run.get("kernel", ""), "" if first is None else f"first {first:.1f} s") if x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--game", default="Breakout",
                        help="Asterix, Breakout, Freeway, Seaquest or SpaceInvaders (gymnasium's spelling)")
    parser.add_argument("--envs", type=int, nargs="+", default=[4096], help="env counts, each a row of its own")
    parser.add_argument("--policies", nargs="+", default=["none"], choices=["none", "cnn"],
                        help="none: random actions (the step alone); cnn: the MinAtar CNN in the loop")
    parser.add_argument("--steps", type=int, default=100, help="steps of the buffer (T), filled per rollout")
    parser.add_argument("--seconds", type=float, default=0.0, help="repeat the rollouts for at least this long")
    parser.add_argument("--ref-envs", type=int, default=64)
    parser.add_argument("--ref-steps", type=int, default=100)
    parser.add_argument("--cores", type=int, default=None, help="pin each process to this many cores and threads")
    parser.add_argument("--device", default="cpu", help="cuda: add the CUDA-graph batcher row")
    parser.add_argument("--gpu-envs", type=int, default=2**20)
    parser.add_argument("--gpu-steps", type=int, default=16)
    parser.add_argument("--iters", type=int, default=5, help="acquisitions timed in the CUDA-graph row")
    parser.add_argument("--skip", nargs="*", default=[], choices=["torch", "eager", "compiled", "into", "gymnax",
                                                                   "adapter", "reference", "graph"])
    add_arguments(parser)
    args = parser.parse_args(argv)
    compiled_cpu_steps()
    configs = configs_of(args)
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        print_results(results, configs, "env_steps_per_s", note=_note)


if __name__ == "__main__":
    main()
