"""rlstructures' ``rlstructures.env_wrappers`` path: GymEnv, GymEnvInf and DeviceEnv of :mod:`rlstruct.envs`."""

from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf

__all__ = ["GymEnv", "GymEnvInf", "DeviceEnv"]
