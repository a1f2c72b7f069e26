"""Environments: the VecEnv contract, gymnasium adapters, DeviceEnv, torch-native simulators (classic control,
MinAtar), JAX (gymnax) envs, gymnasium's MuJoCo locomotion tasks on MJX and mujoco-torch, and Brax envs.

The JAX, MuJoCo and Brax envs import jax, mujoco and brax only when one is built, so importing this package never
needs (or starts) them; their adapter modules, and the gymnasium bridge, are themselves imported on first use of
one of their names (``rlstruct.envs.BraxEnv``, or ``make_env(..., backend="brax")``), so that a run loads the
adapter of its own backend only.
"""

from typing import TYPE_CHECKING

from rlstruct._lazy import lazy_names
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

#: the names whose modules load on first use: name -> module
_LAZY = {
    "JaxVecEnv": "rlstruct.envs.jax_env",
    "GymnaxEnv": "rlstruct.envs.gymnax_env",
    "MjxEnv": "rlstruct.envs.mjx_env",
    "BraxEnv": "rlstruct.envs.brax_env",
    "MujocoTorchEnv": "rlstruct.envs.mujoco_torch_env",
    "MinAtarEnv": "rlstruct.envs.minatar",
    "to_gymnasium": "rlstruct.envs.bridge",
    "to_gymnasium_env": "rlstruct.envs.bridge",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())


register_envs()
