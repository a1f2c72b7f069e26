"""Tutorial 7: DQN from the library, configured in code, and the pieces it is made of.

``rlstruct.algos.dqn`` is double DQN with a target network, epsilon-greedy exploration and a uniform
replay buffer, with optional n-step returns. Its training batcher steps auto-reset envs
``rollout_steps`` at a time and receives the current epsilon as per-env ``agent_info`` at each
``execute``; transitions go into a replay buffer of preallocated tensors on the learner device.

The pieces are public and small, so this tutorial checks them one by one before training.

Run it with ``python tutorials/07_dqn.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the training budget (env steps); the tests
run every tutorial with a small value.
"""

from __future__ import annotations

import math
import os
import tempfile

import torch

from rlstruct.algos.dqn import DQNConfig, dqn_loss, epsilon_at, train
from rlstruct.algos.replay import NStepWindow, ReplayBuffer, window_transitions

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


def exploration() -> None:
    print("== 1. Exploration: epsilon decays linearly with env steps, then stays")
    assert epsilon_at(0, 1.0, 0.05, 10_000) == 1.0
    assert math.isclose(epsilon_at(5_000, 1.0, 0.05, 10_000), 0.525)
    assert epsilon_at(10_000, 1.0, 0.05, 10_000) == epsilon_at(10**9, 1.0, 0.05, 10_000) == 0.05


def replay_buffer() -> None:
    print("== 2. The replay buffer: circular, preallocated, written a batch at a time")
    # rlstruct.algos.replay holds the one replay buffer of DQN and SAC; obs_shape is an int for flat
    # observations, a tuple for images (stored in their own dtype: uint8 frames stay uint8).
    buffer = ReplayBuffer(capacity=5, obs_shape=2, device="cpu", seed=0)
    for first in (0, 3):  # two pushes of 3 transitions: the 6th overwrites the 1st
        ids = torch.arange(first, first + 3)
        buffer.push(ids.float().unsqueeze(1).expand(3, 2), ids, ids.float(), torch.zeros(3, 2), torch.ones(3))
    assert len(buffer) == 5
    assert sorted(buffer.action.tolist()) == [1, 2, 3, 4, 5]  # transition 0 is gone
    batch = buffer.sample(8)
    assert batch["obs"].shape == (8, 2) and set(batch["action"].tolist()) <= {1, 2, 3, 4, 5}


def n_step_returns_across_acquisitions() -> None:
    print("== 3. n-step returns over consecutive acquisitions")
    # The batcher hands over T steps of every env at a time, and envs carry over between executes. An
    # n-step return that starts near the end of one acquisition ends in the next: NStepWindow keeps the
    # last n-1 steps and completes them with the next acquisition. After k acquisitions the
    # transitions are exactly those of one window of k*T steps.
    B, T, k, n, gamma = 3, 5, 4, 3, 0.9
    g = torch.Generator().manual_seed(0)
    done = torch.rand(B, k * T, generator=g) < 0.2
    window = {
        "observation/frame": torch.randn(B, k * T, 4, generator=g),
        "action/action": torch.randint(0, 2, (B, k * T), generator=g),
        "_observation/reward": torch.rand(B, k * T, generator=g),
        "_observation/done": done,
        "_observation/terminated": done & (torch.rand(B, k * T, generator=g) < 0.5),
        "_observation/frame": torch.randn(B, k * T, 4, generator=g),
    }
    whole = window_transitions(window, gamma, n)
    stream = NStepWindow(gamma, n)
    parts = [stream({key: v[:, i * T:(i + 1) * T] for key, v in window.items()}) for i in range(k)]
    pieces = {key: torch.cat([p[key].view(B, -1, *p[key].shape[1:]) for p in parts], 1).flatten(0, 1) for key in whole}
    assert whole["ret"].shape[0] == B * (k * T - n + 1)
    for key in whole:
        assert torch.allclose(pieces[key], whole[key]), key
    print(f"   {k} acquisitions of {T} steps = one window of {k * T} steps: {B * (k * T - n + 1)} transitions")


def the_loss() -> None:
    print("== 4. The loss: double-DQN targets, no bootstrap through a termination")
    q = torch.tensor([[1.0, 5.0], [0.0, 2.0]], requires_grad=True)
    actions = torch.tensor([1, 0])
    returns = torch.tensor([5.0, 0.5])
    # Row 0 terminated (discount 0): its target is its return. Row 1 bootstraps with 0.5 * Q_target at
    # the action the *online* network prefers (action 1): 0.5 + 0.5 * (-1) = 0.
    discounts = torch.tensor([0.0, 0.5])
    next_online = torch.tensor([[0.0, 0.0], [0.0, 9.0]])
    next_target = torch.tensor([[7.0, 7.0], [4.0, -1.0]])
    loss, _ = dqn_loss(q, actions, returns, discounts, next_online, next_target, kind="mse")
    assert float(loss.detach()) == 0.0


def train_dqn() -> None:
    print("== 5. Train DQN on CartPole-v1")
    budget = max(1_000, int(10_000 * SCALE))
    with tempfile.TemporaryDirectory() as logdir:
        config = DQNConfig(
            env="CartPole-v1",
            backend="torch",
            n_envs=4,
            rollout_steps=16,  # each execute: 16 steps of 4 envs, then gradient steps
            gradient_steps=16,
            batch_size=64,
            buffer_size=budget,
            learning_starts=budget // 5,
            epsilon_start=1.0,
            epsilon_end=0.05,
            epsilon_decay_steps=budget // 2,
            n_step=1,
            target_update_interval=100,
            max_env_steps=budget,
            time_limit=600.0,  # the env-step budget ends the run; this is only a safety net
            eval_every=max(5, budget // 400),
            n_evaluation_envs=8,
            seed=0,
            logdir=logdir,
            progress=False,
            tensorboard=False,
        )
        result = train(config)

    rows = [r for r in result.history if "epsilon" in r]
    evaluations = [(int(r["env_steps"]), r["eval/return"]) for r in result.history if "eval/return" in r]
    for steps, ret in evaluations:
        print(f"   {steps:>8} env steps: greedy evaluation return {ret:7.1f}")
    print(f"   final: {result.eval_return:.1f} after {result.env_steps} env steps in {result.wall_time_s:.1f} s")
    per_execute = config.n_envs * config.rollout_steps
    assert result.env_steps == result.iterations * per_execute >= budget
    # Exploration followed the schedule, execute by execute (epsilon is per-env agent_info).
    assert rows[0]["epsilon"] == 1.0 and rows[-1]["epsilon"] == config.epsilon_end
    # No gradient step before learning_starts env steps; the buffer then fills to capacity.
    learning = [r for r in rows if "loss/q" in r]
    assert learning and min(r["env_steps"] for r in learning) >= config.learning_starts
    assert rows[-1]["buffer_size"] == min(config.buffer_size, result.env_steps)
    assert len(evaluations) >= 2
    # Episodes played while training (with exploration) get longer: compare the first and last quarter.
    # Windows in which no episode ended report NaN.
    returns = [r["train/episode_return"] for r in rows]
    quarter = max(1, len(returns) // 4)
    early, late = (_nanmean(returns[:quarter]), _nanmean(returns[-quarter:]))
    print(f"   training episode return: {early:.1f} in the first quarter, {late:.1f} in the last")
    # What DQN learns first is values: every step of CartPole pays 1, so the Q-value of an action is about
    # the discounted number of steps still to come. At the first gradient step the network's Q-values are
    # near 0 (its initialisation); bootstrapping from the target network lifts them past one reward within
    # a few hundred gradient steps (seeds 0-2, at the tests' scale of 1k env steps: from about 0.5 to about
    # 3), long before the greedy policy plays well, which takes tens of thousands of steps on CartPole.
    q_values = [r["q_mean"] for r in learning]
    print(f"   mean Q-value of the sampled actions: {q_values[0]:.2f} at the first gradient step, "
          f"{q_values[-1]:.2f} at the last")
    assert q_values[-1] > max(2.0, 3 * q_values[0]), q_values


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else float("nan")


def main() -> None:
    exploration()
    replay_buffer()
    n_step_returns_across_acquisitions()
    the_loss()
    train_dqn()
    print("tutorial 07: all claims hold")


if __name__ == "__main__":
    main()
