"""The gymnasium ids rlstruct registers when :mod:`rlstruct.envs` is imported.

* ``CartPoleNoVel-v1``: gymnasium's ``CartPole-v1`` observed without its velocities (``[x, theta]``, as in
  rl-baselines3-zoo), the task on which a recurrent policy must beat a feed-forward one. Its torch simulator is
  :class:`rlstruct.envs.classic_control.CartPoleNoVel`; :class:`CartPoleNoVelEnv` is the gymnasium env of the
  same id, so that ``make_env("CartPoleNoVel-v1", n, backend="gymnasium")`` and ``gymnasium.make`` work too.
* ``MinAtar/<Game>-v1`` (``Asterix``, ``Breakout``, ``Freeway``, ``Seaquest``, ``SpaceInvaders``): the MinAtar
  games (Young and Tian 2019; ``pip install minatar``, imported only when one is built) with their minimal action
  sets, ``bool [10, 10, C]`` frames, and a time limit of 1000 steps (gymnax's). The minatar package declares them
  through a gymnasium plugin that gymnasium 1.x no longer loads. Ids already registered are left as they are.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["CartPoleNoVelEnv", "register_envs", "MINATAR_GAMES", "MINATAR_MAX_EPISODE_STEPS"]

#: MinAtar's games: gymnasium name -> minatar's name.
MINATAR_GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway", "Seaquest": "seaquest",
                 "SpaceInvaders": "space_invaders"}
#: The time limit of the MinAtar ids (gymnax's ``max_steps_in_episode``).
MINATAR_MAX_EPISODE_STEPS = 1000

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
    """Registers ``CartPoleNoVel-v1`` (500 steps, reward threshold 475) and the ``MinAtar/<Game>-v1`` ids with
    gymnasium; idempotent (an id already registered is kept)."""
    if "CartPoleNoVel-v1" not in gym.registry:
        gym.register(
            "CartPoleNoVel-v1",
            entry_point="rlstruct.envs.registration:CartPoleNoVelEnv",
            max_episode_steps=500,
            reward_threshold=475.0,
        )
    for name, game in MINATAR_GAMES.items():
        if f"MinAtar/{name}-v1" not in gym.registry:
            # A string entry point: minatar is imported by gymnasium.make, not here.
            gym.register(f"MinAtar/{name}-v1", entry_point="minatar.gym:BaseEnv",
                         kwargs={"game": game, "use_minimal_action_set": True},
                         max_episode_steps=MINATAR_MAX_EPISODE_STEPS)
