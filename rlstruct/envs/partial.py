"""Partially observed variants of gymnasium envs, registered with gymnasium when :mod:`rlstruct.envs` is imported.

``CartPoleNoVel-v1`` is gymnasium's ``CartPole-v1`` observed without its velocities (``[x, theta]``, as in
rl-baselines3-zoo): the task on which a recurrent policy must beat a feed-forward one. Its torch simulator is
:class:`rlstruct.envs.classic_control.CartPoleNoVel`; this module holds the gymnasium env of the same id, so
that ``make_env("CartPoleNoVel-v1", n, backend="gymnasium")`` and ``gymnasium.make("CartPoleNoVel-v1")``
work too.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["CartPoleNoVelEnv", "register_envs"]

#: CartPole's observation columns kept by ``CartPoleNoVel-v1``: ``x`` and ``theta``.
_KEPT = np.array([0, 2])


class CartPoleNoVelEnv(CartPoleEnv):
    """Gymnasium's ``CartPoleEnv`` whose observation is ``float32 [2]`` = ``[x, theta]``.

    Everything else (dynamics, seeding, rewards, terminations) is ``CartPoleEnv``'s: for the same seed and
    actions, its ``state`` is CartPole's.

    >>> env = gym.make("CartPoleNoVel-v1")
    >>> obs, _ = env.reset(seed=0)
    >>> obs.shape, env.spec.max_episode_steps, env.spec.reward_threshold
    ((2,), 500, 475.0)
    """

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        super().__init__(render_mode=render_mode, **kwargs)
        low, high = self.observation_space.low[_KEPT], self.observation_space.high[_KEPT]
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def step(self, action):
        """CartPole's step, with the velocities dropped from the observation."""
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[_KEPT], reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """CartPole's reset, with the velocities dropped from the observation."""
        obs, info = super().reset(seed=seed, options=options)
        return obs[_KEPT], info


def register_envs() -> None:
    """Registers ``CartPoleNoVel-v1`` (500 steps, reward threshold 475) with gymnasium; idempotent."""
    if "CartPoleNoVel-v1" not in gym.registry:
        gym.register(
            "CartPoleNoVel-v1",
            entry_point="rlstruct.envs.partial:CartPoleNoVelEnv",
            max_episode_steps=500,
            reward_threshold=475.0,
        )
