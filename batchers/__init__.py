"""Batchers: collect trajectories from an agent and a vectorized environment.

The Ray batcher, the autotuner and the profile's report load on first use of one of their names, so that a
training run loads the modules it uses (Ray itself is imported when a RayBatcher is built: extra
``rlstruct[ray]``).
"""

from typing import TYPE_CHECKING

# First: importing it checks that rlstruct is the installed package, before the core's imports would fail obscurely.
import rlstruct.batchers._shadow  # noqa: F401

# isort: split
from rlstruct._lazy import by_name, lazy_names
from rlstruct.batchers._placement import WorkerPlacement
from rlstruct.batchers._restart import WorkerRestart, restart_seed
from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.batchers.pipeline import Pipeline
from rlstruct.batchers.weights import WeightSync

if TYPE_CHECKING:  # the lazy names below, for editors and type checkers
    from rlstruct.batchers.autotune import AutotuneResult, Measurement
    from rlstruct.batchers.profile import PhaseTimer, ProfileReport
    from rlstruct.batchers.ray_batcher import RayBatcher

#: the names whose modules load on first use, by module: the imports above, which editors and type checkers read
_LAZY = by_name({
    "rlstruct.batchers.autotune": ("AutotuneResult", "Measurement"),
    "rlstruct.batchers.profile": ("PhaseTimer", "ProfileReport"),
    "rlstruct.batchers.ray_batcher": ("RayBatcher",),
})

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

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
