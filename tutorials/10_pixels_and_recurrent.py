"""Tutorial 10: learning from pixels (a CNN) and from histories (an LSTM).

Two kinds of observation need more than the MLP of the earlier tutorials:

* **images**: ``rlstruct.algos.encoders.make_encoder`` picks a CNN when an env's observation has three
  dimensions (the Nature-DQN stack for Atari frames, MinAtar's small one for 10x10 frames; channel-last frames
  are detected and permuted). Frames stay in the env's dtype (``uint8`` pixels) through the batcher's buffer and
  the replay buffer, and become floats only inside the network's forward, on the learner's device.
* **partial observations**: on ``CartPoleNoVel-v1`` (CartPole without its velocities) a policy must remember.
  ``rlstruct.algos.networks`` has an LSTM actor-critic whose memory is the state of its agent (in
  ``rlstruct.algos.policies``): the batcher carries it from one ``execute`` to the next and stores it at the start
  of every acquisition; the learner replays each window from that stored state with ``replay_agent``
  (``--recurrent`` on the command line).

The last section feeds the CNN from rlstruct's torch MinAtar games, which step as tensors on the batcher's device
(a GPU when there is one), while the learner keeps the network on its own device; the command line does the same
with ``rlstruct train ppo --env MinAtar/Breakout-v1 --backend torch --batcher-device cuda --learner-device cpu``.

Run it with ``python tutorials/10_pixels_and_recurrent.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the recurrent comparison's budget, 120k env steps for each
policy at 1.0: below that the LSTM does not reliably beat the MLP, so the tests run it small and
``tests/algos/test_recurrent.py`` checks the LSTM's 120k run. The pixel run's 16k env steps only grow: below them A2C
does not learn from the frames yet.
"""

from __future__ import annotations

import os
import tempfile

import gymnasium as gym
import numpy as np
import torch

from rlstruct import DictTensor, RL_Batcher, cpu_state_dict
from rlstruct.algos import create_env, describe_env
from rlstruct.algos.a2c import A2CConfig, train
from rlstruct.algos.encoders import CNNEncoder, MLPEncoder, make_encoder
from rlstruct.algos.networks import EncoderActorCritic, build_actor_critic, recurrent_actor_critic
from rlstruct.algos.policies import RecurrentPolicyAgent, create_policy_agent, create_recurrent_agent, replay_window
from rlstruct.envs import CartPole, CartPoleNoVel

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


class Dot(gym.Env):
    """A tiny image env: ``uint8 [8, 8, 3]`` frames (channel-last) with one lit pixel; action 0 earns 1 when the
    pixel is in the left half, action 1 when it is in the right half."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), dtype=np.uint8)
    action_space = gym.spaces.Discrete(2)

    def _frame(self):
        self.side = int(self.np_random.integers(2))
        frame = np.zeros((8, 8, 3), dtype=np.uint8)
        frame[self.np_random.integers(8), self.side * 4 + self.np_random.integers(4)] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        return self._frame(), reward, False, False, {}


gym.register("TutorialDot-v0", entry_point=Dot, max_episode_steps=16)


def encoders() -> None:
    print("== 1. The encoder follows the observation's shape")
    assert isinstance(make_encoder((4,), (64, 64)), MLPEncoder)
    atari = make_encoder((4, 84, 84), (64,), "uint8")
    minatar = make_encoder((10, 10, 4), (64,), "bool")
    assert isinstance(atari, CNNEncoder) and atari.kind == "nature" and atari.out_dim == 512
    assert isinstance(minatar, CNNEncoder) and minatar.kind == "minatar" and minatar.channels_last
    # The scale comes from the env's dtype, not from the batch: uint8 frames from the batcher and the same frames
    # as float32 (what a replay buffer's sample returns) give the same features.
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert torch.equal(atari(frames), atari(frames.float()))
    spec = describe_env("TutorialDot-v0", "gymnasium", None)
    assert spec.pixels and spec.obs_shape == (8, 8, 3) and spec.obs_dtype == "uint8"
    assert isinstance(build_actor_critic(spec, (64,)), EncoderActorCritic)
    print(f"   {spec.obs_shape} {spec.obs_dtype} frames -> {type(build_actor_critic(spec, (64,)).encoder).__name__}")


def frames_stay_uint8() -> None:
    print("== 2. Frames stay uint8 in the batcher's buffer")
    spec = describe_env("TutorialDot-v0", "gymnasium", None)
    with RL_Batcher(4, create_policy_agent, {"spec": spec, "hidden_sizes": (64,)}, create_env,
                    {"name": "TutorialDot-v0", "n_envs": 3, "autoreset": True, "backend": "gymnasium"}, 0, [0]) as b:
        b.reset()
        b.execute()
        traj, _ = b.get()
    frame = traj.trajectories["observation/frame"]
    assert frame.dtype == torch.uint8 and frame.shape == (3, 4, 8, 8, 3)
    print(f"   observation/frame {tuple(frame.shape)} {frame.dtype}: a quarter of the float32 memory")


def learn_from_pixels(budget: int) -> float:
    """A2C on TutorialDot-v0's frames for ``budget`` env steps; returns the final greedy evaluation return."""
    print("== 3. A2C learns from the frames with the CNN")
    with tempfile.TemporaryDirectory() as logdir:
        result = train(A2CConfig(env="TutorialDot-v0", backend="gymnasium", lr=1e-3, n_envs=16,
                                 max_env_steps=budget, time_limit=600.0, n_evaluation_envs=8,
                                 logdir=logdir, progress=False, tensorboard=False))
    print(f"   greedy return {result.eval_return:.2f} of 16 (a random policy gets 8) after {result.env_steps} steps")
    assert result.env_steps >= budget, f"stopped at {result.env_steps} of {budget} env steps"
    # 16k steps take seeds 0-2 to 16.0, 15.6 and 15.6 (8k steps: 9.9, 8.5, 7.8, still near random).
    assert result.eval_return >= 12, result.eval_return
    return result.eval_return


def a_pomdp() -> None:
    print("== 4. CartPoleNoVel-v1: CartPole without its velocities")
    full, part = CartPole(4, seed=0), CartPoleNoVel(4, seed=0)
    obs_full, _ = full.reset()
    obs_part, _ = part.reset()
    assert obs_part["frame"].shape == (4, 2)
    # Same seed, same states: the observation is CartPole's columns x and theta.
    assert torch.equal(obs_part["frame"], obs_full["frame"][:, [0, 2]])


def recurrent_state_in_the_batcher() -> None:
    print("== 5. The LSTM's memory is the agent state; the learner replays windows from it")
    spec = describe_env("CartPoleNoVel-v1", "torch", None)
    torch.manual_seed(0)
    model = recurrent_actor_critic(spec, (32,))
    env_args = {"name": "CartPoleNoVel-v1", "n_envs": 4, "autoreset": True, "max_episode_steps": 10}
    with RL_Batcher(16, create_recurrent_agent, {"spec": spec, "hidden_sizes": (32,)}, create_env, env_args, 0, [0],
                    agent_info=DictTensor({"stochastic": torch.tensor([True])})) as b:
        b.update(cpu_state_dict(model))
        b.reset()
        for _ in range(2):
            b.execute()
            traj, _ = b.get()
    # The second window starts from the memory the first one ended with (not zeros) ...
    assert traj.info["agent_state/h"].abs().sum() > 0
    # ... episodes of 10 steps restart inside windows of 16, where the agent zeroes its memory ...
    assert traj.trajectories["observation/initial_state"][:, 1:].any()
    # ... and replaying the window from the stored state, through the same resets, gives the batcher's numbers: to the
    # last bit where the CPU's kernels round the batcher's row counts as they round the replay's, within float32
    # rounding (a few ulps) everywhere.
    out = replay_window(RecurrentPolicyAgent(model, "cpu"), model, traj)
    torch.testing.assert_close(out["log_prob"], traj.trajectories["action/log_prob"], rtol=1e-5, atol=1e-6)
    print(f"   agent_state/h {tuple(traj.info['agent_state/h'].shape)}; replayed log-probs match the batcher's")


def recurrent_against_feed_forward(budget: int) -> dict[bool, float]:
    """Recurrent and feed-forward A2C on CartPoleNoVel-v1 for ``budget`` env steps each; returns the best
    evaluation return of each, by ``recurrent``."""
    print("== 6. Recurrent A2C against feed-forward A2C on CartPoleNoVel-v1, same budget")
    best = {}
    for recurrent in (False, True):
        with tempfile.TemporaryDirectory() as logdir:
            # The budget is env steps, not wall clock (a loaded machine would cut it short). preset="none": the
            # env's preset would choose the LSTM for both runs (a field equal to its default counts as not given).
            result = train(A2CConfig(env="CartPoleNoVel-v1", recurrent=recurrent, max_env_steps=budget, seed=0,
                                     time_limit=600.0, stop_at_reward_threshold=False, logdir=logdir,
                                     progress=False, tensorboard=False, preset="none"))
        assert result.env_steps >= budget, f"stopped at {result.env_steps} of {budget} env steps"
        evals = [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]
        best[recurrent] = max(evals)
        print(f"   {'LSTM' if recurrent else 'MLP '}: best evaluation {best[recurrent]:.1f} in {budget} env steps")
    # In 120k steps (scale 1) the LSTM's best is well above the MLP's (seeds 0-3: 291, 360, 101 and 500 against 47,
    # 47, 46 and 44; seeds 4-9: 494-500). Without an entropy bonus the policy first collapses towards one action, and
    # when it escapes depends on the seed and on the last bits of the CPU's rounding: seed 0 reaches 291 on one CPU
    # and 85.5 on another (against the MLP's 45.7), 204 with two torch threads. tests/algos/test_recurrent.py checks
    # this LSTM run's settings (seed 8, 120k env steps, stopping at a confirmed threshold) above 1.2 times the MLP's
    # best measured over seeds, a margin under the lowest of these. In 80k steps the LSTM reaches 100 on 4 of seeds
    # 0-11; in fewer, the MLP, with fewer weights to fit, is still ahead (at 30k: 46-50 against 26-39), so the tests'
    # small run checks only that both train.
    return best


def torch_minatar_on_two_devices() -> None:
    print("== 7. Torch MinAtar: the batcher steps the games on its device, the CNN learns on another")
    # With a GPU the games and the acting CNN run on it and the learner's copy stays on the CPU; without, both are
    # the CPU and the same code runs.
    batcher_device = "cuda" if torch.cuda.is_available() else "cpu"
    learner_device = "cpu"
    spec = describe_env("MinAtar/Breakout-v1", "torch", None)
    torch.manual_seed(0)
    model = build_actor_critic(spec, (64,)).to(learner_device)
    env_args = {"name": "MinAtar/Breakout-v1", "n_envs": 8, "autoreset": True, "backend": "torch",
                "device": batcher_device}
    with RL_Batcher(16, create_policy_agent, {"spec": spec, "hidden_sizes": (64,), "device": batcher_device},
                    create_env, env_args, 0, [0], device=batcher_device,
                    agent_info=DictTensor({"stochastic": torch.tensor([True])})) as b:
        b.update(cpu_state_dict(model))
        b.reset()
        b.execute()
        traj, _ = b.get()
    frame = traj.trajectories["observation/frame"]
    # The game's bool planes, [envs, steps, 10, 10, 4], on the batcher's device ...
    assert frame.dtype == torch.bool and frame.shape == (8, 16, 10, 10, 4) and frame.device.type == batcher_device
    # ... cross to the learner at one boundary and become floats only inside its CNN's forward.
    traj = traj.to(learner_device)
    logits = model.policy(traj.trajectories["observation/frame"].flatten(0, 1)).logits
    assert logits.shape == (8 * 16, spec.n_actions) and logits.device.type == learner_device
    print(f"   {tuple(frame.shape)} {frame.dtype} frames from {batcher_device}, the CNN's policy on {learner_device}")


def main() -> None:
    encoders()
    frames_stay_uint8()
    # A budget the size knob does not shrink: below it the claim does not hold.
    learn_from_pixels(max(16_000, int(16_000 * SCALE)))
    a_pomdp()
    recurrent_state_in_the_batcher()
    recurrent_against_feed_forward(int(120_000 * SCALE))
    torch_minatar_on_two_devices()
    print("tutorial 10: all claims hold")


if __name__ == "__main__":
    main()
