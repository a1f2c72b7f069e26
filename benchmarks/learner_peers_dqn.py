"""DQN's CPU learner on Atari Breakout beside Stable-Baselines3's DQN: env steps/s, learning included.

Both train on the same env, ale-py's ``AtariVectorEnv`` (Breakout, 8 envs, 84x84 grey, 4 frames stacked, frameskip
4, a lost life ending a training episode) with the ``dqn-atari`` preset's settings (CleanRL's ``dqn_atari.py`` with
3-step returns: the Nature CNN, Adam at 1e-4, batch 32, 8 gradient steps every 32 env steps, the target network
copied every 1,000 env steps, Huber loss, gradient norm 10, epsilon from 1 to 0.01 over 250k env steps) at a small
budget: ``--learning-starts`` env steps filling a buffer of ``--buffer`` transitions, then ``--steps`` env steps with
learning, which the rate counts (whole cycles of collection and gradient steps, the first excepted: start-up and
rlstruct's end of run stay out). Epsilon decays over the filling steps, so
that the timed steps act at the final 0.01, as 97% of a ``dqn-atari`` run does (its decay spans the first 250k of its
10M env steps): both peers then run the Q-network at every step. (At an epsilon near 1, Stable-Baselines3 skips the
network on most steps: one draw decides for all envs whether they explore.)

* ``rlstruct``: ``rlstruct train dqn --preset dqn-atari --env ALE/Breakout-v5`` (its replay buffer, its loop),
  evaluation off;
* ``rlstruct-nchw``: the same with the Nature CNN fed channels-first maps, as the encoder was before it laid the
  frames out channels-last on the CPU;
* ``rlstruct-plain``: the same with ``--no-double``: Mnih et al.'s targets, as Stable-Baselines3's DQN computes them
  (double DQN's online forward on the next frames is a third forward a gradient step);
* ``rlstruct-bf16``, ``rlstruct-plain-bf16``: ``rlstruct`` and ``rlstruct-plain`` with ``--autocast bfloat16`` (the
  gradient step's forwards and the training agent's in bfloat16; the loss, the weights and Adam in float32);
* ``sb3``: Stable-Baselines3's ``DQN("CnnPolicy")`` on the same ``AtariVectorEnv`` through a small ``VecEnv``
  adapter (``train_freq=4`` vector steps, ``gradient_steps=8``, ``n_steps=3``, ``optimize_memory_usage=False``).

Every configuration runs in a fresh process (``benchmarks/_fresh.py``), one torch thread and two. Each row's notes
give the FLOPs of a gradient step (``torch.utils.flop_counter``) and, on one thread, the rate its gradient steps ran
at (their FLOPs per thread CPU second), to set beside ``benchmarks/ppo_learner.py``'s ``gemm`` row.

Usage::

    python benchmarks/learner_peers_dqn.py [--steps 8000] [--learning-starts 2000] [--buffer 20000] [--rounds 3]
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

GAME = "ALE/Breakout-v5"
N_ENVS = 8
PEERS = ("rlstruct", "rlstruct-nchw", "rlstruct-plain", "rlstruct-bf16", "rlstruct-plain-bf16", "sb3")
#: each rlstruct configuration's settings besides the preset's
RLSTRUCT_SETTINGS = {"rlstruct": {}, "rlstruct-plain": {"double": False}, "rlstruct-bf16": {"autocast": "bfloat16"},
                     "rlstruct-plain-bf16": {"double": False, "autocast": "bfloat16"}}
THREADS = (1, 2)


class _LearnerClock(UpdateClock):
    """The update clock of a DQN run: a cycle is ``calls_per_cycle`` update calls and the collection of 32 env
    steps; the rate is over the wall time of the timed cycles, for both peers alike. With one torch thread the
    update's work runs on the calling thread, so ``gflop_per_cpu_s`` is the rate its FLOPs ran at."""

    ENV_STEPS_PER_CYCLE = 32

    def stats(self, threads: int, flops_per_gradient_step: float | None = None) -> dict:
        """Env steps/s and busy cores over the timed cycles, the FLOPs of a gradient step (``flops_per_gradient_step``:
        the first call's FLOPs are one gradient step's, else pass the share), and on one thread their rate."""
        cycles, wall, cpu = self.window()
        out = {"steps_per_s": cycles * self.ENV_STEPS_PER_CYCLE / wall, "cores": cpu / wall,
               "gflop_per_update": (self.flops if flops_per_gradient_step is None else flops_per_gradient_step) / 1e9}
        if threads == 1:
            out["gflop_per_cpu_s"] = self.flops * len(self.starts) / self.update_cpu / 1e9
        return out


def measure_rlstruct(steps: int, learning_starts: int, buffer: int, threads: int, **settings) -> dict:
    """``rlstruct train dqn --preset dqn-atari`` over ``learning_starts + steps`` env steps (``torch_threads``:
    the run sets its threads), with ``settings`` besides: 8 gradient steps after each collection of 4 x 8 env
    steps."""
    from rlstruct.algos import validate
    from rlstruct.algos._train.loops import train_off_policy
    from rlstruct.algos._train.registry import algorithm
    from rlstruct.algos.dqn import DQNLearner

    clock = _LearnerClock(calls_per_cycle=8)
    DQNLearner.gradient_step = clock.wrap(DQNLearner.gradient_step)
    description = algorithm("dqn")
    with tempfile.TemporaryDirectory(prefix="learner-peers-dqn-") as logdir:
        config = description.config_cls(
            env=GAME, preset="dqn-atari", logdir=logdir, progress=False, tensorboard=False, time_limit=1e9,
            n_evaluation_envs=1, eval_every=2**31 - 1, evaluation_max_steps=10, buffer_size=buffer,
            learning_starts=learning_starts, max_env_steps=learning_starts + steps, torch_threads=threads,
            epsilon_decay_steps=learning_starts, **settings)
        setup = validate(config)
        # a preset fills the fields left at their defaults: a budget equal to a default would take the preset's
        want = {"learning_starts": learning_starts, "buffer_size": buffer, "torch_threads": threads,
                "epsilon_decay_steps": learning_starts, **settings}
        got = {k: getattr(setup.config, k) for k in want}
        if got != want:
            raise ValueError(f"the run's settings are {got}; pass values other than DQN's defaults")
        train_off_policy(setup)
    return clock.stats(threads)


def _sb3_vec_env():
    """ale-py's ``AtariVectorEnv`` as a Stable-Baselines3 ``VecEnv`` (per-env info dicts, the terminal frame)."""
    import numpy as np
    from ale_py.vector_env import AtariVectorEnv
    from stable_baselines3.common.vec_env import VecEnv

    class AleVecEnv(VecEnv):
        def __init__(self):
            self.vec = AtariVectorEnv("breakout", N_ENVS, life_loss_info=True, autoreset_mode="SameStep")
            super().__init__(N_ENVS, self.vec.single_observation_space, self.vec.single_action_space)

        def reset(self):
            obs, _ = self.vec.reset(seed=0)
            return obs

        def step_async(self, actions):
            self._actions = np.asarray(actions)

        def step_wait(self):
            obs, reward, terminated, truncated, info = self.vec.step(self._actions)
            done = terminated | truncated
            infos = [{} for _ in range(N_ENVS)]
            for i in np.flatnonzero(done):
                infos[i]["terminal_observation"] = info["final_obs"][i]
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            return obs, reward.astype(np.float32), done, infos

        def close(self):
            self.vec.close()

        def get_attr(self, attr_name, indices=None):
            return [getattr(self, attr_name)] * N_ENVS

        def set_attr(self, attr_name, value, indices=None):
            setattr(self, attr_name, value)

        def env_method(self, method_name, *args, indices=None, **kwargs):
            return [None] * N_ENVS

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * N_ENVS

    return AleVecEnv()


def measure_sb3(steps: int, learning_starts: int, buffer: int, threads: int) -> dict:
    """Stable-Baselines3's DQN with the same settings over ``learning_starts + steps`` env steps."""
    import torch
    from stable_baselines3 import DQN

    torch.set_num_threads(threads)

    total = learning_starts + steps
    model = DQN("CnnPolicy", _sb3_vec_env(), learning_rate=1e-4, buffer_size=buffer, learning_starts=learning_starts,
                batch_size=32, gamma=0.99, train_freq=4, gradient_steps=8, n_steps=3, target_update_interval=1_000,
                exploration_fraction=learning_starts / total, exploration_initial_eps=1.0, exploration_final_eps=0.01,
                max_grad_norm=10.0, optimize_memory_usage=False, replay_buffer_kwargs={"handle_timeout_termination":
                                                                                      False},
                device="cpu", seed=0)
    logging_nowhere(model)
    clock = _LearnerClock(calls_per_cycle=1)  # one call: gradient_steps=8 gradient steps, every 4 x 8 env steps
    model.train = clock.wrap(model.train)
    model.learn(total)
    return clock.stats(threads, flops_per_gradient_step=clock.flops / 8)


def measure_rlstruct_nchw(steps: int, learning_starts: int, buffer: int, threads: int) -> dict:
    """``measure_rlstruct`` with the CNN encoder's convolutions on channels-first maps (the encoder before it laid
    channels-first frames out channels-last on the CPU)."""
    from benchmarks.learner_peers import use_the_plain_encoder

    use_the_plain_encoder()
    return measure_rlstruct(steps, learning_starts, buffer, threads)


MEASURES = {**{name: functools.partial(measure_rlstruct, **settings) for name, settings in RLSTRUCT_SETTINGS.items()},
            "rlstruct-nchw": measure_rlstruct_nchw, "sb3": measure_sb3}


def configs(args: argparse.Namespace) -> dict[str, Config]:
    out = {}
    for threads in THREADS:
        for peer in PEERS:
            against = () if peer == "rlstruct" else (("of rlstruct's", f"rlstruct-{threads}t"),)
            out[f"{peer}-{threads}t"] = Config(
                lambda p=peer, t=threads: MEASURES[p](args.steps, args.learning_starts, args.buffer, t),
                against=against)
    return selected(out, args.only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=8_000, help="env steps with learning, timed")
    parser.add_argument("--learning-starts", type=int, default=2_000, help="env steps filling the buffer first")
    parser.add_argument("--buffer", type=int, default=20_000, help="replay buffer size (transitions)")
    parser.add_argument("--only", default="", help="comma-separated configuration names, e.g. rlstruct-1t,sb3-1t")
    add_arguments(parser, rounds=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfgs = configs(args)
    results = measure_or_rounds(__file__, cfgs, args)
    if results is not None:
        print_results(results, cfgs, "steps_per_s", "env steps/s incl. learning", note=_note)


def _note(run: dict) -> str:
    """The median run's busy cores, its FLOPs per gradient step and (one thread) the rate of its gradient steps."""
    rate = f", gradient steps at {run['gflop_per_cpu_s']:.0f} GFLOP per CPU s" if "gflop_per_cpu_s" in run else ""
    return f"{run['cores']:.2f} cores busy, {run['gflop_per_update']:.2f} GFLOP a gradient step{rate}"


if __name__ == "__main__":
    main()
