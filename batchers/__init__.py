"""Batchers: collect trajectories from an agent and a vectorized environment."""

from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.batchers._worker import WorkerPlacement

__all__ = ["RL_Batcher", "WorkerPlacement"]
