"""rlstruct: fast reinforcement-learning experience collection on any mix of CPUs and GPUs.

The core (structures, environments, devices, errors) lives in this package; agents,
batchers and algorithms are the subpackages ``rlstruct.agents``, ``rlstruct.batchers``
and ``rlstruct.algos``. The names users reach for first are re-exported here.
"""

from rlstruct.devices import DeviceLike, as_device, same_device
from rlstruct.errors import (
    BatcherStateError,
    BatcherWorkerError,
    BatchSizeError,
    BridgeError,
    DeviceMismatchError,
    DeviceUnavailableError,
    EnvStateError,
    MissingDependencyError,
    RLStructError,
    SeedError,
    SpaceError,
)
from rlstruct.seeding import check_seed
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor, masked_tensor
from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf, VecEnv, make_env
from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice, replay_agent, replay_agent_stateless
from rlstruct.batchers import RL_Batcher, WorkerPlacement

__version__ = "0.1.0"

__all__ = [
    "DictTensor",
    "TemporalDictTensor",
    "Trajectories",
    "masked_tensor",
    "masked_dicttensor",
    "RL_Agent",
    "RL_Agent_CheckDevice",
    "replay_agent",
    "replay_agent_stateless",
    "VecEnv",
    "DeviceEnv",
    "GymEnv",
    "GymEnvInf",
    "make_env",
    "RL_Batcher",
    "WorkerPlacement",
    "DeviceLike",
    "as_device",
    "same_device",
    "check_seed",
    "RLStructError",
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "BatchSizeError",
    "SpaceError",
    "SeedError",
    "EnvStateError",
    "BatcherWorkerError",
    "BatcherStateError",
    "MissingDependencyError",
    "BridgeError",
]
