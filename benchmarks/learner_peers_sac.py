"""SAC's CPU learner on Hopper-v4 beside Stable-Baselines3's SAC: env steps per CPU second, learning included.

Both train SAC on gymnasium's ``Hopper-v4`` (one env, MuJoCo) with the same settings: 256-256 ReLU networks for the
actor and each of the two critics, batch 256, one gradient step per env step, Adam at 3e-4, tau 0.005, gamma 0.99, the
temperature tuned towards ``-action_dim``, a buffer larger than the run; ``--learning-starts`` env steps of uniform
random actions, then ``--steps`` env steps with learning, which the rate counts (from the first gradient step on:
start-up and rlstruct's end of run stay out). The rate is env steps per CPU second of the whole process (env, acting,
replay and gradient steps), so a machine shared with other jobs moves it far less than it moves the wall clock.

* ``rlstruct``: ``rlstruct train sac --env Hopper-v4 --backend gymnasium --n-envs 1`` with the settings above
  (8 env steps, then their 8 gradient steps), evaluation off;
* ``rlstruct-r1``: the same acting one env step between gradient steps (``--rollout-steps 1``), as SB3 does;
* ``sb3``: Stable-Baselines3's ``SAC("MlpPolicy")`` (``train_freq=1``, ``gradient_steps=1``).

Every configuration runs in a fresh process (``benchmarks/_fresh.py``), one torch thread. The notes give the
FLOPs of a gradient step (``torch.utils.flop_counter``, the same for both) and the CPU milliseconds a gradient
step took (the update calls' thread CPU time over their count).

Usage::

    python benchmarks/learner_peers_sac.py [--steps 2000] [--learning-starts 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._clock import UpdateClock  # noqa: E402
from benchmarks._common import logging_nowhere  # noqa: E402
from benchmarks._fresh import Config, add_arguments, measure_or_rounds, print_results, selected  # noqa: E402

ENV = "Hopper-v4"
#: each rlstruct configuration's settings besides the shared ones
RLSTRUCT_SETTINGS = {"rlstruct": {"rollout_steps": 8}, "rlstruct-r1": {"rollout_steps": 1}}
PEERS = (*RLSTRUCT_SETTINGS, "sb3")


class _GradientClock(UpdateClock):
    """The update clock of a SAC run: a cycle is ``calls_per_cycle`` gradient steps and as many env steps; the rate
    is over the process CPU seconds of the timed cycles."""

    def stats(self) -> dict:
        cycles, wall, cpu = self.window()
        env_steps = cycles * self.calls_per_cycle
        return {"steps_per_cpu_s": env_steps / cpu, "steps_per_s": env_steps / wall, "cores": cpu / wall,
                "gflop_per_update": self.flops / 1e9, "update_cpu_ms": 1e3 * self.update_cpu / len(self.starts)}


def measure_rlstruct(steps: int, learning_starts: int, *, rollout_steps: int) -> dict:
    """``rlstruct train sac`` on Hopper-v4 over ``learning_starts + steps`` env steps, one torch thread."""
    from rlstruct.algos import validate
    from rlstruct.algos._train.loops import train_off_policy
    from rlstruct.algos._train.registry import algorithm
    from rlstruct.algos.sac import SACLearner

    clock = _GradientClock(calls_per_cycle=rollout_steps)
    SACLearner.gradient_step = clock.wrap(SACLearner.gradient_step)
    description = algorithm("sac")
    with tempfile.TemporaryDirectory(prefix="learner-peers-sac-") as logdir:
        config = description.config_cls(
            env=ENV, backend="gymnasium", n_envs=1, rollout_steps=rollout_steps, hidden_sizes=(256, 256),
            batch_size=256, lr=3e-4, critic_lr=3e-4, gamma=0.99, tau=0.005, buffer_size=learning_starts + steps,
            learning_starts=learning_starts, max_env_steps=learning_starts + steps, torch_threads=1,
            logdir=logdir, progress=False, tensorboard=False, time_limit=1e9, n_evaluation_envs=1,
            eval_every=2**31 - 1, evaluation_max_steps=10)
        train_off_policy(validate(config))
    return clock.stats()


def measure_sb3(steps: int, learning_starts: int) -> dict:
    """Stable-Baselines3's SAC with the same settings over ``learning_starts + steps`` env steps."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", gym.make(ENV), learning_rate=3e-4, buffer_size=learning_starts + steps,
                learning_starts=learning_starts, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
                gradient_steps=1, policy_kwargs={"net_arch": [256, 256]}, device="cpu", seed=0)
    logging_nowhere(model)
    clock = _GradientClock(calls_per_cycle=1)
    model.train = clock.wrap(model.train)
    model.learn(learning_starts + steps)
    return clock.stats()


MEASURES = {**{name: functools.partial(measure_rlstruct, **settings) for name, settings in RLSTRUCT_SETTINGS.items()},
            "sb3": measure_sb3}


def configs(args: argparse.Namespace) -> dict[str, Config]:
    out = {peer: Config(lambda p=peer: MEASURES[p](args.steps, args.learning_starts),
                        against=() if peer == "sb3" else (("of SB3's", "sb3"),))
           for peer in PEERS}
    return selected(out, args.only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=2_000, help="env steps with learning, timed")
    parser.add_argument("--learning-starts", type=int, default=1_000, help="env steps of random actions first")
    parser.add_argument("--only", default="", help="comma-separated configuration names, e.g. rlstruct,sb3")
    add_arguments(parser, rounds=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfgs = configs(args)
    results = measure_or_rounds(__file__, cfgs, args)
    if results is not None:
        print_results(results, cfgs, "steps_per_cpu_s", "env steps per CPU s incl. learning", fmt="{:,.1f}",
                      note=_note)


def _note(run: dict) -> str:
    """The median run's gradient step: its FLOPs and its CPU time; its wall-clock rate and busy cores."""
    return (f"{run['gflop_per_update']:.2f} GFLOP and {run['update_cpu_ms']:.1f} CPU ms a gradient step; "
            f"{run['steps_per_s']:.1f} env steps/s wall, {run['cores']:.2f} cores busy")


if __name__ == "__main__":
    main()
