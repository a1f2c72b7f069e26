"""Double DQN, as rlstructures' example: an epsilon-greedy agent whose epsilon arrives in ``agent_info`` and changes
at every ``execute(agent_info=...)`` over auto-reset envs, a replay buffer of the windows' transitions flattened
(``observation/``, ``action/``, ``_observation/``), a target network updated softly, and greedy evaluations."""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import torch
import torch.nn as nn
from gymnasium.wrappers import TimeLimit

from rlstruct import DictTensor, RL_Agent
from rlstruct.env_wrappers import GymEnv, GymEnvInf
from rlstruct.logger import Logger
from rlstruct.rl_batchers import RL_Batcher


class QMLP(nn.Module):
    def __init__(self, n_observations, n_actions, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, n_actions)

    def forward(self, frame):
        return self.linear2(torch.tanh(self.linear(frame.float())))


class QAgent(RL_Agent):
    def __init__(self, model=None, n_actions=None):
        super().__init__()
        self.model = model
        self.n_actions = n_actions

    def update(self, state_dict):
        self.model.load_state_dict(state_dict)

    def initial_state(self, agent_info, B):
        return DictTensor({})

    def __call__(self, state, observation, agent_info=None, history=None):
        B = observation.n_elems()
        q = self.model(observation["frame"])
        action = q.max(1)[1]
        random_action = torch.randint(self.n_actions, (B,))
        explore = torch.rand(B) < agent_info["epsilon"]
        action = torch.where(explore, random_action, action)
        return DictTensor({"action": action, "q": q}), DictTensor({})


def create_gym_env(env_name):
    return gym.make(env_name)


def create_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return GymEnv(envs, seed)


def create_train_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return GymEnvInf(envs, seed)


def create_agent(model, n_actions=1):
    return QAgent(model=model, n_actions=n_actions)


class ReplayBuffer:
    """A circular buffer of single transitions: every key of the windows, B x T rows flattened."""

    def __init__(self, N):
        self.N = N
        self.buffer = None
        self.pos = 0
        self.size = 0

    def push(self, trajectories):
        assert bool((trajectories.lengths == trajectories.lengths[0]).all())  # full windows: no padding to drop
        flat = {k: trajectories[k].reshape(-1, *trajectories[k].shape[2:]) for k in trajectories.keys()}
        n = next(iter(flat.values())).size(0)
        if self.buffer is None:
            self.buffer = {k: torch.zeros(self.N, *v.shape[1:], dtype=v.dtype) for k, v in flat.items()}
        index = (self.pos + torch.arange(n)) % self.N
        for k, v in flat.items():
            self.buffer[k][index] = v
        self.pos = (self.pos + n) % self.N
        self.size = min(self.size + n, self.N)

    def sample(self, n):
        index = torch.randint(self.size, (n,))
        return DictTensor({k: v[index] for k, v in self.buffer.items()})


class DQN:
    def __init__(self, config, create_train_env, create_env, create_agent):
        self.config = config
        self.logger = Logger(**config)
        self._create_train_env = create_train_env
        self._create_env = create_env
        self._create_agent = create_agent
        env = self._create_env(1, seed=0, env_name=config["env_name"], max_episode_steps=config["max_episode_steps"])
        self.n_actions = env.action_space.n
        self.obs_dim = env.reset()[0]["frame"].size()[1]
        del env

    def _batcher(self, n_timesteps, create_env, n_envs, n_processes):
        return RL_Batcher(
            n_timesteps=n_timesteps,
            create_agent=self._create_agent,
            agent_args={"n_actions": self.n_actions, "model": copy.deepcopy(self.learning_model)},
            create_env=create_env,
            env_args={"n_envs": n_envs, "max_episode_steps": self.config["max_episode_steps"],
                      "env_name": self.config["env_name"]},
            n_processes=n_processes,
            seeds=[self.config["env_seed"] + k * 10 for k in range(max(n_processes, 1))],
            agent_info=DictTensor({"epsilon": torch.zeros(1)}),
            env_info=DictTensor({}),
        )

    def _epsilon(self, n):
        epsilon = self.config["epsilon_greedy_max"] - (
            self.config["epsilon_greedy_max"] - self.config["epsilon_greedy_min"]
        ) * self.iteration / self.config["epsilon_min_epoch"]
        return DictTensor({"epsilon": torch.tensor([max(epsilon, self.config["epsilon_greedy_min"])]).repeat(n)})

    def _launch_evaluation(self):
        n = self.config["n_evaluation_envs"] * max(self.config["n_evaluation_processes"], 1)
        self.evaluation_batcher.update(self.learning_model.state_dict())
        self.evaluation_batcher.reset(agent_info=DictTensor({"epsilon": torch.zeros(n)}))
        self.evaluation_batcher.execute()
        self.evaluation_iteration = self.iteration

    def _log_evaluation(self, trajectories):
        reward = trajectories.trajectories["_observation/reward"] * trajectories.trajectories.mask()
        self.logger.add_scalar("evaluation_reward", reward.sum(1).mean().item(), self.evaluation_iteration)

    def run(self):
        self.learning_model = QMLP(self.obs_dim, self.n_actions, self.config["n_hidden"])
        self.target_model = copy.deepcopy(self.learning_model)
        self.replay_buffer = ReplayBuffer(self.config["replay_buffer_size"])
        self.train_batcher = self._batcher(self.config["batch_timesteps"], self._create_train_env,
                                           self.config["n_envs"], self.config["n_processes"])
        self.evaluation_batcher = self._batcher(self.config["max_episode_steps"], self._create_env,
                                                self.config["n_evaluation_envs"],
                                                self.config["n_evaluation_processes"])
        self.optimizer = getattr(torch.optim, self.config["optim"])(self.learning_model.parameters(),
                                                                     lr=self.config["lr"])
        n_envs = self.config["n_envs"] * max(self.config["n_processes"], 1)
        self.iteration = 0
        self.train_batcher.update(self.learning_model.state_dict())
        self.train_batcher.reset(agent_info=DictTensor({"epsilon": torch.ones(n_envs)}))
        for _ in range(self.config["initial_buffer_epochs"]):
            self.train_batcher.execute()
            trajectories, n = self.train_batcher.get()
            self.replay_buffer.push(trajectories.trajectories)
        self._launch_evaluation()

        start = time.time()
        while time.time() - start < self.config["time_limit"] and self.iteration < self.config["n_iterations"]:
            self.train_batcher.update(self.learning_model.state_dict())
            agent_info = self._epsilon(n_envs)
            self.train_batcher.execute(agent_info=agent_info)
            trajectories, n = self.train_batcher.get()
            assert n == n_envs
            # The acquisition's agent_info is the one execute was given, row by row.
            assert torch.equal(trajectories.info["agent_info/epsilon"], agent_info["epsilon"])
            self.logger.add_scalar("epsilon", agent_info["epsilon"][0].item(), self.iteration)
            self.replay_buffer.push(trajectories.trajectories)
            self.logger.add_scalar("stats/replay_buffer_size", self.replay_buffer.size, self.iteration)
            for _ in range(self.config["qvalue_epochs"]):
                self.learn(self.replay_buffer.sample(self.config["n_batches"]))
            self.iteration += 1
            evaluation_trajectories, _ = self.evaluation_batcher.get(blocking=False)
            if evaluation_trajectories is not None:
                self._log_evaluation(evaluation_trajectories)
                self._launch_evaluation()
        self.train_batcher.close()
        evaluation_trajectories, _ = self.evaluation_batcher.get()
        self._log_evaluation(evaluation_trajectories)
        self.evaluation_batcher.close()
        return self.logger

    def learn(self, transitions):
        self.optimizer.zero_grad()
        loss = self.get_loss(transitions)
        self.logger.add_scalar("q_loss", loss.item(), self.iteration)
        loss.backward()
        self.optimizer.step()
        tau = self.config["update_target_tau"]
        with torch.no_grad():
            for target, source in zip(self.target_model.parameters(), self.learning_model.parameters()):
                target.mul_(1 - tau).add_(tau * source)

    def get_loss(self, transitions):
        action = transitions["action/action"]
        q = self.learning_model(transitions["observation/frame"]).gather(1, action.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_frame = transitions["_observation/frame"]
            next_action = self.learning_model(next_frame).max(1)[1]  # double DQN: chosen online, valued by the target
            next_q = self.target_model(next_frame).gather(1, next_action.unsqueeze(-1)).squeeze(-1)
            done = transitions["_observation/done"].float()
            target = transitions["_observation/reward"] + self.config["discount_factor"] * (1 - done) * next_q
        return ((q - target) ** 2).mean()


CONFIG = {
    "env_name": "CartPole-v1", "n_envs": 4, "max_episode_steps": 500, "env_seed": 42, "n_processes": 4,
    "n_evaluation_processes": 4, "n_evaluation_envs": 32, "time_limit": 3600, "n_iterations": 10**9,
    "discount_factor": 0.99, "epsilon_greedy_max": 0.9, "epsilon_greedy_min": 0.01, "epsilon_min_epoch": 2000,
    "replay_buffer_size": 10000, "n_batches": 32, "initial_buffer_epochs": 1, "qvalue_epochs": 1,
    "batch_timesteps": 4, "n_hidden": 64, "lr": 0.001, "optim": "AdamW", "update_target_tau": 0.005,
    "logdir": "./results",
}

if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.set_start_method("spawn")
    DQN(CONFIG, create_train_env, create_env, create_agent).run()
