"""rlstructures' ``rlstructures.env`` path: the ``VecEnv`` contract of :mod:`rlstruct.envs`, under that name."""

from rlstruct.envs import VecEnv

__all__ = ["VecEnv"]
