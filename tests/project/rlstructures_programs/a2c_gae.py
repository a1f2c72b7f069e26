"""A2C with GAE and a recurrent policy, as rlstructures' example: windows of ``a2c_timesteps`` steps over auto-reset
envs (GymEnvInf), the recurrent state carried from one window to the next by the batcher and reset by the agent
where an episode starts (``masked_dicttensor`` on ``initial_state``), ``call_replay`` overridden to also give the
critic of t and of t+1 (from ``_observation/``), deterministic evaluation over episodic envs; its model initialised
by ``weight_init`` and its scalars written by ``TFLogger`` (``db.csv`` and TensorBoard in ``logdir``)."""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import torch
import torch.nn as nn
from gymnasium.wrappers import TimeLimit

from rlstruct import DictTensor, RL_Agent, replay_agent
from rlstruct.dicttensor import masked_dicttensor, masked_tensor
from rlstruct.env_wrappers import GymEnv, GymEnvInf
from rlstruct.logger import TFLogger
from rlstruct.rl_batchers import RL_Batcher
from rlstruct.tools import weight_init


class ActionModel(nn.Module):
    def __init__(self, n_observations, n_actions, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.cell = nn.RNNCell(n_hidden, n_hidden)
        self.linear2 = nn.Linear(n_hidden, n_actions)
        self.n_hidden = n_hidden

    def initial_state(self, B):
        return torch.ones(B, self.n_hidden)

    def forward(self, state, frame):
        z = self.cell(torch.tanh(self.linear(frame.float())), state)
        return z, torch.softmax(self.linear2(torch.tanh(z)), dim=-1)


class CriticModel(nn.Module):
    def __init__(self, n_observations, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(2 * n_hidden, 1)

    def forward(self, state, frame):
        return self.linear2(torch.cat([torch.tanh(self.linear(frame.float())), state], dim=1))


class Model(nn.Module):
    def __init__(self, action_model, critic_model):
        super().__init__()
        self.action_model = action_model
        self.critic_model = critic_model


class RecurrentAgent(RL_Agent):
    def __init__(self, model=None, n_actions=None):
        super().__init__()
        self.model = model
        self.n_actions = n_actions

    def update(self, state_dict):
        self.model.load_state_dict(state_dict)

    def initial_state(self, agent_info, B):
        return DictTensor({"agent_state": self.model.action_model.initial_state(B),
                           "agent_step": torch.zeros(B).long()})

    def _step(self, state, observation, agent_info):
        """The recurrent step, shared by acting and replaying: the state restarts where an episode does."""
        B = observation.n_elems()
        state = masked_dicttensor(state, self.initial_state(agent_info, B), observation["initial_state"])
        new_z, action_proba = self.model.action_model(state["agent_state"], observation["frame"])
        return state, new_z, action_proba

    def __call__(self, state, observation, agent_info=None, history=None):
        state, new_z, action_proba = self._step(state, observation, agent_info)
        action_sampled = torch.distributions.Categorical(action_proba).sample()
        action_max = action_proba.max(1)[1]
        action = masked_tensor(action_max, action_sampled, agent_info["stochastic"])
        new_state = DictTensor({"agent_state": new_z, "agent_step": state["agent_step"] + 1})
        return DictTensor({"action": action, "action_probabilities": action_proba}), new_state

    def call_replay(self, trajectories, t, state):
        info = trajectories.info
        if state is None:  # the window's first step starts from the state the batcher recorded
            state = info.truncate_key("agent_state/")
        agent_info = info.truncate_key("agent_info/")
        tslice = trajectories.trajectories.temporal_index(t)
        observation = tslice.truncate_key("observation/")
        _observation = tslice.truncate_key("_observation/")
        state, new_z, action_proba = self._step(state, observation, agent_info)
        critic = self.model.critic_model(state["agent_state"], observation["frame"])
        _critic = self.model.critic_model(new_z, _observation["frame"]).detach()
        new_state = DictTensor({"agent_state": new_z, "agent_step": state["agent_step"] + 1})
        return DictTensor({"critic": critic, "_critic": _critic, "action_probabilities": action_proba}), new_state


def create_gym_env(env_name):
    return gym.make(env_name)


def create_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return GymEnv(envs, seed)


def create_train_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = [TimeLimit(create_gym_env(env_name), max_episode_steps=max_episode_steps) for _ in range(n_envs)]
    return GymEnvInf(envs, seed)


def create_agent(model, n_actions=1):
    return RecurrentAgent(model=model, n_actions=n_actions)


def get_gae(done, reward, critic, _critic, discount_factor, _lambda):
    """Generalised advantage estimates of B x T windows, the bootstrap cut where an episode ended."""
    d = done.float()
    target = reward + discount_factor * _critic.detach() * (1.0 - d)
    delta = target - critic
    gae = delta[:, -1]
    gaes = [gae]
    for t in range(done.size(1) - 2, -1, -1):
        gae = delta[:, t] + discount_factor * _lambda * (1 - d[:, t]) * gae
        gaes.append(gae)
    return torch.stack(list(reversed(gaes)), dim=1)


class A2C:
    timesteps_key = "a2c_timesteps"

    def __init__(self, config, create_train_env, create_env, create_agent):
        self.config = config
        self.logger = TFLogger(log_dir=self.config["logdir"], hps=self.config)
        self._create_train_env = create_train_env
        self._create_env = create_env
        self._create_agent = create_agent
        env = self._create_env(1, seed=0, env_name=config["env_name"], max_episode_steps=config["max_episode_steps"])
        self.n_actions = env.action_space.n
        self.obs_dim = env.reset()[0]["frame"].size()[1]
        del env

    def _create_model(self):
        hidden = self.config["model/hidden_size"]
        model = Model(ActionModel(self.obs_dim, self.n_actions, hidden), CriticModel(self.obs_dim, hidden))
        model.apply(weight_init)
        return model

    def _state_dict(self, model, device):
        return {k: v.to(device) for k, v in model.state_dict().items()}

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
            agent_info=DictTensor({"stochastic": torch.tensor([True])}),
            env_info=DictTensor({}),
        )

    def _launch_evaluation(self):
        n = self.config["n_evaluation_envs"] * max(self.config["n_evaluation_processes"], 1)
        self.evaluation_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
        self.evaluation_batcher.reset(agent_info=DictTensor({"stochastic": torch.tensor([False]).repeat(n)}))
        self.evaluation_batcher.execute()
        self.evaluation_iteration = self.iteration

    def _log_evaluation(self, trajectories):
        reward = trajectories.trajectories["_observation/reward"] * trajectories.trajectories.mask()
        self.logger.add_scalar("evaluation_reward", reward.sum(1).mean().item(), self.evaluation_iteration)

    def run(self):
        self.learning_model = self._create_model()
        self.agent = self._create_agent(n_actions=self.n_actions, model=self.learning_model)
        self.evaluation_batcher = self._batcher(self.config["max_episode_steps"], self._create_env,
                                                self.config["n_evaluation_envs"],
                                                self.config["n_evaluation_processes"])
        self.train_batcher = self._batcher(self.config[self.timesteps_key], self._create_train_env,
                                           self.config["n_envs"], self.config["n_processes"])
        self.optimizer = getattr(torch.optim, self.config["optim"])(self.learning_model.parameters(),
                                                                     lr=self.config["lr"])
        start = time.time()
        self.iteration = 0
        self._launch_evaluation()
        n_envs = self.config["n_envs"] * max(self.config["n_processes"], 1)
        self.train_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
        self.train_batcher.reset(agent_info=DictTensor({"stochastic": torch.tensor([True]).repeat(n_envs)}))
        self.windows = 0
        while time.time() - start < self.config["time_limit"] and self.windows < self.config["n_windows"]:
            self.train_batcher.execute()
            trajectories, n = self.train_batcher.get()
            assert n == n_envs  # auto-reset envs never finish
            assert bool((trajectories.trajectories.lengths == self.config[self.timesteps_key]).all())
            if self.windows > 0:  # the state carried from the previous window, not a fresh one
                assert bool((trajectories.info["agent_state/agent_step"] > 0).all())
            self.learn(trajectories)
            self.train_batcher.update(self._state_dict(self.learning_model, torch.device("cpu")))
            self.windows += 1
            evaluation_trajectories, _ = self.evaluation_batcher.get(blocking=False)
            if evaluation_trajectories is not None:
                self._log_evaluation(evaluation_trajectories)
                self._launch_evaluation()
        self.train_batcher.close()
        evaluation_trajectories, _ = self.evaluation_batcher.get()
        self._log_evaluation(evaluation_trajectories)
        self.evaluation_batcher.close()
        self.logger.update_csv()  # to save as a CSV file in logdir
        self.logger.close()
        return self.logger

    def learn(self, trajectories):
        self.optimizer.zero_grad()
        dt = self.get_loss(trajectories)
        for k in dt.keys():
            self.logger.add_scalar("loss/" + k, dt[k].item(), self.iteration)
        floss = (self.config["critic_coef"] * dt["critic_loss"] - self.config["entropy_coef"] * dt["entropy_loss"]
                 - self.config["a2c_coef"] * dt["a2c_loss"])
        floss.backward()
        if self.config["clip_grad"] > 0:
            n = torch.nn.utils.clip_grad_norm_(self.learning_model.parameters(), self.config["clip_grad"])
            self.logger.add_scalar("grad_norm", n.item(), self.iteration)
        self.optimizer.step()
        self.iteration += 1

    def get_loss(self, trajectories):
        trajectories = trajectories.to(self.config["learner_device"])
        replayed = replay_agent(self.agent, trajectories)
        trajectories = trajectories.trajectories
        gae = get_gae(trajectories["_observation/done"], trajectories["_observation/reward"],
                      replayed["critic"].squeeze(-1), replayed["_critic"].squeeze(-1),
                      self.config["discount_factor"], self.config["gae_coef"])
        action_distribution = torch.distributions.Categorical(replayed["action_probabilities"])
        log_proba = action_distribution.log_prob(trajectories["action/action"])
        return DictTensor({
            "critic_loss": (gae ** 2).mean(),
            "a2c_loss": (log_proba * gae.detach()).mean(),
            "entropy_loss": action_distribution.entropy().mean(),
        })


CONFIG = {
    "env_name": "CartPole-v1", "a2c_timesteps": 20, "n_envs": 4, "max_episode_steps": 100, "env_seed": 42,
    "n_processes": 4, "n_evaluation_processes": 2, "n_evaluation_envs": 32, "time_limit": 3600, "n_windows": 10**9,
    "lr": 0.001, "model/hidden_size": 32, "discount_factor": 0.9, "critic_coef": 1.0, "entropy_coef": 0.01,
    "a2c_coef": 0.1, "gae_coef": 0.3, "clip_grad": 40, "learner_device": "cpu", "optim": "Adam",
    "logdir": "./results",
}

if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.set_start_method("spawn")
    A2C(CONFIG, create_train_env, create_env, create_agent).run()
