"""rlstructures' ``rlstructures.rl_batchers`` path: ``RL_Batcher`` of :mod:`rlstruct.batchers`, under that name."""

from rlstruct.batchers import RL_Batcher

__all__ = ["RL_Batcher"]
