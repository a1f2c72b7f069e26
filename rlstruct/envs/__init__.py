"""Environments: the VecEnv contract, gymnasium adapters, DeviceEnv and torch-native simulators."""

from rlstruct.envs._base import StepResult, VecEnv

__all__ = ["VecEnv", "StepResult"]
