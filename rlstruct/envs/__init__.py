"""Environments: the VecEnv contract, gymnasium adapters, DeviceEnv and torch-native simulators."""

from rlstruct.envs._base import StepResult, VecEnv
from rlstruct.envs._torch_env import TorchVecEnv
from rlstruct.envs.bridge import to_gymnasium, to_gymnasium_env
from rlstruct.envs.classic_control import Acrobot, CartPole, CartPoleNoVel, MountainCar, Pendulum
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.envs.factory import make_env
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.envs.partial import CartPoleNoVelEnv, register_envs

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
    "make_env",
    "to_gymnasium",
    "to_gymnasium_env",
]

register_envs()
