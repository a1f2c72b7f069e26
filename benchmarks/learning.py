"""Learning benchmarks: how fast REINFORCE, A2C, DQN, PPO, SAC, PQN, TD3 and IMPALA reach a target evaluation return.

Each run is a fresh process, ``python -m rlstruct.algos.<algo> --seed S --logdir DIR --no-progress
[--target-return R] ...`` with the algorithm's default hyper-parameters, so that every run pays the same
start-up costs (imports, the first optimizer) inside its wall clock. The script then reads the run's
``progress.csv``:

* **reached**: the first evaluation whose mean return is at least the target: its wall clock (seconds since
  ``train`` started, when the evaluation's result arrived) and its env steps (when it was launched).
  The evaluation of the untrained network (launched at 0 env steps) does not count: on CartPole a random
  linear-ish network sometimes balances the pole by luck;
* **final**: the final blocking evaluation of the final policy (with ``--stop``, the policy that reached
  the target).

Targets and budgets (issue 5): CartPole-v1 475, Acrobot-v1 -100; A2C 15 s of wall clock, DQN 50,000 env steps,
REINFORCE 120 s. Issue 18: PPO on CartPole-v1 475 within 15 s; PPO and A2C on Pendulum-v1 (continuous actions) -200
within 100,000 env steps (A2C also 200,000); SAC on Pendulum-v1 -200 within 20,000 env steps; DQN with a dueling
head (``dqn-dueling-cartpole-torch``) against ``dqn-cartpole-torch`` on the same seeds; CartPoleNoVel-v1 475 within
120 s, recurrent (``--recurrent``) and feed-forward PPO and A2C; MinAtar Breakout from pixels (PPO with the CNN) 5
within 300 s. Issue 19: PPO on CartPole-v1 stepped by gymnax (475 within 15 s) and on Hopper-v5 stepped by MJX
(1,000 within 200,000 env steps), and on gymnasium's Hopper-v5 with and without ``--normalize-observations
--normalize-rewards`` (the same target and budget). Issue 20: A2C and PPO on CartPole-v1 in few, wide iterations
(2,048 envs x 16 steps, overlapped; the GPU solve runs' settings), 475 within 20 and 30 iterations. Issue 40: PQN on
CartPole-v1, 475 within 200,000 env steps (its preset's budget). Issue 45: DQN with prioritized replay
(``dqn-per-cartpole-torch``) against ``dqn-cartpole-torch`` on the same seeds. Issue 65: TD3 on Pendulum-v1, -200
within 20,000 env steps.
``benchmarks/sb3_reference.py`` runs Stable-Baselines3 on the same workloads.
Each run's JSON line also has its process's CPU seconds (``process_cpu_s``). The table reports, per suite, how many
seeds reached the target within budget, and the median and range over seeds, with the final return's IQM and its 95%
stratified bootstrap interval beside them (``rlstruct.algos.statistics``). Stable-Baselines3 is compared only
when it is installed.

Usage::

    python benchmarks/learning.py --seeds 0,1,2
    python benchmarks/learning.py --suites a2c-cartpole-torch --seeds 0,1,2,3,4
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Suite:
    """One benchmark: an algorithm on an env and backend, a target and a budget."""

    name: str
    algo: str
    env: str
    target: float
    budget: str  # shown in the table
    flags: list[str] = field(default_factory=list)
    backend: str = "torch"


CARTPOLE, ACROBOT, PENDULUM = 475.0, -100.0, -200.0
# PPO on Pendulum: rl-zoo's discount (0.9) and epochs (10); 16 envs x 250 steps, so 100k steps are 25 updates.
PPO_PENDULUM = ["--gamma", "0.9", "--lr", "2e-3", "--n-envs", "16", "--n-steps", "250", "--n-epochs", "10",
                "--n-minibatches", "8", "--eval-every", "5"]
# A2C on Pendulum: the same discount; 16 envs x 8 steps at lr 5e-3 (many small updates; 32 x 8 and 16 x 32 stayed
# near random within 100k steps).
A2C_PENDULUM = ["--gamma", "0.9", "--n-envs", "16", "--n-steps", "8", "--lr", "5e-3", "--eval-every", "200"]
# CartPole-v1 in few iterations (issue 20's time to solve on a GPU, where an iteration costs about the same at 32 or
# 2,048 envs): 2,048 envs x 16 steps an iteration, collected while the learner trains on the previous batch (as on
# the GPU fast path: A2C's lr 0.02 is for this; without --overlap it is too large, and 0.01 is the better choice),
# the learning rate annealed over 300 (A2C) or 100 (PPO) iterations, an evaluation every 2; budgets of 20 (A2C:
# 655k steps) and 30 (PPO: 983k steps) iterations. The same flags are gpu_training.py's "wide" solve runs.
A2C_CARTPOLE_WIDE = ["--n-envs", "2048", "--n-steps", "16", "--lr", "0.02", "--overlap",
                     "--max-env-steps", str(2048 * 16 * 300), "--eval-every", "2"]
PPO_CARTPOLE_WIDE = ["--n-envs", "2048", "--n-steps", "16", "--lr", "0.02", "--n-epochs", "2", "--n-minibatches", "2",
                     "--overlap", "--max-env-steps", str(2048 * 16 * 100), "--eval-every", "2"]
# PPO on MuJoCo locomotion through gymnasium (CleanRL's ppo_continuous_action settings), 200k steps.
PPO_MUJOCO = ["--n-envs", "8", "--n-steps", "256", "--n-epochs", "10", "--n-minibatches", "32", "--lr", "3e-4",
              "--entropy-coef", "0", "--reward-scale", "1", "--max-env-steps", "200000", "--time-limit", "1800",
              "--eval-every", "10", "--n-evaluation-envs", "8"]
# MinAtar Breakout: a return the CNN policy reaches on two CPU cores in minutes (a random policy scores about 0.5).
MINATAR_BREAKOUT = 5.0
SUITES = [
    Suite("a2c-cartpole-torch", "a2c", "CartPole-v1", CARTPOLE, "15 s", ["--time-limit", "15"]),
    Suite("dqn-cartpole-torch", "dqn", "CartPole-v1", CARTPOLE, "50k steps", ["--max-env-steps", "50000",
                                                                               "--time-limit", "600"]),
    Suite("reinforce-cartpole-torch", "reinforce", "CartPole-v1", CARTPOLE, "120 s", ["--time-limit", "120"]),
    Suite("impala-cartpole-torch", "impala", "CartPole-v1", CARTPOLE, "300k steps", ["--max-env-steps", "300000",
                                                                                     "--time-limit", "1800"]),
    Suite("pqn-cartpole-torch", "pqn", "CartPole-v1", CARTPOLE, "200k steps", ["--max-env-steps", "200000",
                                                                               "--time-limit", "1800"]),
    Suite("a2c-acrobot-torch", "a2c", "Acrobot-v1", ACROBOT, "15 s", ["--time-limit", "15"]),
    Suite("dqn-acrobot-torch", "dqn", "Acrobot-v1", ACROBOT, "50k steps", ["--max-env-steps", "50000",
                                                                            "--time-limit", "600"]),
    Suite("reinforce-acrobot-torch", "reinforce", "Acrobot-v1", ACROBOT, "120 s", ["--time-limit", "120"]),
    Suite("a2c-cartpole-gymnasium", "a2c", "CartPole-v1", CARTPOLE, "15 s", ["--time-limit", "15"], "gymnasium"),
    Suite("sac-pendulum-torch", "sac", "Pendulum-v1", PENDULUM, "20k steps", ["--max-env-steps", "20000",
                                                                             "--time-limit", "1800"]),
    Suite("td3-pendulum-torch", "td3", "Pendulum-v1", PENDULUM, "20k steps", ["--max-env-steps", "20000",
                                                                             "--time-limit", "1800"]),
    Suite("dqn-dueling-cartpole-torch", "dqn", "CartPole-v1", CARTPOLE, "50k steps", ["--dueling", "--max-env-steps",
                                                                                      "50000", "--time-limit", "600"]),
    Suite("dqn-per-cartpole-torch", "dqn", "CartPole-v1", CARTPOLE, "50k steps",
          ["--prioritized-replay", "--max-env-steps", "50000", "--time-limit", "600"]),
    Suite("ppo-cartpole-torch", "ppo", "CartPole-v1", CARTPOLE, "15 s", ["--time-limit", "15"]),
    Suite("a2c-cartpole-wide-torch", "a2c", "CartPole-v1", CARTPOLE, "655k steps",
          ["--time-limit", "120", *A2C_CARTPOLE_WIDE]),
    Suite("ppo-cartpole-wide-torch", "ppo", "CartPole-v1", CARTPOLE, "983k steps",
          ["--time-limit", "120", *PPO_CARTPOLE_WIDE]),
    # The same task stepped by gymnax (JAX), through the JaxVecEnv adapter (issue 19).
    Suite("ppo-cartpole-gymnax", "ppo", "CartPole-v1", CARTPOLE, "15 s", ["--time-limit", "15"], "gymnax"),
    Suite("ppo-acrobot-torch", "ppo", "Acrobot-v1", ACROBOT, "100k steps", ["--max-env-steps", "100000"]),
    Suite("ppo-pendulum-torch", "ppo", "Pendulum-v1", PENDULUM, "100k steps",
          ["--max-env-steps", "100000", "--time-limit", "600", *PPO_PENDULUM]),
    Suite("a2c-pendulum-100k-torch", "a2c", "Pendulum-v1", PENDULUM, "100k steps",
          ["--max-env-steps", "100000", "--time-limit", "600", *A2C_PENDULUM]),
    Suite("a2c-pendulum-200k-torch", "a2c", "Pendulum-v1", PENDULUM, "200k steps",
          ["--max-env-steps", "200000", "--time-limit", "600", *A2C_PENDULUM]),
    # CartPole without its velocities: the LSTM policy against the feed-forward one, same budget (issue 18).
    Suite("ppo-recurrent-cartpolenovel-torch", "ppo", "CartPoleNoVel-v1", CARTPOLE, "120 s",
          ["--recurrent", "--time-limit", "120"]),
    Suite("ppo-cartpolenovel-torch", "ppo", "CartPoleNoVel-v1", CARTPOLE, "120 s",
          ["--no-recurrent", "--time-limit", "120"]),
    Suite("a2c-recurrent-cartpolenovel-torch", "a2c", "CartPoleNoVel-v1", CARTPOLE, "120 s",
          ["--recurrent", "--time-limit", "120"]),
    Suite("a2c-cartpolenovel-torch", "a2c", "CartPoleNoVel-v1", CARTPOLE, "120 s",
          ["--no-recurrent", "--time-limit", "120"]),
    # MuJoCo locomotion through MJX (issue 19): gymnasium's Hopper-v5 task stepped by MJX. The untrained policy's
    # evaluation scores about 230 (standing earns the healthy reward); CleanRL's PPO checkpoints score 1,476-2,504
    # after 1M steps. About 10 minutes per seed on two CPU cores (MJX is a GPU engine).
    Suite("ppo-hopper-mjx", "ppo", "Hopper-v5", 1000.0, "200k steps",
          ["--n-envs", "64", "--n-steps", "64", "--n-epochs", "10", "--n-minibatches", "16", "--lr", "3e-4",
           "--entropy-coef", "0", "--max-env-steps", "200000", "--time-limit", "1800", "--eval-every", "5",
           "--n-evaluation-envs", "8"], "mjx"),
    # The same task on MuJoCo's C engine through gymnasium, with CleanRL's (and SB3's default) PPO settings: 2,048 steps
    # per update (8 envs x 256), 10 epochs of 32 minibatches, lr 3e-4, no entropy bonus; with and without the running
    # normalisation of observations and rewards (the reference implementations normalise both). About 2 minutes per
    # seed on two CPU cores.
    Suite("ppo-hopper-gymnasium", "ppo", "Hopper-v5", 1000.0, "200k steps",
          [*PPO_MUJOCO, "--normalize-observations", "--normalize-rewards"], "gymnasium"),
    Suite("ppo-hopper-raw-gymnasium", "ppo", "Hopper-v5", 1000.0, "200k steps", PPO_MUJOCO, "gymnasium"),
    # Brax's inverted_pendulum (1 per step balanced, 1,000 steps) through the Brax backend, PPO's defaults.
    Suite("ppo-inverted-pendulum-brax", "ppo", "inverted_pendulum", 1000.0, "100k steps",
          ["--max-env-steps", "100000", "--time-limit", "600"], "brax"),
    # Pixels: MinAtar Breakout's 10x10x4 frames through the CNN (pip install minatar), 300 s of wall clock.
    Suite("ppo-minatar-breakout-gymnasium", "ppo", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "300 s",
          ["--time-limit", "300", "--n-envs", "32", "--n-steps", "64", "--n-minibatches", "4", "--lr", "5e-4",
           "--entropy-coef", "0.01", "--eval-every", "10"], "gymnasium"),
    # PQN on the torch MinAtar Breakout with its preset's settings (no flag: the pqn-minatar preset).
    Suite("pqn-minatar-breakout-torch", "pqn", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "300k steps", [], "torch"),
    # The same preset on the reference game (minatar through gymnasium): the side-by-side of docs/benchmarks/minatar.md.
    Suite("pqn-minatar-breakout-gymnasium", "pqn", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "300k steps", [],
          "gymnasium"),
    # PPO's preset (no flag: ppo-minatar) on the torch game.
    Suite("ppo-minatar-breakout-torch", "ppo", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "1000k steps", [], "torch"),
    # SAC on gymnasium's Hopper-v5 with its preset's settings (no flag: rlstruct.algos._train.presets' sac-mujoco).
    Suite("sac-hopper-gymnasium", "sac", "Hopper-v5", 1000.0, "150k steps", [], "gymnasium"),
    # The same task for DQN, with its preset's settings (no flag: rlstruct.algos._train.presets' dqn-minatar).
    Suite("dqn-minatar-breakout-gymnasium", "dqn", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "500k steps", [],
          "gymnasium"),
    Suite("dqn-minatar-breakout-torch", "dqn", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "500k steps", [], "torch"),
    # The same preset with a prioritized replay buffer (Schaul et al. 2016's proportional variant).
    Suite("dqn-per-minatar-breakout-torch", "dqn", "MinAtar/Breakout-v1", MINATAR_BREAKOUT, "500k steps",
          ["--prioritized-replay"], "torch"),
    # Atari Breakout through ale-py with PPO's preset (no flag: the ppo-atari preset, CleanRL's settings):
    # the whole-game score of the sampled policy, 5 (the untrained policy scores 0.7 to 1.5).
    Suite("ppo-atari-breakout", "ppo", "ALE/Breakout-v5", 5.0, "10000k steps", [], "ale"),
    # The same for DQN (rlstruct.algos._train.presets' dqn-atari): the epsilon-greedy policy's whole-game score, 5.
    Suite("dqn-atari-breakout", "dqn", "ALE/Breakout-v5", 5.0, "10000k steps", [], "ale"),
]


#: the presets page's marker for runs taken before the agents drew from counter-based noise
BEFORE_COUNTER_DRAWS = "before the counter-based draws"
#: what a results file written since runs stop on a confirmed evaluation records as its "stopping_rule"
CONFIRMED_STOP = "confirmed"
#: the mark of a row's runs taken before: they stopped at the first evaluation past the target, unconfirmed
FIRST_EVALUATION_STOP = "stopped at the first evaluation past the target"
#: rl-baselines3-zoo's published scores: the mean return of its final policy over about 150k evaluation steps
ZOO = "rl-baselines3-zoo's benchmark.md (its final policy over about 150k evaluation steps)"
#: published or locally measured references beside each preset's row: preset name -> (figure, source, where rlstruct
#: is ahead or behind at equal env steps)
REFERENCES = {
    "ppo-cartpole": ("rl-zoo PPO: 500.0 +/- 0.0 after 100k env steps", ZOO,
                     "level: 5/5 seeds past 475 by 57k env steps, within the zoo's 100k (confirmed at 500); these "
                     "runs stop at 475, so the zoo's final 500 is not measured here"),
    "a2c-cartpole": ("rl-zoo A2C: 500.0 +/- 0.0 after 500k env steps", ZOO,
                     "level: 5/5 seeds past 475 by 139k env steps (median 57k), within the zoo's 500k (confirmed at "
                     "483-500)"),
    "a2c-acrobot": ("rl-zoo A2C: -83.4 +/- 17.2 after 500k env steps", ZOO,
                    "ahead in env steps: 5/5 seeds past -100 at 6.4k-12.8k env steps (seed 4's candidate at 6.4k "
                    "failed its confirmation, -105.3), confirmed at -81.9 (median; -75.7 to -83.5), level with the "
                    "zoo's -83.4 after 500k"),
    "ppo-acrobot": ("rl-zoo PPO: -73.5 +/- 18.2 after 1M env steps", ZOO,
                    "not measured at equal steps: 5/5 seeds past -100 by 16k env steps, confirmed at -82.2 "
                    "(median), behind the zoo's -73.5 after 1M"),
    "reinforce-cartpole": ("rlstruct's ppo-cartpole preset: 5/5 past 475 at 33k-57k env steps", "this page",
                           "level with PPO in env steps: 5/5 seeds past 475 at 25k-51k env steps (the kept policies "
                           "re-evaluate at 484-500)"),
    "reinforce-acrobot": ("rlstruct's a2c-acrobot preset: 5/5 past -100 at 6.4k env steps", "this page",
                          "behind A2C: 5/5 seeds past -100, but at 84k-499k env steps (median 157k): Monte-Carlo "
                          "returns without a critic"),
    "ppo-cartpolenovel": ("rl-zoo tunes RecurrentPPO for CartPoleNoVel-v1 over 100k env steps (no published score); "
                          "the feed-forward policy: 0/5 seeds past 475 within 120 s, stuck near 45",
                          "rl-baselines3-zoo's ppo_lstm.yml; docs/benchmarks/learning.md",
                          "within the zoo's budget: 5/5 seeds past 475 at 41k-66k env steps"),
    "a2c-cartpolenovel": ("the feed-forward A2C policy: 0/3 seeds past 475 within 120 s, stuck near 43",
                          "docs/benchmarks/learning.md",
                          "5/5 seeds past 475 at 96k-237k env steps, behind recurrent PPO's 41k-66k"),
    "dqn-cartpole": ("rl-zoo DQN: 500.0 +/- 0.0 after 50k env steps", ZOO,
                     "behind: 5/5 seeds past 475 by 56k env steps (median 38k), 4/5 within the zoo's 50k (seed 4 "
                     "passes at 56k, hence the 100k budget); the kept policies re-evaluate at 485-500"),
    "pqn-cartpole": ("rlstruct's dqn-cartpole preset: 5/5 past 475 at 21k-56k env steps, median 38k (a replay buffer "
                     "and a target network); ppo-cartpole: 5/5 at 33k-57k, median 41k", "this page",
                     "level with both in env steps: 5/5 seeds past 475 at 15k-61k env steps (median 31k), and the "
                     "kept policies re-evaluate at 493-500"),
    "dqn-acrobot": ("rl-zoo DQN: -76.6 +/- 11.8 after 100k env steps", ZOO,
                    "behind in return, ahead in env steps: 5/5 seeds past -100 by 26k env steps, where the kept "
                    "policies re-evaluate at -95.4 (median; seed 2's at -215) against the zoo's -76.6 after 100k"),
    "ppo-pendulum": ("SB3 PPO, rl-zoo settings: -198 at 100k env steps (seed 0)",
                     "issue 33's side-by-side run on this machine (benchmarks/sb3_reference.py)",
                     "ahead: -200 confirmed at 60k env steps on 4/5 seeds, where SB3 is at -198 after 100k; seed "
                     "1's candidate at 80k failed its confirmation (-242.8) and its final policy scores -173 at 100k"),
    "sac-pendulum": ("SB3 SAC, rl-zoo settings: -200 reached at 3,000 env steps (seed 0)",
                     "benchmarks/sb3_sac_reference.py on this machine",
                     "behind: 4,000-5,600 env steps against 3,000 (a 128-128 network against the zoo's 256-256)"),
    "td3-pendulum": ("rlstruct's sac-pendulum preset: 5/5 past -200 at 4,000-5,600 env steps", "this page",
                     "behind SAC in env steps: 5/5 seeds past -200 at 8,000-13,600 env steps (median 8,800), with "
                     "TD3's lr of 3e-4 where SAC's defaults take 1e-3; confirmed at -131 to -193"),
    "ppo-mujoco": ("SB3 PPO + VecNormalize, the same settings, Hopper-v5: 5/5 past 1,000 at 102k-143k env steps, "
                   "median 1,246 at 184k", "docs/benchmarks/learning.md (benchmarks/sb3_reference.py)",
                   "behind in env steps to 1,000 (see the row); level in the final median there"),
    "dqn-mountaincar": ("rl-zoo DQN, the same settings: -100.8 +/- 9.9 after 120k env steps",
                        ZOO,
                        "level on 4/5 seeds: 5/5 past -110 by 130k env steps (median 91k), 4/5 within the zoo's 120k "
                        "(seed 0 at 130k); these runs stop at -110, so the zoo's final -100.8 is not measured here"),
    "ppo-mountaincar": ("rl-zoo PPO, the same settings: -110.4 +/- 19.5 after 1M env steps",
                        ZOO,
                        "ahead in env steps, level in return: a 16-episode evaluation passes the zoo's 1M-step score "
                        "(-110) on 5/5 seeds at 102k-461k env steps, where the kept policies re-evaluate at -108 to "
                        "-130 (median -112)"),
    "a2c-mountaincar": ("rl-zoo A2C, the same settings: -111.3 +/- 24.1 after 1M env steps",
                        ZOO,
                        "behind: a 16-episode evaluation passes -120 at 60k-500k env steps (median 140k), and the "
                        "kept policies re-evaluate at -117 to -133, where the zoo's final policy scores -111"),
    "ppo-mountaincar-continuous": ("rl-zoo PPO with gSDE: 88.3 +/- 2.6 after 20k env steps",
                                   ZOO,
                                   "ahead: 5/5 seeds past 90 at 10k-15k env steps, without gSDE (confirmed at "
                                   "98-99; the candidates of seeds 0 and 4 at 10k and 5k failed their "
                                   "confirmations, 86.3 and 73.8)"),
    "ppo-lunarlander": ("rl-zoo PPO, the same settings, LunarLander-v2: 242.1 +/- 31.8 after 1M env steps", ZOO,
                        "not measured at equal steps: these runs stop at 200, which 5/5 seeds pass at 393k-655k env "
                        "steps (the kept policies re-evaluate at 131-213); the zoo's 242 is after 1M"),
    "dqn-lunarlander": ("rl-zoo DQN, the same settings, LunarLander-v2: 154.4 +/- 79.2 after 100k env steps", ZOO,
                        "ahead: 5/5 seeds past 200 at 60k-100k env steps (the kept policies re-evaluate at 172-243), "
                        "where the zoo's policy scores 154 after 100k"),
    "dqn-minatar": ("rlstruct's ppo-minatar preset, the same target: 5/5 past 5 at 82k-143k env steps", "this page",
                    "ahead of PPO in env steps: 5/5 past 5 at 64k-90k env steps on the torch game (the kept policies "
                    "re-evaluate at 4.1-5.9), behind it in CPU time (82 s of process CPU against 30 s, median)"),
    "ppo-minatar": ("rlstruct's dqn-minatar preset, the same target: 5/5 past 5 at 64k-90k env steps", "this page",
                    "behind DQN in env steps: 5/5 past 5 at 82k-143k env steps on the torch game, ahead in CPU time "
                    "(30 s of process CPU against 82 s, median)"),
    "pqn-minatar": ("rlstruct's ppo-minatar and dqn-minatar presets, the same target: 5/5 past 5 at 82k-143k and "
                    "64k-90k env steps", "this page",
                    "behind both in env steps: 5/5 past 5 at 102k-143k env steps on the torch game (the kept "
                    "policies re-evaluate at 5.4-5.8), without a replay buffer or a target network; the cheapest in "
                    "CPU time (16 s of process CPU, median)"),
    "ppo-brax-inverted-pendulum": ("the same PPO with its learning rate annealed over 400k env steps: 5/5 past "
                                   "1,000 at 25.6k-33.8k env steps", "docs/benchmarks/ecosystem.md",
                                   "level: 5/5 past 1,000 at 24.6k-32.8k env steps, 16-18 s from launch (JAX "
                                   "compiling the envs included)"),
    "ppo-atari": ("rl-zoo PPO, BreakoutNoFrameskip-v4 (these settings, but the clip range annealed and the value "
                  "unclipped): 398.0 +/- 33.3 after 10M env steps (the sampled policy, as here)", ZOO,
                  "not measured at equal steps: a CPU proof of learning, 5/5 seeds past 5 by 225k env steps (2% of "
                  "the zoo's 10M), where the kept policies re-evaluate at 3.9-6.0 (the untrained policy: 0.7-1.5)"),
    "dqn-atari": ("rl-zoo DQN, BreakoutNoFrameskip-v4 (CleanRL's settings: 1-step returns, epsilon over 1M env "
                  "steps): 358.3 +/- 62.0 after 10M env steps (epsilon-greedy, as here); rlstruct's ppo-atari preset: "
                  "5/5 past 5 at 82k-225k env steps", ZOO,
                  "not measured at equal steps: a CPU proof of learning, 5/5 seeds past 5 by 82k env steps (under 1% "
                  "of the zoo's 10M), where the kept policies re-evaluate at 5.3-10.9 (the untrained policy: "
                  "0.75-4.75 over 8 games); ahead of PPO's preset in env steps"),
    "sac-mujoco": ("rl-zoo SAC, Hopper-v3: 2,325 +/- 1,130 after 1M env steps; rlstruct's ppo-mujoco preset: 5/5 "
                   "past 1,000 at 164k-287k env steps", ZOO,
                   "ahead of PPO in env steps: 5/5 seeds past 1,000 at 40k-100k env steps; the zoo's 1M-step score "
                   "is not measured here"),
}


def preset_suites(names: list[str] | None = None) -> list[Suite]:
    """One suite per preset (those with a target): the env of the suite named by the preset's ``benchmark`` (or its
    first env id), and no flags but the backend: the settings are the preset's."""
    from rlstruct.algos._train.presets import PRESETS

    by_name = {s.name: s for s in SUITES}
    suites = []
    for p in PRESETS:
        if p.unsupported or p.target is None or (names and p.name not in names):
            continue
        base = by_name.get(p.benchmark or "")
        env, backend = (base.env, base.backend) if base else (p.envs[0], "auto")
        budget = p.settings["max_env_steps"]
        suites.append(Suite(f"preset:{p.name}", p.algo, env, p.target, f"{budget // 1000}k steps", [], backend))
    return suites


def presets_page(files: list[dict]) -> str:
    """docs/benchmarks/presets.md, rendered from the runs' JSON files (never typed by hand); a file's runs carry its
    commit and day."""
    from rlstruct.algos._train.presets import PRESETS

    results = [{**r, "commit": f.get("commit"), "date": f.get("date"), "stopping_rule": f.get("stopping_rule")}
               for f in files for r in f["runs"]]
    sessions = [(f["command"], f["machine"]) for f in files]

    lines = ["# Presets: what naming the env gets you", "",
             "Generated by `benchmarks/learning.py --presets-page` from the JSON of the runs below; every run is",
             "`rlstruct train ALGO --env ID` with no other flag (the preset's settings and step budget), a fresh",
             "process per seed, stopping at the target. Env steps to the target do not depend on the machine; wall",
             "times do.",
             "", "```", *[line for command, machine in sessions for line in (command, f"# {machine}")], "```", "",
             "The final return is given as the median and range over seeds, and as the interquartile mean (IQM)",
             "with its 95% stratified bootstrap interval (`rlstruct.algos.statistics`, seeded; a single seed has",
             "none).", "",
             "The agents draw their actions (sampling, epsilon-greedy) from counter-based noise keyed by seed, env and",
             "step. The last column gives the day and commit of a row's runs, or says",
             f"\"{BEFORE_COUNTER_DRAWS}\" for runs taken earlier: those figures come from draws the code no longer",
             "makes.", "",
             "A run stops at its target when an evaluation of trained weights reaches it and a confirmation of the",
             "same weights on fresh episodes does too; the final return is then the confirmation's, and the env",
             "steps to the target are those at which the confirmed weights were taken",
             "([what a run's numbers mean](../concepts/run-numbers.md)). A row marked",
             f"\"{FIRST_EVALUATION_STOP}\" holds runs taken before that rule: they stopped at the first evaluation",
             "past the target, unconfirmed, and their final return is a later evaluation of the kept weights, which",
             "can fall below the target; under the rule such a run goes on training, so that row's env steps can",
             "only grow when it is taken again.", "",
             "| preset | env | target | budget (env steps) | reached | env steps to target | launch to target (s) "
             "| final return | final return IQM [95% CI] | reference | rlstruct against it | runs taken |",
             "|:--|:--|--:|--:|--:|--:|--:|--:|--:|:--|:--|:--|"]
    by_name = {s.name: s for s in SUITES}
    for p in PRESETS:
        if not p.auto:  # the published-budget presets have their page: benchmarks/published.py --table
            continue
        # A preset's row holds its runs on the backend of its benchmark suite (a preset that moved to another
        # backend keeps its older runs in their JSON, out of its row).
        backend = by_name[p.benchmark].backend if p.benchmark in by_name else None
        rs = [r for r in results if r["suite"] == f"preset:{p.name}"
              and (backend is None or f" --backend {backend} " in f"{r['command']} ")]
        confirmed = [r for r in rs if r["stopping_rule"] == CONFIRMED_STOP]
        rs = confirmed or rs  # runs under the confirmed stop replace a preset's earlier ones
        ref, _, against = REFERENCES.get(p.name, ("-", "", "-"))
        envs = p.envs[0] + (f" (+{len(p.envs) - 1} more)" if len(p.envs) > 1 else "")
        if p.unsupported:
            lines.append(f"| {p.name} | {envs} | - | - | not learned | - | - | - | - | - | {p.unsupported} | - |")
            continue
        if not rs:
            lines.append(f"| {p.name} | {envs} | {p.target:g} | {p.settings['max_env_steps']:,} "
                         f"| not run yet | - | - | - | - | {ref} | - | - |")
            continue
        ok = [r for r in rs if r["reached"] and r["reached_env_steps"] <= p.settings["max_env_steps"]]
        lines.append(
            f"| {p.name} | {rs[0]['env']} | {p.target:g} | {p.settings['max_env_steps']:,} | {len(ok)}/{len(rs)} "
            f"| {_median_range([r['reached_env_steps'] for r in ok], ',.0f')} "
            f"| {_median_range([r['time_to_target_s'] for r in ok if r.get('time_to_target_s')], '.1f')} "
            f"| {_median_range([r['final_return'] for r in rs], '.1f')} "
            f"| {_iqm_interval([r['final_return'] for r in rs])} | {ref} | {against} | {_taken(rs)} |")
    lines += ["", "References: " + "; ".join(f"{k}: {v[1]}" for k, v in REFERENCES.items()) + ".", "",
              "Regenerate: `python benchmarks/learning.py --presets-page benchmarks/results/presets-*.json`.", ""]
    return "\n".join(lines)


def _taken(runs: list[dict]) -> str:
    """When a row's runs were taken: the day and commit a results file records, or the marker for the files written
    before the script recorded them (all of which predate the counter-based draws)."""
    if any(not r.get("commit") for r in runs):
        return f"{BEFORE_COUNTER_DRAWS}, {FIRST_EVALUATION_STOP}"
    taken = ", ".join(f"{date} ({commit})" for date, commit in sorted({(r["date"], r["commit"]) for r in runs}))
    confirmed = all(r.get("stopping_rule") == CONFIRMED_STOP for r in runs)
    return taken if confirmed else f"{taken}, {FIRST_EVALUATION_STOP}"


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def source_version() -> dict:
    """The commit the runs were taken at and the day (UTC): the presets page tells current rows from older ones by
    them."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent)
    return {"commit": out.stdout.strip() if out.returncode == 0 else None,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def run_one(suite: Suite, seed: int, logdir: Path, stop: bool, extra: list[str]) -> dict:
    """Trains one seed in a fresh process and reads its progress.csv."""
    cmd = [sys.executable, "-m", f"rlstruct.algos.{suite.algo}", "--env", suite.env, "--backend", suite.backend,
           "--seed", str(seed), "--logdir", str(logdir), "--no-progress", "--no-tensorboard", *suite.flags, *extra]
    if stop:
        cmd += ["--target-return", str(suite.target)]
    load_before = load_average()
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    process_cpu_s = _children_cpu_s() - cpu0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    rows = list(csv.DictReader(open(logdir / "progress.csv")))
    # Reached: what the run reports (a confirmed stop at the target, or a final evaluation at or above it), at the
    # env steps of the weights it reports on.
    reached = summary.get("reached_target", False)
    reached_wall_s = summary.get("time_to_target_s") or summary["wall_time_s"]
    return {
        "suite": suite.name,
        "env": suite.env,
        "seed": seed,
        "time_to_target_s": summary.get("time_to_target_s"),
        "command": " ".join(c for i, c in enumerate(cmd[1:]) if "--logdir" not in cmd[i:i + 2]),
        "reached": reached,
        "reached_wall_s": reached_wall_s if reached else None,
        "reached_env_steps": summary.get("eval_env_steps") if reached else None,
        "final_return": summary["eval_return"],
        "env_steps": summary["env_steps"],
        "wall_time_s": summary["wall_time_s"],
        "process_s": round(process_s, 1),
        "process_cpu_s": round(process_cpu_s, 1),
        "wall_s_at_env_steps": _wall_at_marks(rows),
        "load_before": load_before,
        "load_after": load_average(),
    }


def _wall_at_marks(rows: list[dict], every: int = 25_000) -> dict[str, float]:
    """The run's wall clock at the first row past each multiple of ``every`` env steps: two runs of one setting on
    different backends compare at the same env steps even when one stops earlier."""
    marks: dict[str, float] = {}
    for r in rows:
        if not r.get("env_steps") or not r.get("wall_time_s"):
            continue
        mark = int(float(r["env_steps"])) // every * every
        if mark and str(mark) not in marks:
            marks[str(mark)] = round(float(r["wall_time_s"]), 2)
    return marks


def _children_cpu_s() -> float:
    """CPU seconds of the finished child processes (a run's CPU time moves far less than its wall clock with
    the machine's load)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _median_range(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    return f"{format(statistics.median(xs), fmt)} [{format(min(xs), fmt)}, {format(max(xs), fmt)}]"


def _iqm_interval(xs: list[float], fmt: str = ".1f") -> str:
    """The IQM over seeds with its 95% stratified bootstrap interval (rlstruct.algos.statistics, seeded)."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "-"
    from rlstruct.algos.statistics import aggregate_scores

    try:
        est = aggregate_scores(xs)["iqm"]
    except ImportError:  # scipy
        return "n/a (pip install 'rlstruct[stats]')"
    if math.isnan(est.low):  # one seed: nothing to resample
        return format(est.value, fmt)
    return f"{format(est.value, fmt)} [{format(est.low, fmt)}, {format(est.high, fmt)}]"


def table(suites: list[Suite], results: list[dict]) -> str:
    rows = ["| suite | target | budget | reached | time to target (s) | env steps to target | final return "
            "| final return IQM [95% CI] |", "|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for s in suites:
        rs = [r for r in results if r["suite"] == s.name]
        if not rs:
            continue
        ok = [r for r in rs if r["reached"] and _within_budget(s, r)]
        rows.append(
            f"| {s.name} | {s.target:g} | {s.budget} | {len(ok)}/{len(rs)} "
            f"| {_median_range([r['reached_wall_s'] for r in ok], '.1f')} "
            f"| {_median_range([r['reached_env_steps'] for r in ok], ',.0f')} "
            f"| {_median_range([r['final_return'] for r in rs], '.1f')} "
            f"| {_iqm_interval([r['final_return'] for r in rs])} |"
        )
    return "\n".join(rows)


def _within_budget(s: Suite, r: dict) -> bool:
    if s.budget.endswith(" s"):
        return r["reached_wall_s"] <= float(s.budget[:-2])
    if s.budget.endswith("k steps"):
        return r["reached_env_steps"] <= int(s.budget[:-7]) * 1000
    return True


def sb3_note() -> str:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return "Stable-Baselines3 is not installed: no comparison run."
    return "Stable-Baselines3 is installed: run benchmarks/sb3_reference.py for its numbers on the same workloads."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(s.name for s in SUITES),
                        help="comma-separated suite names (default: all)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    parser.add_argument("--stop", action=argparse.BooleanOptionalAction, default=True,
                        help="stop each run once it reaches the target (default: on)")
    parser.add_argument("--json", default=None, help="also write every run's numbers to this JSON file")
    parser.add_argument("--extra", default="", help="extra flags passed to every run, e.g. '--torch-threads 2'")
    parser.add_argument("--presets", default=None, help="run the presets instead of the suites: 'all' or "
                        "comma-separated preset names (rlstruct presets lists them)")
    parser.add_argument("--presets-page", nargs="+", default=None, metavar="JSON",
                        help="render docs/benchmarks/presets.md from these --json files of --presets runs, and exit")
    args = parser.parse_args(argv)
    if args.presets_page:
        files = [json.loads(Path(path).read_text()) for path in args.presets_page]
        page = presets_page(files)
        Path(__file__).resolve().parents[1].joinpath("docs/benchmarks/presets.md").write_text(page)
        print(page)
        return 0
    if args.presets:
        suites = preset_suites(None if args.presets == "all" else args.presets.split(","))
        if not suites:
            parser.error(f"no preset with a target among {args.presets!r}; rlstruct presets lists them")
    else:
        wanted = args.suites.split(",")
        unknown = set(wanted) - {s.name for s in SUITES}
        if unknown:
            parser.error(f"unknown suites {sorted(unknown)}; known: {[s.name for s in SUITES]}")
        suites = [s for s in SUITES if s.name in wanted]
    seeds = [int(x) for x in args.seeds.split(",")]
    machine = (f"torch {torch.__version__}, CPython {platform.python_version()}, {platform.machine()}, "
               f"{os.cpu_count()} CPUs, load average at start {load_average()}")
    print(f"# {machine}")
    given = list(argv if argv is not None else sys.argv[1:])
    if "--json" in given:  # where this machine kept the file is not part of the command
        del given[given.index("--json"):given.index("--json") + 2]
    command = "python benchmarks/learning.py " + " ".join(given)
    run_at = source_version()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in suites:
            for seed in seeds:
                r = run_one(s, seed, Path(tmp) / f"{s.name}-{seed}", args.stop, args.extra.split())
                results.append(r)
                print(json.dumps(r), flush=True)
                if args.json:  # after every run: a benchmark stopped part way keeps the runs it finished
                    Path(args.json).write_text(json.dumps({"command": command, "machine": f"{machine}, load "
                                                           f"average at end {load_average()}", **run_at,
                                                           "stopping_rule": CONFIRMED_STOP, "runs": results},
                                                          indent=1))
    print()
    print(table(suites, results))
    print()
    print(sb3_note())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
