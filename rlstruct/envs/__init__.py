"""Environments: the VecEnv contract, gymnasium adapters, DeviceEnv, torch-native simulators, JAX (gymnax) envs,
gymnasium's MuJoCo locomotion tasks on MJX and mujoco-torch, and Brax envs.

The JAX, MuJoCo and Brax envs import jax, mujoco and brax only when one is built, so importing this package never
needs (or starts) them.
"""

from rlstruct.envs._base import StepResult, VecEnv
from rlstruct.envs._torch_env import TorchVecEnv
from rlstruct.envs.brax_env import BraxEnv
from rlstruct.envs.bridge import to_gymnasium, to_gymnasium_env
from rlstruct.envs.classic_control import Acrobot, CartPole, CartPoleNoVel, MountainCar, Pendulum
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.envs.factory import make_env
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.envs.jax_env import GymnaxEnv, JaxVecEnv
from rlstruct.envs.mjx_env import MjxEnv
from rlstruct.envs.mujoco_torch_env import MujocoTorchEnv
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
    "MjxEnv",
    "BraxEnv",
    "MujocoTorchEnv",
    "make_env",
    "to_gymnasium",
    "to_gymnasium_env",
]

register_envs()
