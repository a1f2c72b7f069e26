"""REINFORCE on devices, as rlstructures' example: the learner on one device, the training batcher on another (its
CPU envs behind ``DeviceEnv``, its agent copied there and wrapped in ``RL_Agent_CheckDevice``), the evaluation
batcher on the CPU, weights sent as CPU state dicts and trajectories moved to the learner before the loss."""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
from gymnasium.wrappers import TimeLimit

from rlstruct import RL_Agent_CheckDevice
from rlstruct.env_wrappers import DeviceEnv, GymEnv
from tests.project.rlstructures_programs.reinforce import CONFIG as REINFORCE_CONFIG
from tests.project.rlstructures_programs.reinforce import Reinforce, ReinforceAgent


def create_gym_env(env_name):
    return gym.make(env_name)


def create_env(n_envs, env_name=None, max_episode_steps=None, seed=None, device=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return DeviceEnv(GymEnv(envs, seed), from_device=torch.device("cpu"), to_device=device)


def create_agent(model, n_actions=1, device=None, copy_model=True):
    if copy_model:
        model = copy.deepcopy(model)
    model = model.to(device)
    return RL_Agent_CheckDevice(ReinforceAgent(model=model, n_actions=n_actions), device)


class ReinforceOnDevices(Reinforce):
    def _env_args(self, n_envs, role):
        return {**super()._env_args(n_envs, role), "device": self._device(role)}

    def _agent_args(self, model, role):
        # The batchers' agents copy the model onto their device; the loss agent uses the learner's own.
        return {"n_actions": self.n_actions, "model": model, "device": self._device(role),
                "copy_model": role != "learner_device"}

    def get_loss(self, trajectories):
        assert trajectories.device() == self._device("batcher_device")
        return super().get_loss(trajectories)


CONFIG = {**REINFORCE_CONFIG, "learner_device": "cuda:0", "batcher_device": "cuda:1", "evaluation_device": "cpu",
          "time_limit": 20}

if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.set_start_method("spawn")
    ReinforceOnDevices(CONFIG, create_env, create_agent).run()
