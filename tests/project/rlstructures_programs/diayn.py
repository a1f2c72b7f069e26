"""DIAYN on REINFORCE, as rlstructures' example: several skills learnt at once, each trajectory's skill drawn at
``reset`` and carried in ``agent_info["idx_policy"]`` (so in ``info["agent_info/idx_policy"]`` of what the batcher
returns), a discriminator guessing the skill from the frames it reaches, its probability the reward."""

from __future__ import annotations

import gymnasium as gym
import torch
import torch.nn as nn
from gymnasium.wrappers import TimeLimit

from rlstruct import DictTensor, RL_Agent, masked_tensor
from rlstruct.env_wrappers import GymEnv
from tests.project.rlstructures_programs.reinforce import CONFIG as REINFORCE_CONFIG
from tests.project.rlstructures_programs.reinforce import Reinforce


class DIAYNActionModel(nn.Module):
    """One head of action scores per skill."""

    def __init__(self, n_observations, n_actions, n_hidden, n_policies):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, n_actions * n_policies)
        self.n_policies = n_policies
        self.n_actions = n_actions

    def forward(self, frame, idx_policy):
        scores = self.linear2(torch.tanh(self.linear(frame.float())))
        scores = scores.reshape(-1, self.n_policies, self.n_actions)[torch.arange(scores.size(0)), idx_policy]
        return torch.softmax(scores, dim=-1)


class DIAYNBaselineModel(nn.Module):
    """One value per skill."""

    def __init__(self, n_observations, n_hidden, n_policies):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, n_policies)

    def forward(self, frame, idx_policy):
        values = self.linear2(torch.tanh(self.linear(frame.float())))
        return values[torch.arange(values.size(0)), idx_policy].unsqueeze(-1)


class DIAYNModel(nn.Module):
    def __init__(self, action_model, baseline_model):
        super().__init__()
        self.action_model = action_model
        self.baseline_model = baseline_model


class DIAYNAgent(RL_Agent):
    def __init__(self, model=None, n_actions=None):
        super().__init__()
        self.model = model
        self.n_actions = n_actions

    def update(self, state_dict):
        self.model.load_state_dict(state_dict)

    def initial_state(self, agent_info, B):
        return DictTensor({})

    def __call__(self, state, observation, agent_info=None, history=None):
        assert state.empty()
        idx_policy = agent_info["idx_policy"]
        action_proba = self.model.action_model(observation["frame"], idx_policy)
        baseline = self.model.baseline_model(observation["frame"], idx_policy)
        action_sampled = torch.distributions.Categorical(action_proba).sample()
        action_max = action_proba.max(1)[1]
        action = masked_tensor(action_max, action_sampled, agent_info["stochastic"])
        agent_do = DictTensor({"action": action, "action_probabilities": action_proba, "baseline": baseline})
        return agent_do, DictTensor({})


def create_gym_env(env_name):
    return gym.make(env_name)


def create_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return GymEnv(envs, seed)


def create_agent(model, n_actions=1):
    return DIAYNAgent(model=model, n_actions=n_actions)


class DIAYN(Reinforce):
    def _create_model(self):
        n_policies = self.config["n_policies"]
        self.discriminator = nn.Linear(self.obs_dim, n_policies)
        return DIAYNModel(DIAYNActionModel(self.obs_dim, self.n_actions, 16, n_policies),
                          DIAYNBaselineModel(self.obs_dim, 16, n_policies))

    def _agent_info(self, n_episodes, stochastic):
        agent_info = DictTensor({"stochastic": torch.tensor([stochastic]).repeat(n_episodes)})
        agent_info.set("idx_policy", torch.randint(self.config["n_policies"], size=(n_episodes,)))
        return agent_info

    def _create_optimizers(self):
        return [*super()._create_optimizers(),
                torch.optim.RMSprop(self.discriminator.parameters(), lr=self.config["lr_discriminator"])]

    def _final_loss(self, dt):
        return super()._final_loss(dt) - self.config["discriminator_coef"] * dt["discriminator_loss"]

    def compute_reward(self, trajectories):
        """The discriminator's probability of each trajectory's skill at every frame it reached, B x T."""
        idx_policy = trajectories.info["agent_info/idx_policy"]
        probabilities = torch.softmax(self.discriminator(trajectories.trajectories["_observation/frame"].float()), -1)
        return probabilities[torch.arange(idx_policy.size(0)), :, idx_policy]

    def _rewards(self, trajectories):
        return self.compute_reward(trajectories).detach()

    def _evaluate(self, trajectories):
        return (self.compute_reward(trajectories) * trajectories.trajectories.mask()).sum(1).mean()

    def get_loss(self, trajectories):
        dt = super().get_loss(trajectories)
        mask = trajectories.trajectories.mask()
        discriminator_loss = (self.compute_reward(trajectories).log() * mask).sum(1) / mask.sum(1)
        return dt + DictTensor({"discriminator_loss": discriminator_loss.mean()})


CONFIG = {**REINFORCE_CONFIG, "lr_discriminator": 0.01, "discriminator_coef": 1.0, "n_policies": 5}

if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.set_start_method("spawn")
    DIAYN(CONFIG, create_env, create_agent).run()
