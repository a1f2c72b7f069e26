"""rlstruct beside the libraries a user would pick instead, every configuration in a fresh process.

Part ``collect``: env steps per second of collecting CartPole-v1 experience with one policy (an MLP 4-64-64-2 whose
softmax is sampled, torch, one thread per process) into ``T = 128``-step storage, the same for every library:

- 64 envs on 2 worker processes: ``RL_Batcher`` (2 processes x 32 gymnasium envs) against gymnasium's
  ``SyncVectorEnv(64)`` in one process, gymnasium's ``AsyncVectorEnv(64)`` (one process per env: its only layout),
  EnvPool's C++ CartPole (64 envs, 2 threads), TorchRL's ``MultiSyncCollector`` (2 workers x ``SerialEnv(32)``) and
  pufferlib's ``Multiprocessing`` vector env (2 workers x 32). The loops written here store observations, actions,
  rewards and dones into preallocated ``[T, N]`` tensors; ``RL_Batcher`` fills its own buffer and hands out
  ``Trajectories``; TorchRL's collector fills its own TensorDict.
- 4,096 envs in one process: ``RL_Batcher(n_processes=0)`` on rlstruct's torch CartPole, with the default copies
  out of its buffer and with ``zero_copy=True``, against gymnasium's numpy ``CartPoleVectorEnv(4096)`` loop and EnvPool
  (4,096 envs, 2 threads).

Part ``solve``: launch to an evaluation of 475 on CartPole-v1 (a fresh process per seed): ``rlstruct train ppo`` and
``rlstruct train a2c`` with no flags, rejax's PPO with its tuned CartPole config (gymnax's CartPole, compiled by JAX,
trained in chunks of ``eval_freq`` steps so that it stops at the target like the others; the compile is reported
apart), and Stable-Baselines3's PPO with its defaults (``benchmarks/sb3_reference.py``'s loop).

A peer that is not installed is skipped (``pip install -e '.[peers]'`` installs them all: torchrl, envpool,
pufferlib-core, rejax, stable-baselines3).

Usage::

    python benchmarks/peers.py [--part collect|solve|all] [--rounds 3] [--iters 5] [--seeds 0,1,2,3,4]
    python benchmarks/peers.py --one NAME [--iters N] [--seed S]   # one configuration, in this process (the harness)
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
from _fresh import compiled_cpu_steps, machine, med_range, rotated_rounds

T = 128
TARGET = 475.0
HERE = Path(__file__).resolve().parent


# --- the policy and the storage every collection loop shares -------------------------------------------------------

# torch is imported inside the functions: the solve part's peers (rejax) must not pay for its import.

def mlp():
    """The MLP 4-64-64-2 of every configuration, seeded."""
    from _peer_policies import SampledMLP

    return SampledMLP().model


def sample(model, obs):
    """One action per row (``int64 [N]``) from the softmax of ``model(obs)``, ``obs: [N, 4]``."""
    import torch

    with torch.no_grad():
        return torch.multinomial(torch.softmax(model(obs.float()), -1), 1).squeeze(1)


class Storage:
    """``[T, N]`` tensors of observations, actions, rewards and dones, written one step at a time."""

    def __init__(self, n: int):
        import torch

        self.obs = torch.zeros(T, n, 4)
        self.action = torch.zeros(T, n, dtype=torch.int64)
        self.reward = torch.zeros(T, n)
        self.done = torch.zeros(T, n, dtype=torch.bool)

    def write(self, t: int, obs, action, reward, terminated, truncated) -> None:
        import torch

        self.obs[t] = torch.as_tensor(obs)
        self.action[t] = action
        self.reward[t] = torch.as_tensor(reward)
        self.done[t] = torch.as_tensor(np.logical_or(terminated, truncated))


def numpy_vector_loop(env, n: int, iters: int) -> float:
    """Env steps/s of ``iters`` acquisitions of ``T`` steps of a gymnasium-API vector env, after one untimed one."""
    import torch

    model, store = mlp(), Storage(n)
    obs, _ = env.reset(seed=0)
    t0 = 0.0
    for it in range(iters + 1):
        if it == 1:
            t0 = time.perf_counter()
        for t in range(T):
            action = sample(model, torch.as_tensor(obs))
            next_obs, reward, terminated, truncated, _ = env.step(action.numpy())
            store.write(t, obs, action, reward, terminated, truncated)
            obs = next_obs
    sps = n * T * iters / (time.perf_counter() - t0)
    env.close()
    return sps


# --- collection configurations -------------------------------------------------------------------------------------

def gym_cartpoles(n_envs: int, seed: int):
    """A worker's env for ``RL_Batcher``: ``n_envs`` gymnasium CartPoles stepped one by one (as SyncVectorEnv does)."""
    import gymnasium as gym

    from rlstruct.envs import GymEnvInf

    return GymEnvInf([gym.make("CartPole-v1") for _ in range(n_envs)], seed)


class MLPAgent:
    """The shared policy as an rlstruct agent (built in each worker)."""

    def __new__(cls, *args, **kwargs):
        from rlstruct import DictTensor, RL_Agent

        class _Agent(RL_Agent):
            def __init__(self):
                self.model = mlp()

            def __call__(self, state, observation, agent_info, history=None):
                return DictTensor._trusted({"action": sample(self.model, observation["frame"])}), state

        return _Agent()


def rlstruct_batcher(iters: int, **kwargs) -> float:
    import sys as _sys

    _sys.path.insert(0, str(HERE))
    from _common import batcher_steps_per_s

    from rlstruct.batchers import RL_Batcher

    with RL_Batcher(T, create_agent, {}, **kwargs) as b:
        return batcher_steps_per_s(b, iters, warmup=1)


def create_agent():
    return MLPAgent()


def torch_cartpole(n_envs: int, seed: int):
    from rlstruct.envs import make_env

    return make_env("CartPole-v1", n_envs, seed=seed, autoreset=True)


def collect_rlstruct_2x32(iters: int) -> float:
    return rlstruct_batcher(iters, create_env=gym_cartpoles, env_args={"n_envs": 32}, n_processes=2,
                            seeds=[0, 1])


def collect_gym_sync_64(iters: int) -> float:
    import gymnasium as gym

    return numpy_vector_loop(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(64)]), 64, iters)


def collect_gym_async_64(iters: int) -> float:
    import gymnasium as gym

    return numpy_vector_loop(gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(64)]), 64,
                             iters)


def collect_envpool_64(iters: int) -> float:
    import envpool

    return numpy_vector_loop(envpool.make("CartPole-v1", env_type="gymnasium", num_envs=64, num_threads=2, seed=0),
                             64, iters)


def _puffer_cartpole(buf=None, seed=0):
    import gymnasium as gym
    import pufferlib.emulation

    return pufferlib.emulation.GymnasiumPufferEnv(env=gym.make("CartPole-v1"), buf=buf, seed=seed)


def collect_pufferlib_2x32(iters: int) -> float:
    import pufferlib.vector

    env = pufferlib.vector.make(_puffer_cartpole, backend=pufferlib.vector.Multiprocessing, num_envs=64,
                                num_workers=2)
    return numpy_vector_loop(env, 64, iters)


def _torchrl_serial_32():
    from torchrl.envs import GymEnv, SerialEnv

    return SerialEnv(32, lambda: GymEnv("CartPole-v1", categorical_action_encoding=True))


def collect_torchrl_2x32(iters: int) -> float:
    from _peer_policies import SampledMLP
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import MultiSyncCollector

    policy = TensorDictModule(SampledMLP(), in_keys=["observation"], out_keys=["action"])
    collector = MultiSyncCollector([_torchrl_serial_32, _torchrl_serial_32], policy, frames_per_batch=64 * T,
                                   total_frames=-1)
    frames, t0 = 0, 0.0
    try:
        for it, batch in enumerate(collector):
            if it == 1:
                t0 = time.perf_counter()
            elif it > 1:
                frames += batch.numel()
            if it == iters + 1:
                break
        # frames collected between the first timed batch's start and the last one's end
        return (frames + 64 * T) / (time.perf_counter() - t0)
    finally:
        collector.shutdown()


def collect_rlstruct_4096(iters: int) -> float:
    return rlstruct_batcher(iters, create_env=torch_cartpole, env_args={"n_envs": 4096}, n_processes=0, seeds=[0])


def collect_rlstruct_4096_zero_copy(iters: int) -> float:
    return rlstruct_batcher(iters, create_env=torch_cartpole, env_args={"n_envs": 4096}, n_processes=0, seeds=[0],
                            zero_copy=True)


def collect_gym_vector_4096(iters: int) -> float:
    import gymnasium as gym

    return numpy_vector_loop(gym.make_vec("CartPole-v1", 4096, vectorization_mode="vector_entry_point"), 4096, iters)


def collect_envpool_4096(iters: int) -> float:
    import envpool

    return numpy_vector_loop(envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4096, num_threads=2, seed=0),
                             4096, iters)


COLLECT: dict[str, Callable[[int], float]] = {
    "rlstruct RL_Batcher 2 procs x 32": collect_rlstruct_2x32,
    "gymnasium SyncVectorEnv(64)": collect_gym_sync_64,
    "gymnasium AsyncVectorEnv(64)": collect_gym_async_64,
    "EnvPool 64 envs, 2 threads": collect_envpool_64,
    "TorchRL MultiSyncCollector 2 x SerialEnv(32)": collect_torchrl_2x32,
    "pufferlib Multiprocessing 2 x 32": collect_pufferlib_2x32,
    "rlstruct RL_Batcher in process N=4096": collect_rlstruct_4096,
    "rlstruct RL_Batcher in process zero_copy N=4096": collect_rlstruct_4096_zero_copy,
    "gymnasium CartPoleVectorEnv N=4096": collect_gym_vector_4096,
    "EnvPool 4096 envs, 2 threads": collect_envpool_4096,
}
#: the row each collection row is compared with
COLLECT_BASE = {name: "gymnasium SyncVectorEnv(64)" for name in list(COLLECT)[:6]} | {
    name: "gymnasium CartPoleVectorEnv N=4096" for name in list(COLLECT)[6:]}


# --- time to solve -------------------------------------------------------------------------------------------------

def solve_rlstruct(algo: str, seed: int, launch: float) -> dict[str, float]:
    """``rlstruct train ALGO --env CartPole-v1 --seed SEED`` with no other flag, as a user launches it (its own
    process: the launch is its start, and ``summary.json`` says when the target was reached, from that start)."""
    launch = time.time()
    exe = Path(sys.executable).with_name("rlstruct")
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run([str(exe), "train", algo, "--env", "CartPole-v1", "--seed", str(seed), "--logdir", d,
                               "--no-progress"], capture_output=True, text=True)
        end = time.time()
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        summary = json.loads(Path(d, "summary.json").read_text())
        with open(Path(d, "progress.csv")) as f:
            evals = [r for r in csv.DictReader(f) if r.get("eval/return")]
    # The evaluation of the untrained network does not count (a random network can balance CartPole by luck): the
    # run's own rule, and the env steps its weights were trained for.
    hit = next((r for r in evals if float(r["eval/return"]) >= TARGET and float(r["eval/launch_env_steps"]) > 0),
               None)
    out = {"launch_to_exit_s": end - launch, "eval_return": summary["eval_return"],
           "startup_s": summary.get("startup_s")}
    if hit is not None:
        # Without the summary's own figure: the time before train() (and after it: the exit, an over-estimate of
        # well under 0.1 s) from launch-to-exit less the run's wall time, plus the training clock at the target.
        before = end - launch - summary["wall_time_s"]
        out |= {"train_clock_to_target_s": float(hit["wall_time_s"]),
                "env_steps_to_target": int(float(hit["eval/launch_env_steps"])),
                "launch_to_target_s": summary.get("time_to_target_s", before + float(hit["wall_time_s"]))}
    return out


def solve_rejax(seed: int, launch: float) -> dict[str, float]:
    """rejax's PPO, its tuned gymnax CartPole config (rejax's configs/gymnax/cartpole.yaml), trained ``eval_freq``
    steps at a time by one compiled function and stopped at the first evaluation at the target."""
    import jax
    from rejax import PPO

    config = {"env": "CartPole-v1", "agent_kwargs": {"activation": "tanh"}, "num_envs": 5, "num_steps": 100,
              "num_epochs": 5, "num_minibatches": 5, "learning_rate": 0.00075, "max_grad_norm": 0.5,
              "total_timesteps": 1000, "eval_freq": 1000, "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.2,
              "ent_coef": 0.01, "vf_coef": 0.5, "skip_initial_evaluation": True}
    t_import = time.time()
    algo = PPO.create(**config)
    # One compiled function trains eval_freq steps from a state and evaluates (128 episodes): one compile in all.
    chunk = jax.jit(lambda ts: algo.train(train_state=ts))
    t0 = time.time()
    state = algo.init_state(jax.random.PRNGKey(seed))
    state, (_, returns) = chunk(state)
    mean = float(np.asarray(returns).mean())  # waits for the device
    compile_and_first = time.time() - t0
    steps = config["eval_freq"]
    while mean < TARGET and steps < 100_000:
        state, (_, returns) = chunk(state)
        mean = float(np.asarray(returns).mean())
        steps += config["eval_freq"]
    hit_at = time.time() if mean >= TARGET else None
    out = {"import_s": t_import - launch, "compile_and_first_chunk_s": compile_and_first, "eval_return": mean}
    if hit_at is not None:
        out |= {"launch_to_target_s": hit_at - launch, "train_clock_to_target_s": hit_at - t0,
                "env_steps_to_target": steps}
    return out


def solve_sb3(seed: int, launch: float) -> dict[str, float]:
    """Stable-Baselines3's PPO with its defaults, evaluated every 10k steps on 16 deterministic episodes."""
    import gymnasium as gym
    import torch
    from _common import logging_nowhere
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    t0 = time.time()
    model = logging_nowhere(PPO("MlpPolicy", gym.make("CartPole-v1"), seed=seed, device="cpu"))
    eval_env = gym.make("CartPole-v1")
    reached: dict[str, float] = {}

    class StopAtTarget(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % 10_000:
                return True
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=16, deterministic=True)
            if mean >= TARGET:
                reached.update(launch_to_target_s=time.time() - launch, train_clock_to_target_s=time.time() - t0,
                               env_steps_to_target=self.num_timesteps)
                return False
            return True

    model.learn(200_000, callback=StopAtTarget())
    return {"import_s": t0 - launch, **reached}


SOLVE = {
    "rlstruct ppo": lambda seed, launch: solve_rlstruct("ppo", seed, launch),
    "rlstruct a2c": lambda seed, launch: solve_rlstruct("a2c", seed, launch),
    "rejax PPO (JAX)": solve_rejax,
    "Stable-Baselines3 PPO": solve_sb3,
}


# --- the harness ---------------------------------------------------------------------------------------------------

def one(name: str, iters: int, seed: int) -> dict:
    """Measures configuration ``name`` in this process (launched at this interpreter's start)."""
    launch = psutil.Process().create_time()
    if name in COLLECT:
        compiled_cpu_steps()  # the solve part runs what a user gets: the numpy kernels first
        import torch

        torch.set_num_threads(1)
        return {"name": name, "env_steps_per_s": COLLECT[name](iters)}
    return {"name": name, "seed": seed, **SOLVE[name](seed, launch)}


def report_collect(results: dict[str, list[dict]]) -> None:
    print("\n| configuration | env steps/s, median [range] | ratio to the baseline row (median) |")
    print("|---|---:|---:|")
    medians = {n: float(np.median([r["env_steps_per_s"] for r in v])) for n, v in results.items()}
    for name, rows in results.items():
        base = COLLECT_BASE[name]
        ratio = f"{medians[name] / medians[base]:.2f}x {base}" if base in medians and base != name else "baseline"
        print(f"| {name} | {med_range([r['env_steps_per_s'] for r in rows])} | {ratio} |")


def report_solve(results: dict[str, list[dict]]) -> None:
    print("\n| library | reached | launch -> target, s | training clock -> target, s | env steps to target |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in results.items():
        hit = [r for r in rows if r.get("env_steps_to_target") is not None]
        launch = [r["launch_to_target_s"] for r in hit if r.get("launch_to_target_s") is not None]
        clock = [r["train_clock_to_target_s"] for r in hit]
        steps = [r["env_steps_to_target"] for r in hit]
        print(f"| {name} | {len(hit)}/{len(rows)} | {med_range(launch, '{:.1f}')} | {med_range(clock, '{:.1f}')} | "
              f"{med_range(steps)} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["collect", "solve", "all"], default="all")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the collection part (order rotated each round)")
    p.add_argument("--iters", type=int, default=5, help="timed acquisitions of T=128 steps per collection run")
    p.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the solve part, one fresh process each")
    p.add_argument("--only", default=None, help="comma-separated configuration names to run (default: all)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one, args.iters, args.seed)), flush=True)
        return
    only = None if args.only is None else set(args.only.split(","))
    print(f"machine: {machine()}")
    if args.part in ("collect", "all"):
        names = [n for n in COLLECT if only is None or n in only]
        report_collect(rotated_rounds(__file__, names, args.rounds, ["--iters", str(args.iters)]))
    if args.part in ("solve", "all"):
        names = [n for n in SOLVE if only is None or n in only]
        results: dict[str, list[dict]] = {n: [] for n in names}
        for seed in (int(s) for s in args.seeds.split(",")):
            part = rotated_rounds(__file__, names, 1, ["--seed", str(seed)])
            for n, v in part.items():
                results[n] += v
        report_solve({n: v for n, v in results.items() if v})


if __name__ == "__main__":
    main()
