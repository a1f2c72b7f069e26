"""Stable-Baselines3 on the same workloads as ``benchmarks/learning.py``: the reference to compare with.

Each run trains one SB3 algorithm with the rl-baselines3-zoo hyper-parameters of its env (gymnasium's own
env, SB3's ``DummyVecEnv``), evaluates the deterministic policy on ``--eval-episodes`` episodes every
``--eval-every`` env steps (the evaluation's time counts, as in rlstruct's runs), and stops at the budget
(``--max-env-steps`` and/or ``--time-limit``) or, with ``--stop``, at the first evaluation at or above the
target. The clock starts before the model is built (so it includes the first optimizer's start-up, as
rlstruct's does). Reported per seed: time and env steps to target, the last evaluation within the budget.

With ``--logdir DIR`` each seed also writes a run folder, ``DIR/seed-S``, as an rlstruct run does, so that
``rlstruct compare`` and ``benchmarks/published.py`` read it beside rlstruct's runs: ``config.json`` (the algorithm,
env, seed and settings) first, ``progress.csv`` (a row per rollout with the training episodes that ended in it,
``train/episode_return`` and ``train/episode_length``, and a row per evaluation, ``eval/return``) as it trains, and
``summary.json`` (``eval_return``: the last evaluation; ``stop_reason``) last, each written whole, and after its
training the final model (``model.zip``, with ``vecnormalize.pkl``, the observation statistics, where it normalises).
SB3 keeps no checkpoint here: a run killed before its summary is not a result (``rlstruct compare`` lists it as such)
and is run again. ``--reevaluate RUN --episodes N`` evaluates a run folder's final model again on N fresh episodes
(deterministic, as the zoo evaluates) and prints what ``rlstruct eval`` prints, one JSON line.

Add a workload by adding its zoo hyper-parameters to ``ZOO`` (keyed by algorithm and env id).

Usage::

    python benchmarks/sb3_reference.py --algo ppo --env CartPole-v1 --target 475 --time-limit 60 --seeds 0,1,2,3,4
    python benchmarks/sb3_reference.py --algo ppo --env Pendulum-v1 --target -200 --max-env-steps 100000 --no-stop
    python benchmarks/sb3_reference.py --algo ppo --env HalfCheetah-v4 --max-env-steps 1000000 --eval-every 1000000 \
        --eval-episodes 8 --seeds 0,1,2 --logdir runs/published/sb3-ppo-halfcheetah-zoo
    python benchmarks/sb3_reference.py --reevaluate runs/published/sb3-ppo-halfcheetah-zoo/seed-0 --episodes 150
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks._common import logging_nowhere  # noqa: E402


def _linear(start: float):
    """rl-zoo's ``lin_<start>``: decays linearly from ``start`` to 0 over the zoo's n_timesteps."""
    return lambda progress_remaining: progress_remaining * start


#: (algo, env) -> (algorithm keyword arguments, n_envs, the zoo's n_timesteps); from rl-baselines3-zoo's
#: hyperparams/<algo>.yml
ZOO: dict[tuple[str, str], tuple[dict[str, Any], int, int]] = {
    ("ppo", "CartPole-v1"): ({"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                              "ent_coef": 0.0, "learning_rate": _linear(1e-3), "clip_range": _linear(0.2)}, 8, 100_000),
    ("ppo", "Pendulum-v1"): ({"n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10, "ent_coef": 0.0,
                              "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4},
                             4, 100_000),
    # MuJoCo: SB3's PPO defaults (2048 steps, 10 epochs of 64-step minibatches, lr 3e-4, gamma 0.99, GAE 0.95,
    # clip 0.2, no entropy bonus; CleanRL's ppo_continuous_action settings too) with VecNormalize (observations and
    # rewards), as the zoo's MuJoCo entries normalise.
    ("ppo", "Hopper-v5"): ({}, 1, 1_000_000),
    # rl-baselines3-zoo's ppo.yml entry for HalfCheetah (its v3; the v4 env here, as rlstruct's
    # ppo-halfcheetah-zoo preset): the seeds behind its one published run's 5,819.
    ("ppo", "HalfCheetah-v4"): ({"n_steps": 512, "batch_size": 64, "gamma": 0.98, "learning_rate": 2.0633e-05,
                                 "ent_coef": 0.000401762, "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.92,
                                 "max_grad_norm": 0.8, "vf_coef": 0.58096,
                                 "policy_kwargs": {"log_std_init": -2, "ortho_init": False,
                                                   "activation_fn": torch.nn.ReLU,
                                                   "net_arch": {"pi": [256, 256], "vf": [256, 256]}}},
                                1, 1_000_000),
}
#: the workloads whose envs SB3 wraps in VecNormalize (the evaluation then uses the training's observation statistics)
NORMALIZE = {("ppo", "Hopper-v5"), ("ppo", "HalfCheetah-v4")}


#: a run folder's final model and, where the envs are normalised, its VecNormalize statistics
MODEL_NAME, STATISTICS_NAME = "model.zip", "vecnormalize.pkl"
#: a run folder's progress.csv columns
COLUMNS = ("iteration", "env_steps", "wall_time_s", "train/episode_return", "train/episode_length", "eval/return")


class RunFolder:
    """One seed's run folder, written as rlstruct's runs write theirs (``config.json`` first, ``progress.csv`` row by
    row, ``summary.json`` last), so that ``rlstruct compare`` reads it: a folder without a summary is no result."""

    def __init__(self, folder: Path, config: dict[str, Any]):
        from rlstruct.algos._train.durable import write_whole
        from rlstruct.algos._train.run_folder import CONFIG_NAME, CSV_NAME

        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        write_whole(folder / CONFIG_NAME, json.dumps(config, indent=1, default=repr))
        self._file = open(folder / CSV_NAME, "w", newline="")  # noqa: SIM115 (closed by finish)
        self._csv = csv.DictWriter(self._file, COLUMNS, restval="")
        self._csv.writeheader()

    def row(self, **values: float) -> None:
        self._csv.writerow(values)
        self._file.flush()

    def finish(self, summary: dict[str, Any], model: Any, statistics: Any | None) -> None:
        """Closes ``progress.csv``, saves the final ``model`` (and the ``VecNormalize`` ``statistics``, if any),
        which ``--reevaluate`` evaluates again, then writes ``summary.json``, last."""
        from rlstruct.algos._train.durable import write_whole
        from rlstruct.algos._train.run_folder import SUMMARY_NAME

        os.fsync(self._file.fileno())
        self._file.close()
        model.save(self.folder / MODEL_NAME)
        if statistics is not None:
            statistics.save(str(self.folder / STATISTICS_NAME))
        write_whole(self.folder / SUMMARY_NAME, json.dumps(summary, indent=1))


def run_one(algo: str, env_id: str, seed: int, *, target: float | None, stop: bool, max_env_steps: int | None,
            time_limit: float | None, eval_every: int, eval_episodes: int,
            logdir: Path | None = None) -> dict[str, Any]:
    import gymnasium as gym
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    kwargs, n_envs, zoo_steps = ZOO[(algo, env_id)]
    t0 = time.perf_counter()
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    normalize = (algo, env_id) in NORMALIZE
    if normalize:
        env = VecNormalize(env)
        eval_env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=10_000 + seed), training=False, norm_reward=False)
    else:
        eval_env = gym.make(env_id)
        eval_env.reset(seed=10_000 + seed)
    model = logging_nowhere(getattr(sb3, algo.upper())("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **kwargs))
    evals: list[dict[str, float]] = []
    folder = None
    if logdir is not None:
        folder = RunFolder(logdir / f"seed-{seed}", {
            "algo": f"sb3-{algo}", "env": env_id, "seed": seed, "library": f"stable-baselines3 {sb3.__version__}",
            "n_envs": n_envs, "vec_normalize": normalize, "max_env_steps": max_env_steps, "time_limit": time_limit,
            "eval_every": eval_every, "eval_episodes": eval_episodes, "settings": kwargs})

    class Budget(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval = eval_every
            self.rollouts = 0
            self.episodes: list[tuple[float, float]] = []  # (return, length) of those that ended in this rollout
            self.stop_reason = "budget"

        def _on_step(self) -> bool:
            steps = self.num_timesteps
            # the Monitor inside the VecNormalize reports each finished episode's raw return
            self.episodes += [(i["episode"]["r"], i["episode"]["l"]) for i in self.locals["infos"] if "episode" in i]
            if steps >= self.next_eval:
                self.next_eval += eval_every
                if normalize:
                    eval_env.obs_rms = env.obs_rms.copy()
                mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
                evals.append({"env_steps": steps, "wall_s": time.perf_counter() - t0, "return": float(mean)})
                if folder is not None:
                    folder.row(iteration=self.rollouts, env_steps=steps, wall_time_s=round(evals[-1]["wall_s"], 3),
                               **{"eval/return": float(mean)})
                if stop and target is not None and mean >= target:
                    self.stop_reason = "target"
                    return False
            if max_env_steps is not None and steps >= max_env_steps:
                return False
            if time_limit is not None and time.perf_counter() - t0 >= time_limit:
                self.stop_reason = "time_limit"
                return False
            return True

        def _on_rollout_end(self) -> None:
            self.rollouts += 1
            self.write_training_row()

        def write_training_row(self) -> None:
            """A progress row for the training episodes that ended since the last one (nan when none did)."""
            if folder is not None:
                ret, length = (np.mean(self.episodes, axis=0).tolist() if self.episodes else (math.nan, math.nan))
                folder.row(iteration=self.rollouts, env_steps=self.num_timesteps,
                           wall_time_s=round(time.perf_counter() - t0, 3),
                           **{"train/episode_return": ret, "train/episode_length": length})
            self.episodes = []

    # The zoo's schedules (lin_*) decay over total_timesteps: its n_timesteps unless a step budget is given.
    budget = Budget()
    model.learn(total_timesteps=max_env_steps or zoo_steps, callback=budget)
    wall = time.perf_counter() - t0
    if budget.episodes:  # those of the rollout the budget cut short
        budget.write_training_row()
    reached = next((e for e in evals if target is not None and e["return"] >= target), None)
    if folder is not None:
        folder.finish({"eval_return": evals[-1]["return"] if evals else None, "env_steps": int(model.num_timesteps),
                       "stop_reason": budget.stop_reason, "run_wall_time_s": round(wall, 2),
                       "iterations": budget.rollouts}, model, env if normalize else None)
    return {
        "algo": algo, "env": env_id, "seed": seed,
        "reached": reached is not None,
        "reached_wall_s": round(reached["wall_s"], 2) if reached else None,
        "reached_env_steps": reached["env_steps"] if reached else None,
        "last_eval_return": evals[-1]["return"] if evals else None,
        "last_eval_env_steps": evals[-1]["env_steps"] if evals else None,
        "env_steps": int(model.num_timesteps), "wall_time_s": round(wall, 2),
    }


def reevaluate(folder: Path, episodes: int, seed: int) -> dict[str, Any]:
    """The final model of the run folder ``folder`` evaluated on ``episodes`` fresh episodes (deterministic actions,
    the envs seeded from ``seed``, the observations normalised with the training's final statistics): the fields
    ``rlstruct eval`` prints.

    Raises:
        FileNotFoundError: the folder holds no final model (a run before models were saved, or an unfinished one).
    """
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    if not (folder / MODEL_NAME).is_file():
        raise FileNotFoundError(f"--reevaluate needs a run folder holding {MODEL_NAME}, got {folder}, which has none "
                                "(a run that has not finished, or one written before the script saved its model); "
                                "run its seed again with --logdir")
    from rlstruct.algos._train.run_folder import CONFIG_NAME

    config = json.loads((folder / CONFIG_NAME).read_text())
    env_id, algo = config["env"], config["algo"].removeprefix("sb3-")
    env = make_vec_env(env_id, n_envs=1, seed=seed)
    if (folder / STATISTICS_NAME).is_file():
        env = VecNormalize.load(str(folder / STATISTICS_NAME), env)
        env.training, env.norm_reward = False, False
    model = getattr(sb3, algo.upper()).load(folder / MODEL_NAME, device="cpu")
    returns, _ = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=True, return_episode_rewards=True)
    return {"eval_return": float(np.mean(returns)), "return_min": float(np.min(returns)),
            "return_max": float(np.max(returns)), "episodes": len(returns), "policy": "greedy", "env": env_id,
            "algo": config["algo"], "checkpoint": str(folder)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo", help="SB3 algorithm, lower case (default: ppo)")
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium id (default: CartPole-v1)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    parser.add_argument("--target", type=float, default=None, help="target mean evaluation return")
    parser.add_argument("--stop", action=argparse.BooleanOptionalAction, default=True,
                        help="stop a run at the first evaluation at or above the target (default: on)")
    parser.add_argument("--max-env-steps", type=int, default=None, help="env-step budget")
    parser.add_argument("--time-limit", type=float, default=None, help="wall-clock budget in seconds")
    parser.add_argument("--eval-every", type=int, default=5_000, help="env steps between evaluations (default: 5000)")
    parser.add_argument("--eval-episodes", type=int, default=16, help="episodes per evaluation (default: 16)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads (default: 1, as rlstruct's runs)")
    parser.add_argument("--json", default=None, help="also write every run's numbers to this JSON file")
    parser.add_argument("--logdir", type=Path, default=None,
                        help="also write each seed's run folder, LOGDIR/seed-S, which rlstruct compare reads")
    parser.add_argument("--reevaluate", type=Path, default=None, metavar="RUN",
                        help="instead of training, evaluate the final model of the run folder RUN again on "
                             "--episodes fresh episodes and print one JSON line")
    parser.add_argument("--episodes", type=int, default=150, help="--reevaluate's episodes (default: 150)")
    parser.add_argument("--seed", type=int, default=12345, help="--reevaluate's env seed (default: 12345)")
    args = parser.parse_args(argv)
    if args.reevaluate is not None:
        torch.set_num_threads(args.torch_threads)
        print(json.dumps(reevaluate(args.reevaluate, args.episodes, args.seed)))
        return 0
    if (args.algo, args.env) not in ZOO:
        parser.error(f"no zoo hyper-parameters for {(args.algo, args.env)}; known: {sorted(ZOO)}")
    if args.max_env_steps is None and args.time_limit is None:
        parser.error("give a budget: --max-env-steps and/or --time-limit")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.logdir is not None:
        from rlstruct.algos._train.run_folder import earlier_run_files

        taken = [str(args.logdir / f"seed-{s}") for s in seeds if earlier_run_files(args.logdir / f"seed-{s}")]
        if taken:
            parser.error(f"--logdir's run folders must be new, got {', '.join(taken)} holding runs; pass another "
                         "--logdir, or remove those folders to run their seeds again")
    torch.set_num_threads(args.torch_threads)
    import stable_baselines3 as sb3

    print(f"# stable-baselines3 {sb3.__version__}, torch {torch.__version__}, numpy {np.__version__}, CPython "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    results = []
    for seed in seeds:
        r = run_one(args.algo, args.env, seed, target=args.target, stop=args.stop, max_env_steps=args.max_env_steps,
                    time_limit=args.time_limit, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                    logdir=args.logdir)
        r["load_after"] = round(os.getloadavg()[0], 1)
        results.append(r)
        print(json.dumps(r), flush=True)
    ok = [r for r in results if r["reached"]]
    if args.target is not None:
        times = [r["reached_wall_s"] for r in ok]
        steps = [r["reached_env_steps"] for r in ok]
        print(f"reached {args.target:g}: {len(ok)}/{len(results)}; time to target median "
              f"{statistics.median(times) if times else '-'} [{min(times, default='-')}, {max(times, default='-')}] s; "
              f"env steps median {statistics.median(steps) if steps else '-'}")
    last = [r["last_eval_return"] for r in results if r["last_eval_return"] is not None]
    if last:
        print(f"last evaluation: median {statistics.median(last):.1f} [{min(last):.1f}, {max(last):.1f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
