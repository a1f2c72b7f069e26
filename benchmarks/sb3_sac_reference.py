"""Stable-Baselines3 SAC on Pendulum-v1 with the same env-step budget as ``sac-pendulum-torch``.

The reference for ``benchmarks/learning.py``'s SAC suite: SB3's ``SAC`` with rl-baselines3-zoo's Pendulum-v1
settings (``hyperparams/sac.yml``: ``n_timesteps: 20000``, ``policy: MlpPolicy``, ``learning_rate: 1e-3``;
SB3's defaults otherwise: 256-256 ReLU networks, buffer 1e6, batch 256, ``learning_starts`` 100, tau 0.005,
gamma 0.99, one gradient step per env step, automatic entropy temperature) on gymnasium's ``Pendulum-v1``,
one env, on the CPU.

Every ``--eval-every`` env steps a callback evaluates the deterministic policy on ``--eval-episodes`` fresh
episodes. The wall clock it reports excludes those evaluations (SB3 is timed training only), so **time to
target** is the training time until the first evaluation at or above the target (-200). ``cpu_s`` and
``reached_cpu_s`` are the same in CPU seconds of the process (evaluations excluded): on a machine shared with
other jobs they move far less than the wall clock (one torch thread: on an idle machine the two are about equal).

Usage::

    python benchmarks/sb3_sac_reference.py --seeds 0,1,2,3,4 --json sb3_sac.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

TARGET = -200.0
ZOO_PENDULUM = {"policy": "MlpPolicy", "learning_rate": 1e-3}


def run_sb3_sac(seed: int, *, total_timesteps: int = 20_000, eval_every: int = 1_000, eval_episodes: int = 16,
                target: float = TARGET) -> dict:
    """Trains SB3 SAC on Pendulum-v1 for ``total_timesteps`` env steps; returns its evaluations and timings.

    Returns:
        ``{"seed", "final_return", "train_s", "cpu_s", "reached", "reached_train_s", "reached_cpu_s",
        "reached_env_steps", "evals"}``, ``evals`` a list of ``(env_steps, mean return, training seconds so far,
        training CPU seconds so far)``.
    """
    import gymnasium as gym
    from _common import logging_nowhere
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    eval_env = gym.make("Pendulum-v1")

    class Evaluations(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.evals: list[tuple[int, float, float, float]] = []
            self.eval_s = self.eval_cpu_s = 0.0
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def evaluate(self) -> None:
            t, cpu = time.perf_counter(), time.process_time()
            trained_s, trained_cpu_s = t - self.start - self.eval_s, cpu - self.cpu_start - self.eval_cpu_s
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
            self.eval_s += time.perf_counter() - t
            self.eval_cpu_s += time.process_time() - cpu
            self.evals.append((self.num_timesteps, float(mean), trained_s, trained_cpu_s))

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                self.evaluate()
            return True

    callback = Evaluations()
    model = logging_nowhere(SAC(env=gym.make("Pendulum-v1"), seed=seed, device="cpu", verbose=0, **ZOO_PENDULUM))
    model.learn(total_timesteps=total_timesteps, callback=callback)
    train_s = time.perf_counter() - callback.start - callback.eval_s
    # CPU seconds move far less than the wall clock with a shared machine's load (evaluations excluded too).
    cpu_s = time.process_time() - callback.cpu_start - callback.eval_cpu_s
    if not callback.evals or callback.evals[-1][0] != model.num_timesteps:
        callback.evaluate()
    reached = next((e for e in callback.evals if e[1] >= target), None)
    return {
        "seed": seed,
        "final_return": callback.evals[-1][1],
        "train_s": round(train_s, 1),
        "cpu_s": round(cpu_s, 1),
        "reached": reached is not None,
        "reached_train_s": round(reached[2], 1) if reached else None,
        "reached_cpu_s": round(reached[3], 1) if reached else None,
        "reached_env_steps": reached[0] if reached else None,
        "evals": [(n, round(r, 1), round(s, 1), round(c, 1)) for n, r, s, c in callback.evals],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per run (default: 20000)")
    parser.add_argument("--eval-every", type=int, default=1_000, help="env steps between evaluations (default: 1000)")
    parser.add_argument("--eval-episodes", type=int, default=16, help="episodes per evaluation (default: 16)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch threads, as rlstruct's runs (default: 1; 0 keeps torch's default)")
    parser.add_argument("--json", default=None, help="also write every run's numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    import stable_baselines3

    print(f"# stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__}, CPython "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
          f"load average at start {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        r = run_sb3_sac(seed, total_timesteps=args.steps, eval_every=args.eval_every, eval_episodes=args.eval_episodes)
        r["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        results.append(r)
        print(json.dumps(r), flush=True)
    ok = [r for r in results if r["reached"]]
    print(f"reached {TARGET:g}: {len(ok)}/{len(results)}; time to target (s, training only) median "
          f"{statistics.median([r['reached_train_s'] for r in ok]) if ok else '-'}; env steps to target median "
          f"{statistics.median([r['reached_env_steps'] for r in ok]) if ok else '-'}; final return median "
          f"{statistics.median([r['final_return'] for r in results]):.1f}; {args.steps} steps in (s) median "
          f"{statistics.median([r['train_s'] for r in results]):.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
