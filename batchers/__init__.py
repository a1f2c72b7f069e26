"""Batchers: collect trajectories from an agent and a vectorized environment."""

from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.batchers._worker import WorkerPlacement

# Imports without Ray: Ray itself is imported when a RayBatcher is built (extra `rlstruct[ray]`).
from rlstruct.batchers.ray_batcher import RayBatcher
from rlstruct.batchers.profile import PhaseTimer, ProfileReport, profile_training
from rlstruct.batchers.autotune import AutotuneResult, Measurement

# The search itself is rlstruct.batchers.autotune.autotune: re-exporting it here would hide the module.
__all__ = [
    "RL_Batcher",
    "WorkerPlacement",
    "RayBatcher",
    "PhaseTimer",
    "ProfileReport",
    "profile_training",
    "AutotuneResult",
    "Measurement",
]
