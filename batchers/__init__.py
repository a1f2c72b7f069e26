"""Batchers: collect trajectories from an agent and a vectorized environment."""

from rlstruct.batchers._worker import WorkerPlacement
from rlstruct.batchers.autotune import AutotuneResult, Measurement
from rlstruct.batchers.batcher import RL_Batcher, WorkerRestart, restart_seed
from rlstruct.batchers.pipeline import Pipeline
from rlstruct.batchers.profile import PhaseTimer, ProfileReport

# Imports without Ray: Ray itself is imported when a RayBatcher is built (extra `rlstruct[ray]`).
from rlstruct.batchers.ray_batcher import RayBatcher
from rlstruct.batchers.weights import WeightSync

# The search itself is rlstruct.batchers.autotune.autotune: re-exporting it here would hide the module.
__all__ = [
    "RL_Batcher",
    "WorkerPlacement",
    "WorkerRestart",
    "restart_seed",
    "RayBatcher",
    "PhaseTimer",
    "ProfileReport",
    "AutotuneResult",
    "Measurement",
    "Pipeline",
    "WeightSync",
]
