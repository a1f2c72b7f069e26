"""Collection throughput of RL_Batcher against hand-written loops, same run, side by side.

An MLP 4-64-64-2 policy samples actions; T = 128 steps per acquisition.

(a) RL_Batcher, 2 worker processes x 32 gymnasium CartPole-v1 envs, against one process stepping a
    gymnasium SyncVectorEnv over the same 64 envs with the same policy.
(b) RL_Batcher in the calling process (n_processes=0) on the torch CartPole (auto-reset) at several N,
    against a hand-written loop over the same env and policy, and against gymnasium's CartPoleVectorEnv;
    with the default copies out of the buffer, and with ``zero_copy=True`` (views of a double buffer).
(c) With --device cuda: the same as (b) on the GPU, N up to 2^20, the batcher with and without
    ``cuda_graph=True`` (agent + env step + buffer writes of a whole acquisition replayed as one CUDA graph),
    and one GPU worker process (n_processes=1) with the graph at the largest N.

With ``--policy-dtype bfloat16`` every loop's policy computes under ``torch.autocast`` in bfloat16 (the
training batcher's policy of ``rlstruct train --autocast bfloat16``); with ``--compile-policy`` every loop's policy
step (forward, softmax, draw) is compiled by ``torch.compile`` (``rlstruct train --compile-policy``).

Every row runs in a fresh process (``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated from round to
round; the table gives the median and the range, and each ratio is of medians, with the range of the same-round
ratios. The batchers call ``rlstruct.allocator.tune_allocator()`` in the process that runs their envs, as they do for
every user; the hand-written and gymnasium loops run with glibc's defaults, as a user's own loop does.

Run: python benchmarks/batchers.py [--iters 5] [--rounds 3] [--device cpu] [--sizes 1024 4096] [--skip-processes]
     [--sync-timings] [--physics-dtype float32] [--policy-dtype bfloat16] [--compile-policy]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gymnasium as gym
import torch
from _common import batcher_steps_per_s
from _fresh import Config, add_arguments, compiled_cpu_steps, measure_or_rounds, print_results
from torch import nn

from rlstruct import DictTensor, RL_Agent
from rlstruct.algos.networks import autocast_context
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import CartPole, GymEnvInf, make_env

T = 128


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))


def sample(model: nn.Module, frame: torch.Tensor, autocast: torch.dtype | None) -> torch.Tensor:
    """One action per row from the softmax of ``model(frame)``, the forward under ``autocast`` (``None``: none)."""
    with autocast_context(frame.device, autocast):
        logits = model(frame.float())
    return torch.multinomial(torch.softmax(logits.float(), -1), 1).squeeze(1)


COMPILE_POLICY = False  # --compile-policy


def policy_step(model: nn.Module, autocast: torch.dtype | None, compile: bool):
    """``frame -> action`` of ``model`` (see :func:`sample`), compiled with ``compile``."""
    def step(frame: torch.Tensor) -> torch.Tensor:
        return sample(model, frame, autocast)
    return torch.compile(step) if compile else step


class MLPAgent(RL_Agent):
    """Samples from the softmax of an MLP over ``frame``."""

    def __init__(self, device: str = "cpu", autocast: torch.dtype | None = None, compile: bool = False):
        self.model = mlp().to(device)
        self.step = policy_step(self.model, autocast, compile)

    def __call__(self, state, observation, agent_info, history=None):
        action = self.step(observation["frame"])
        return DictTensor._trusted({"action": action}), state

    def update(self, state_dict):
        self.model.load_state_dict(state_dict)


def gym_list_env(n_envs: int, seed: int):
    """Worker k's env for (a): a list of gymnasium envs, stepped one by one like SyncVectorEnv."""
    return GymEnvInf([gym.make("CartPole-v1") for _ in range(n_envs)], seed)


PHYSICS_DTYPE = torch.float64  # --physics-dtype
POLICY_DTYPE: torch.dtype | None = None  # --policy-dtype (None: float32)


def torch_env(n_envs: int, seed: int, device: str = "cpu", compile: bool = False, physics_dtype=None):
    physics_dtype = PHYSICS_DTYPE if physics_dtype is None else physics_dtype
    if compile:  # the step fused by torch.compile
        return CartPole(n_envs, device=device, seed=seed, autoreset=True, compile=True, physics_dtype=physics_dtype)
    return make_env("CartPole-v1", n_envs, device=device, seed=seed, autoreset=True,
                    backend_kwargs={"physics_dtype": physics_dtype})


def bench_batcher(batcher: RL_Batcher, iters: int) -> tuple[float, dict]:
    """``(env steps/s, timings())`` of ``iters`` acquisitions after two warm-up ones (see ``batcher_steps_per_s``)."""
    return batcher_steps_per_s(batcher, iters, warmup=2), batcher.timings()


def bench_sync_vector_env(n_envs: int, iters: int) -> float:
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_envs)])
    return _numpy_loop(env, n_envs, iters)


def bench_gym_vector(n_envs: int, iters: int) -> float:
    env = gym.make_vec("CartPole-v1", n_envs, vectorization_mode="vector_entry_point")
    return _numpy_loop(env, n_envs, iters)


@torch.no_grad()
def _numpy_loop(env, n_envs: int, iters: int) -> float:
    step = policy_step(mlp(), POLICY_DTYPE, COMPILE_POLICY)
    obs, _ = env.reset(seed=0)
    t0 = None
    for it in range(iters + 1):
        if it == 1:
            t0 = time.perf_counter()
        for _ in range(T):
            action = step(torch.from_numpy(obs))
            obs, *_ = env.step(action.numpy())
    env.close()
    return n_envs * T * iters / (time.perf_counter() - t0)


@torch.no_grad()
def bench_hand_loop(n_envs: int, iters: int, device: str) -> float:
    """The same torch env and policy, stepped by a minimal loop that stores nothing."""
    env = torch_env(n_envs, 0, device)
    agent = MLPAgent(device, POLICY_DTYPE, COMPILE_POLICY)
    obs, _ = env.reset()
    t0 = None
    for it in range(iters + 1):
        if it == 1:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        for _ in range(T):
            action, _ = agent(None, obs, None)
            _, (obs, _) = env.step(action)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return n_envs * T * iters / (time.perf_counter() - t0)


def fmt_timings(t: dict) -> str:
    keys = ("agent_forward", "env_step", "buffer_write", "graph_replay", "copy", "wait", "gather")
    total = sum(t[k] for k in keys) or 1.0
    return " ".join(f"{k}={100 * t[k] / total:.0f}%" for k in keys if t[k] > 0 or k != "graph_replay")


def timings_note(run: dict) -> str:
    """A fresh-process run's ``timings()`` shares (nothing for the loops without a batcher)."""
    return fmt_timings(run["timings"]) if "timings" in run else ""


SYNC_TIMINGS = False  # --sync-timings: exact GPU phase shares, at one device sync per phase


def batcher_on(
    device: str, n: int, n_processes: int = 0, cuda_graph: bool = False, compile: bool = False, zero_copy: bool = False
) -> RL_Batcher:
    env_args = {"n_envs": n, "device": device, "compile": compile, "physics_dtype": PHYSICS_DTYPE}
    return RL_Batcher(T, MLPAgent, {"device": device, "autocast": POLICY_DTYPE, "compile": COMPILE_POLICY},
                      torch_env, env_args,
                      n_processes, [0], device=device, cuda_graph=cuda_graph, sync_timings=SYNC_TIMINGS,
                      zero_copy=zero_copy)


def measured(sps_and_timings: tuple[float, dict]) -> dict:
    sps, timings = sps_and_timings
    return {"env_steps_per_s": sps, "timings": timings}


def configurations(args: argparse.Namespace) -> dict[str, Config]:
    """Every row of the table, in order (the same in the parent and in each fresh process)."""
    configs: dict[str, Config] = {}
    iters, device = args.iters, args.device
    if not args.skip_processes:
        sync = "(a) gymnasium SyncVectorEnv(64), 1 process"

        def two_workers() -> dict:
            with RL_Batcher(T, MLPAgent, {"autocast": POLICY_DTYPE, "compile": COMPILE_POLICY}, gym_list_env,
                            {"n_envs": 32}, 2, [0, 1]) as b:
                return measured(bench_batcher(b, iters))

        configs[sync] = Config(lambda: {"env_steps_per_s": bench_sync_vector_env(64, iters)})
        configs["(a) RL_Batcher 2 procs x 32 envs"] = Config(two_workers, (("SyncVectorEnv(64)", sync),))

    def batcher_row(n: int, **kwargs) -> Callable[[], dict]:
        def measure() -> dict:
            with batcher_on(device, n, **kwargs) as b:
                return measured(bench_batcher(b, iters))
        return measure

    part = "(b)" if device == "cpu" else "(c)"
    on_gpu = device != "cpu"
    for n in args.sizes:
        hand, gvec = f"{part} hand-written loop, torch CartPole N={n}", f"{part} gymnasium CartPoleVectorEnv N={n}"
        eager = f"{part} RL_Batcher n_processes=0 N={n}"
        configs[hand] = Config(lambda n=n: {"env_steps_per_s": bench_hand_loop(n, iters, device)})
        if n <= 65536:  # gymnasium's numpy env on the host: beyond, minutes per row
            configs[gvec] = Config(lambda n=n: {"env_steps_per_s": bench_gym_vector(n, iters)})
        configs[eager] = Config(batcher_row(n), (("hand", hand), ("gymnasium", gvec)))
        configs[f"{part} RL_Batcher n_processes=0 zero_copy N={n}"] = Config(
            batcher_row(n, zero_copy=True), (("default get()", eager), ("hand", hand), ("gymnasium", gvec)))
        if on_gpu:
            configs[f"{part} RL_Batcher n_processes=0 cuda_graph N={n}"] = Config(
                batcher_row(n, cuda_graph=True), (("eager batcher", eager), ("hand", hand)))
    if on_gpu:
        n = args.sizes[-1]
        graph = f"{part} RL_Batcher n_processes=0 cuda_graph N={n}"
        configs[f"{part} RL_Batcher n_processes=1 (GPU worker) cuda_graph N={n}"] = Config(
            batcher_row(n, n_processes=1, cuda_graph=True), (("in-process graph", graph),))
        # The env step fused by torch.compile, inside the graph (compiled once, in the first acquisition).
        configs[f"{part} RL_Batcher n_processes=0 cuda_graph, env compile=True N={n}"] = Config(
            batcher_row(n, cuda_graph=True, compile=True), (("eager-env graph", graph),))
    return configs


def main(argv: list[str] | None = None) -> None:
    compiled_cpu_steps()
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=5, help="acquisitions of T=128 steps timed per row")
    add_arguments(p)
    p.add_argument("--device", default="cpu", help="device for part (b)/(c)")
    p.add_argument("--sizes", type=int, nargs="*", default=None, help="env counts for part (b)")
    p.add_argument("--skip-processes", action="store_true", help="skip part (a), the worker-process comparison")
    p.add_argument("--sync-timings", action="store_true", help="exact GPU timings() shares (one sync per phase)")
    p.add_argument("--physics-dtype", default="float64", choices=["float64", "float32"],
                   help="the torch CartPole's physics precision (parts b and c)")
    p.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"],
                   help="the in-process policy's float32 matmuls (parts b and c; high: TF32 on the GPU)")
    p.add_argument("--policy-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the policy's forward under torch.autocast in bfloat16 (every loop, every part)")
    p.add_argument("--compile-policy", action="store_true",
                   help="the policy's step compiled by torch.compile (every loop, every part)")
    args = p.parse_args(argv)
    args.sizes = args.sizes or ([1024, 4096, 16384] if args.device == "cpu" else [1024, 16384, 262144, 1 << 20])
    torch.set_float32_matmul_precision(args.matmul_precision)
    global SYNC_TIMINGS, PHYSICS_DTYPE, POLICY_DTYPE, COMPILE_POLICY
    SYNC_TIMINGS = args.sync_timings
    PHYSICS_DTYPE = getattr(torch, args.physics_dtype)
    POLICY_DTYPE = None if args.policy_dtype == "float32" else getattr(torch, args.policy_dtype)
    COMPILE_POLICY = args.compile_policy
    torch.set_num_threads(1)
    configs = configurations(args)
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is not None:
        print_results(results, configs, "env_steps_per_s", note=timings_note)


if __name__ == "__main__":
    main()
