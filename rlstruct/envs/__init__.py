"""Environments: the VecEnv contract, gymnasium adapters, DeviceEnv, torch-native simulators (classic control,
MinAtar), JAX (gymnax) envs, gymnasium's MuJoCo locomotion tasks on MJX and mujoco-torch, and Brax envs.

The JAX, MuJoCo and Brax envs import jax, mujoco and brax only when one is built, so importing this package never
needs (or starts) them; their adapter modules, and the gymnasium bridge, are themselves imported on first use of
one of their names (``rlstruct.envs.BraxEnv``, or ``make_env(..., backend="brax")``), so that a run loads the
adapter of its own backend only.
"""

from typing import TYPE_CHECKING

from rlstruct._lazy import by_name, lazy_names
from rlstruct.envs._base import StepResult, VecEnv
from rlstruct.envs._torch_env import TorchVecEnv
from rlstruct.envs.classic_control import Acrobot, CartPole, CartPoleNoVel, MountainCar, Pendulum
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.envs.factory import make_env
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.envs.registration import CartPoleNoVelEnv, register_envs

if TYPE_CHECKING:  # the lazy names below, for editors and type checkers
    from rlstruct.envs.brax_env import BraxEnv
    from rlstruct.envs.bridge import to_gymnasium, to_gymnasium_env
    from rlstruct.envs.gymnax_env import GymnaxEnv
    from rlstruct.envs.jax_env import JaxVecEnv
    from rlstruct.envs.minatar import MinAtarEnv
    from rlstruct.envs.mjx_env import MjxEnv
    from rlstruct.envs.mujoco_torch_env import MujocoTorchEnv

#: the names whose modules load on first use, by module: the imports above, which editors and type checkers read
_LAZY = by_name({
    "rlstruct.envs.brax_env": ("BraxEnv",),
    "rlstruct.envs.bridge": ("to_gymnasium", "to_gymnasium_env"),
    "rlstruct.envs.gymnax_env": ("GymnaxEnv",),
    "rlstruct.envs.jax_env": ("JaxVecEnv",),
    "rlstruct.envs.minatar": ("MinAtarEnv",),
    "rlstruct.envs.mjx_env": ("MjxEnv",),
    "rlstruct.envs.mujoco_torch_env": ("MujocoTorchEnv",),
})

__all__ = [
    "VecEnv",
    "StepResult",
    "TorchVecEnv",
    "CartPole",
    "CartPoleNoVel",
    "CartPoleNoVelEnv",
    "Acrobot",
    "MountainCar",
    "Pendulum",
    "DeviceEnv",
    "GymEnv",
    "GymEnvInf",
    "JaxVecEnv",
    "GymnaxEnv",
    "MjxEnv",
    "BraxEnv",
    "MujocoTorchEnv",
    "MinAtarEnv",
    "make_env",
    "to_gymnasium",
    "to_gymnasium_env",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())


register_envs()
