"""The MinAtar games (Young and Tian 2019) as batched torch simulators: :class:`MinAtarEnv` around one module per
game (its rules over tensors), exact against the reference package ``minatar``."""

from rlstruct.envs.minatar._env import GAMES, MinAtarEnv

__all__ = ["MinAtarEnv", "GAMES"]
