"""REINFORCE with a baseline, as rlstructures' example: complete episodes from an episodic GymEnv, a stateless agent
that samples or takes the argmax by ``agent_info["stochastic"]``, ``replay_agent`` for the loss, and an evaluation
batcher polled without blocking. The devices (learner, train batcher, evaluation batcher) are settings, all on the
CPU here; ``reinforce_device.py`` puts them elsewhere."""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import torch
import torch.nn as nn
from gymnasium.wrappers import TimeLimit

from rlstruct import DictTensor, RL_Agent, Trajectories, masked_tensor, replay_agent
from rlstruct.env_wrappers import GymEnv
from rlstruct.logger import Logger
from rlstruct.rl_batchers import RL_Batcher


class ActionModel(nn.Module):
    def __init__(self, n_observations, n_actions, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, n_actions)

    def forward(self, frame):
        return torch.softmax(self.linear2(torch.tanh(self.linear(frame.float()))), dim=-1)


class BaselineModel(nn.Module):
    def __init__(self, n_observations, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, 1)

    def forward(self, frame):
        return self.linear2(torch.tanh(self.linear(frame.float())))


class Model(nn.Module):
    def __init__(self, action_model, baseline_model):
        super().__init__()
        self.action_model = action_model
        self.baseline_model = baseline_model


class ReinforceAgent(RL_Agent):
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
        frame = observation["frame"]
        action_proba = self.model.action_model(frame)
        baseline = self.model.baseline_model(frame)
        action_sampled = torch.distributions.Categorical(action_proba).sample()
        action_max = action_proba.max(1)[1]
        # agent_info arrives on the CPU; the frames on the batcher's device.
        stochastic = agent_info["stochastic"].to(frame.device)
        action = masked_tensor(action_max, action_sampled, stochastic)
        agent_do = DictTensor({"action": action, "action_probabilities": action_proba, "baseline": baseline})
        return agent_do, DictTensor({})


def create_gym_env(env_name):
    return gym.make(env_name)


def create_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return GymEnv(envs, seed)


def create_agent(model, n_actions=1):
    return ReinforceAgent(model=model, n_actions=n_actions)


def discounted_returns(reward, mask, discount_factor):
    """``G_t = r_t + discount * G_{t+1}`` over the masked rewards of B x T trajectories."""
    reward = reward * mask
    max_length = reward.size(1)
    cumulated_reward = torch.zeros_like(reward)
    cumulated_reward[:, max_length - 1] = reward[:, max_length - 1]
    for t in range(max_length - 2, -1, -1):
        cumulated_reward[:, t] = reward[:, t] + discount_factor * cumulated_reward[:, t + 1]
    return cumulated_reward


class Reinforce:
    def __init__(self, config, create_env, create_agent):
        self.config = config
        self.logger = Logger(**config)
        self._create_env = create_env
        self._create_agent = create_agent

    # The places a program on several devices changes.
    def _device(self, role):
        return torch.device(self.config.get(role, "cpu"))

    def _env_args(self, n_envs, role):
        return {"n_envs": n_envs, "max_episode_steps": self.config["max_episode_steps"],
                "env_name": self.config["env_name"]}

    def _agent_args(self, model, role):
        return {"n_actions": self.n_actions, "model": copy.deepcopy(model)}

    def _state_dict(self, model, device):
        return {k: v.to(device) for k, v in model.state_dict().items()}

    def _create_model(self):
        return Model(ActionModel(self.obs_dim, self.n_actions, 16), BaselineModel(self.obs_dim, 16))

    def _agent_info(self, n_episodes, stochastic):
        return DictTensor({"stochastic": torch.tensor([stochastic]).repeat(n_episodes)})

    def _create_batcher(self, n_envs, n_processes, role):
        return RL_Batcher(
            n_timesteps=self.config["max_episode_steps"],
            create_agent=self._create_agent,
            agent_args=self._agent_args(self.learning_model, role),
            create_env=self._create_env,
            env_args=self._env_args(n_envs, role),
            n_processes=n_processes,
            seeds=[self.config["env_seed"] + k * 10 for k in range(max(n_processes, 1))],
            agent_info=self._agent_info(1, True),
            env_info=DictTensor({}),
            device=self._device(role),
        )

    def _evaluate(self, trajectories):
        reward = trajectories.trajectories["_observation/reward"] * trajectories.trajectories.mask()
        return reward.sum(1).mean()

    def run(self):
        env = self._create_env(**self._env_args(1, "batcher_device"), seed=0)
        self.n_actions = env.action_space.n
        self.obs_dim = env.reset()[0]["frame"].size()[1]
        del env

        # Built on the CPU: the batchers' worker processes get a copy before anything touches a GPU here.
        self.learning_model = self._create_model()
        n_train = self.config["n_envs"] * max(self.config["n_processes"], 1)
        n_evaluation = self.config["n_evaluation_envs"] * max(self.config["n_evaluation_processes"], 1)
        self.train_batcher = self._create_batcher(self.config["n_envs"], self.config["n_processes"],
                                                  "batcher_device")
        self.evaluation_batcher = self._create_batcher(self.config["n_evaluation_envs"],
                                                       self.config["n_evaluation_processes"], "evaluation_device")
        self.learning_model.to(self._device("learner_device"))
        self.agent = self._create_agent(**{**self._agent_args(self.learning_model, "learner_device"),
                                           "model": self.learning_model})
        self.optimizers = self._create_optimizers()

        start = time.time()
        self.iteration = 0
        evaluation_mode = self.config["evaluation_mode"] == "stochastic"
        self.evaluation_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
        self.evaluation_batcher.reset(agent_info=self._agent_info(n_evaluation, evaluation_mode))
        self.evaluation_batcher.execute()
        self.evaluation_iteration = self.iteration
        self.train_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
        n_interactions = 0
        while time.time() - start < self.config["time_limit"] and self.iteration < self.config["n_iterations"]:
            self.train_agent_info = self._agent_info(n_train, True)
            self.train_batcher.reset(agent_info=self.train_agent_info)
            self.train_batcher.execute()
            trajectories, n_env_running = self.train_batcher.get(blocking=True)
            assert n_env_running == 0  # n_timesteps = max_episode_steps: every episode ended
            n_interactions += trajectories.trajectories.mask().sum().item()
            self.logger.add_scalar("n_interactions", n_interactions, self.iteration)

            dt = self.get_loss(trajectories)
            for k in dt.keys():
                self.logger.add_scalar("loss/" + k, dt[k].item(), self.iteration)
            floss = self._final_loss(dt)
            for optimizer in self.optimizers:
                optimizer.zero_grad()
            floss.backward()
            for optimizer in self.optimizers:
                optimizer.step()
            self.train_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
            self.iteration += 1

            evaluation_trajectories, n_env_running = self.evaluation_batcher.get(blocking=False)
            if evaluation_trajectories is not None:
                assert n_env_running == 0
                self.logger.add_scalar("evaluation_reward", self._evaluate(evaluation_trajectories).item(),
                                       self.evaluation_iteration)
                self.evaluation_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
                self.evaluation_iteration = self.iteration
                self.evaluation_batcher.reset(agent_info=self._agent_info(n_evaluation, evaluation_mode))
                self.evaluation_batcher.execute()

        self.train_batcher.close()
        evaluation_trajectories, _ = self.evaluation_batcher.get()  # the evaluation under way
        self.logger.add_scalar("evaluation_reward", self._evaluate(evaluation_trajectories).item(),
                               self.evaluation_iteration)
        self.evaluation_batcher.close()
        self.logger.close()
        return self.logger

    def _create_optimizers(self):
        return [torch.optim.RMSprop(self.learning_model.parameters(), lr=self.config["lr"])]

    def _final_loss(self, dt):
        return (self.config["baseline_coef"] * dt["baseline_loss"]
                - self.config["entropy_coef"] * dt["entropy_loss"]
                - self.config["reinforce_coef"] * dt["reinforce_loss"])

    def _rewards(self, trajectories):
        return trajectories.trajectories["_observation/reward"]

    def get_loss(self, trajectories):
        assert isinstance(trajectories, Trajectories)
        # One row per trajectory, in the order reset was given them (worker 0's envs first).
        for k in self.train_agent_info.keys():
            assert torch.equal(trajectories.info["agent_info/" + k].cpu(), self.train_agent_info[k]), k
        trajectories = trajectories.to(self._device("learner_device"))
        reward = self._rewards(trajectories)
        replayed = replay_agent(self.agent, trajectories)
        trajectories = trajectories.trajectories
        mask = trajectories.mask()
        cumulated_reward = discounted_returns(reward, mask, self.config["discount_factor"])

        action_distribution = torch.distributions.Categorical(replayed["action_probabilities"])
        baseline = replayed["baseline"].squeeze(-1)
        log_proba = action_distribution.log_prob(trajectories["action/action"])
        reinforce_loss = (log_proba * (cumulated_reward - baseline).detach() * mask).sum(1) / mask.sum(1)
        entropy = (action_distribution.entropy() * mask).sum(1) / mask.sum(1)
        baseline_loss = ((baseline - cumulated_reward) ** 2 * mask).sum(1) / mask.sum(1)
        return DictTensor({
            "avg_reward": cumulated_reward[:, 0].mean(),
            "baseline_loss": baseline_loss.mean(),
            "reinforce_loss": reinforce_loss.mean(),
            "entropy_loss": entropy.mean(),
        })


CONFIG = {
    "env_name": "CartPole-v1", "n_envs": 4, "max_episode_steps": 100, "env_seed": 42, "n_processes": 4,
    "n_evaluation_processes": 2, "n_evaluation_envs": 32, "time_limit": 3600, "n_iterations": 10**9, "lr": 0.01,
    "discount_factor": 0.9, "baseline_coef": 0.1, "entropy_coef": 0.01, "reinforce_coef": 1.0,
    "evaluation_mode": "stochastic", "logdir": "./results",
}

if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.set_start_method("spawn")
    Reinforce(CONFIG, create_env, create_agent).run()
