"""Environments: the VecEnv contract, gymnasium adapters, DeviceEnv, torch-native simulators and JAX (gymnax) envs.

The JAX envs import jax only when one is built, so importing this package never needs (or starts) jax.
"""

from rlstruct.envs._base import StepResult, VecEnv
from rlstruct.envs._torch_env import TorchVecEnv
from rlstruct.envs.bridge import to_gymnasium, to_gymnasium_env
from rlstruct.envs.classic_control import Acrobot, CartPole, CartPoleNoVel, MountainCar, Pendulum
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.envs.factory import make_env
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.envs.jax_env import GymnaxEnv, JaxVecEnv
from rlstruct.envs.registration import CartPoleNoVelEnv, register_envs

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
    "make_env",
    "to_gymnasium",
    "to_gymnasium_env",
]

register_envs()
