"""An image env small enough for CI: learning from pixels in seconds, without ale-py or minatar."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

SIZE = 12
EPISODE_STEPS = 16


class LitSideEnv(gym.Env):
    """``uint8`` frames with one lit pixel: in the left half, action 0 earns 1; in the right half, action 1 does.

    A random policy scores ``EPISODE_STEPS / 2`` per episode (the time limit ends every episode), a policy that
    reads the image ``EPISODE_STEPS``. ``channels_last`` gives ``[SIZE, SIZE, 3]`` frames instead of
    ``[3, SIZE, SIZE]``.
    """

    def __init__(self, channels_last: bool = False):
        shape = (SIZE, SIZE, 3) if channels_last else (3, SIZE, SIZE)
        self.channels_last = channels_last
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self._side = 0

    def _frame(self) -> np.ndarray:
        self._side = int(self.np_random.integers(2))
        row = int(self.np_random.integers(SIZE))
        col = int(self.np_random.integers(SIZE // 2)) + self._side * (SIZE // 2)
        frame = np.zeros(self.observation_space.shape, dtype=np.uint8)
        if self.channels_last:
            frame[row, col, :] = 255
        else:
            frame[:, row, col] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        reward = float(int(action) == self._side)
        return self._frame(), reward, False, False, {}


def register() -> None:
    for name, channels_last in (("LitSide-v0", False), ("LitSideHWC-v0", True)):
        if name not in gym.registry:
            gym.register(name, entry_point=LitSideEnv, kwargs={"channels_last": channels_last},
                         max_episode_steps=EPISODE_STEPS, reward_threshold=float(EPISODE_STEPS))
