"""rlstruct: fast reinforcement-learning experience collection on any mix of CPUs and GPUs.

The core (structures, environments, devices, errors) lives in this package; agents,
batchers and algorithms are the subpackages ``rlstruct.agents``, ``rlstruct.batchers``
and ``rlstruct.algos``. The names users reach for first are re-exported here.

Coming from rlstructures v0.2: rename ``rlstructures`` to ``rlstruct`` and ``gym`` to ``gymnasium``; every
name of ``from rlstructures import ...`` is here, and its programs' submodule paths (``rlstruct.core``,
``rlstruct.dicttensor``, ``rlstruct.env``, ``rlstruct.env_wrappers``, ``rlstruct.rl_batchers``) re-export the
names of ``rlstruct.structures``, ``rlstruct.envs`` and ``rlstruct.batchers`` they held. Losses returned as
``DictTensor({"loss": x.mean(), ...})`` are records (see :mod:`rlstruct.structures`).
"""

# Python started in the repository's root (pytest, ``python -m rlstruct.algos``) finds this folder first, and the
# agents/, batchers/ and algos/ folders sit beside it, not in it; the editable install's link tree further down
# sys.path holds them as rlstruct's. extend_path adds each rlstruct/ folder of sys.path to this package's path, in a
# form that editors read too (jedi).
from pkgutil import extend_path as _extend_path

__path__ = _extend_path(__path__, __name__)

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice, replay_agent, replay_agent_stateless
from rlstruct.batchers import RL_Batcher, WorkerPlacement
from rlstruct.devices import DeviceLike, as_device, cpu_state_dict, same_device, tree_copy
from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf, VecEnv, make_env
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
    "cpu_state_dict",
    "tree_copy",
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
