"""Programs written for rlstructures v0.2 run on rlstruct with only their imports changed.

The rewrite is ``rlstructures`` -> ``rlstruct`` and ``gym`` -> ``gymnasium``, plus one module map for the
submodules rlstructures programs import (:data:`MODULE_MAP`). Every public name of rlstructures' v0.2 API
is imported here by its rewritten path, and a small program written the way rlstructures' own examples
are (an ``RL_Agent``, an ``RL_Batcher`` over ``GymEnv``, REINFORCE returning its losses as a DictTensor of
0-d tensors, logged and back-propagated) runs end to end.
"""

from __future__ import annotations

import importlib

import gymnasium as gym
import pytest
import torch
from gymnasium.wrappers import TimeLimit

from rlstruct import (
    DictTensor,
    RL_Agent,
    RL_Agent_CheckDevice,
    TemporalDictTensor,
    Trajectories,
    masked_tensor,
    replay_agent,
)
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import DeviceEnv, GymEnv

# rlstructures module -> the rlstruct module holding the same names. rlstructures' ``logger`` and ``tools``
# were aliases of its examples package (``rlalgos``: a tensorboard logger, ``weight_init``) and its
# ``batchers``/``logging``/``Agent`` were the deprecated v0.1 API: none of them is part of the library.
MODULE_MAP = {
    "rlstructures": "rlstruct",
    "rlstructures.core": "rlstruct.structures",
    "rlstructures.dicttensor": "rlstruct.structures",
    "rlstructures.env": "rlstruct.envs",
    "rlstructures.env_wrappers": "rlstruct.envs",
    "rlstructures.env_wrappers.gymenv": "rlstruct.envs",
    "rlstructures.env_wrappers.devicewrapper": "rlstruct.envs",
    "rlstructures.rl_batchers": "rlstruct.batchers",
    "rlstructures.rl_batchers.batcher": "rlstruct.batchers",
    "rlstructures.rl_batchers.agent": "rlstruct.agents",
}

# Every public name of each rlstructures module (its __init__ exports and what its example programs import).
NAMES = {
    "rlstructures": [
        "masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor", "Trajectories", "RL_Agent",
        "RL_Agent_CheckDevice", "replay_agent_stateless", "replay_agent", "VecEnv", "RL_Batcher",
    ],
    "rlstructures.core": ["masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor", "Trajectories"],
    "rlstructures.dicttensor": ["masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor"],
    "rlstructures.env": ["VecEnv"],
    "rlstructures.env_wrappers": ["GymEnv", "GymEnvInf", "DeviceEnv"],
    "rlstructures.env_wrappers.gymenv": ["GymEnv", "GymEnvInf"],
    "rlstructures.env_wrappers.devicewrapper": ["DeviceEnv"],
    "rlstructures.rl_batchers": ["RL_Batcher"],
    "rlstructures.rl_batchers.batcher": ["RL_Batcher"],
    "rlstructures.rl_batchers.agent": ["RL_Agent", "RL_Agent_CheckDevice", "replay_agent", "replay_agent_stateless"],
}

CASES = [(module, name) for module, names in NAMES.items() for name in names]


@pytest.mark.parametrize("module, name", CASES, ids=[f"{m}.{n}" for m, n in CASES])
def test_every_rlstructures_name_is_found_by_its_rewritten_path(module, name):
    target = importlib.import_module(MODULE_MAP[module])
    assert hasattr(target, name), f"{MODULE_MAP[module]} lacks {name} (rlstructures: from {module} import {name})"
    # A re-export, not a copy: every path gives the one object.
    top = importlib.import_module("rlstruct")
    if hasattr(top, name):
        assert getattr(target, name) is getattr(top, name)


def test_every_rewritten_module_is_in_the_map():
    assert set(NAMES) == set(MODULE_MAP)


# ------------------------------------------------------------------------ an rlstructures-style program
# Written as rlstructures' REINFORCE example is: module-level create_env/create_agent, a stateless agent
# sampling or taking the argmax by agent_info["stochastic"] with masked_tensor, replay_agent for the loss,
# and the losses returned as a DictTensor of 0-d tensors that the loop logs and back-propagates. Its imports
# are the module's: ``rlstructures`` -> ``rlstruct``, ``rlstructures.env_wrappers`` -> ``rlstruct.envs``,
# ``rlstructures.rl_batchers`` -> ``rlstruct.batchers``, ``gym`` -> ``gymnasium``.


class ActionModel(torch.nn.Module):
    def __init__(self, n_observations, n_actions, n_hidden):
        super().__init__()
        self.linear = torch.nn.Linear(n_observations, n_hidden)
        self.linear2 = torch.nn.Linear(n_hidden, n_actions)

    def forward(self, frame):
        return torch.softmax(self.linear2(torch.tanh(self.linear(frame))), dim=-1)


class BaselineModel(torch.nn.Module):
    def __init__(self, n_observations, n_hidden):
        super().__init__()
        self.linear = torch.nn.Linear(n_observations, n_hidden)
        self.linear2 = torch.nn.Linear(n_hidden, 1)

    def forward(self, frame):
        return self.linear2(torch.tanh(self.linear(frame)))


class Model(torch.nn.Module):
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
        B = observation.n_elems()
        action_proba = self.model.action_model(observation["frame"])
        baseline = self.model.baseline_model(observation["frame"])
        dist = torch.distributions.Categorical(action_proba)
        action_sampled = dist.sample()
        action_max = action_proba.max(1)[1]
        smask = agent_info["stochastic"].float()
        action = masked_tensor(action_max, action_sampled, smask)
        new_state = DictTensor({})
        agent_do = DictTensor({"action": action, "action_probabilities": action_proba, "baseline": baseline})
        assert agent_do.n_elems() == B
        return agent_do, new_state


def create_gym_env(env_name):
    return gym.make(env_name)


def create_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
    envs = []
    for _ in range(n_envs):
        e = create_gym_env(env_name)
        e = TimeLimit(e, max_episode_steps=max_episode_steps)
        envs.append(e)
    return DeviceEnv(GymEnv(envs, seed), from_device="cpu", to_device="cpu")


def create_agent(model, n_actions=1):
    return RL_Agent_CheckDevice(ReinforceAgent(model=model, n_actions=n_actions), "cpu")


class Logger:
    """What the examples' TFLogger did with the losses: one Python float per name and iteration."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, name, value, iteration):
        self.scalars.setdefault(name, []).append((iteration, value))


class Reinforce:
    def __init__(self, config, create_env, create_agent):
        self.config = config
        self._create_env = create_env
        self._create_agent = create_agent
        self.logger = Logger()

    def run(self):
        env = self._create_env(self.config["n_envs"], env_name=self.config["env_name"],
                               max_episode_steps=self.config["max_episode_steps"], seed=0)
        n_actions = env.action_space.n
        n_observations = env.reset()[0]["frame"].size()[1]
        del env
        self.learning_model = Model(ActionModel(n_observations, n_actions, 16), BaselineModel(n_observations, 16))
        self.agent = self._create_agent(n_actions=n_actions, model=self.learning_model)
        self.train_batcher = RL_Batcher(
            n_timesteps=self.config["max_episode_steps"],
            create_agent=self._create_agent,
            create_env=self._create_env,
            env_args={
                "n_envs": self.config["n_envs"],
                "max_episode_steps": self.config["max_episode_steps"],
                "env_name": self.config["env_name"],
            },
            agent_args={"n_actions": n_actions, "model": self.learning_model},
            n_processes=self.config["n_processes"],
            seeds=[self.config["env_seed"] + k * 10 for k in range(max(self.config["n_processes"], 1))],
            agent_info=DictTensor({"stochastic": torch.tensor([True])}),
            env_info=DictTensor({}),
        )
        self.optimizer = torch.optim.RMSprop(self.learning_model.parameters(), lr=self.config["lr"])
        n_rows = self.config["n_envs"] * max(self.config["n_processes"], 1)
        losses = []
        for self.iteration in range(self.config["n_iterations"]):
            self.train_batcher.update(self.learning_model.state_dict())
            self.train_batcher.reset(agent_info=DictTensor({"stochastic": torch.tensor([True]).repeat(n_rows)}))
            self.train_batcher.execute()
            trajectories, n_env_running = self.train_batcher.get(blocking=True)
            assert n_env_running == 0
            self.optimizer.zero_grad()
            dt = self.get_loss(trajectories)
            for k in dt.keys():
                self.logger.add_scalar(k, dt[k].item(), self.iteration)
            floss = (
                self.config["baseline_coef"] * dt["baseline_loss"]
                - self.config["entropy_coef"] * dt["entropy_loss"]
                - self.config["reinforce_coef"] * dt["reinforce_loss"]
            )
            floss.backward()
            self.optimizer.step()
            losses.append(dt.detach())
        self.train_batcher.close()
        return losses

    def get_loss(self, trajectories):
        assert isinstance(trajectories, Trajectories)
        trajectories = trajectories.to("cpu")
        info, trajectories = trajectories.info, trajectories.trajectories
        assert isinstance(trajectories, TemporalDictTensor) and "agent_info/stochastic" in info.keys()
        mask = trajectories.mask()
        reward = trajectories["_observation/reward"] * mask
        max_length = trajectories.lengths.max().item()
        cumulated_reward = torch.zeros_like(reward)
        cumulated_reward[:, max_length - 1] = reward[:, max_length - 1]
        for t in range(max_length - 2, -1, -1):
            cumulated_reward[:, t] = reward[:, t] + self.config["discount_factor"] * cumulated_reward[:, t + 1]
        replayed = replay_agent(self.agent, Trajectories(info, trajectories))
        action_probabilities = replayed["action_probabilities"]
        baseline = replayed["baseline"].squeeze(-1)
        action = trajectories["action/action"]
        log_proba = torch.log(action_probabilities.gather(-1, action.unsqueeze(-1)).squeeze(-1))
        reinforce_loss = (log_proba * (cumulated_reward - baseline).detach() * mask).sum(1) / mask.sum(1)
        entropy = torch.distributions.Categorical(action_probabilities).entropy()
        entropy_loss = (entropy * mask).sum(1) / mask.sum(1)
        baseline_loss = ((baseline - cumulated_reward) ** 2 * mask).sum(1) / mask.sum(1)
        avg_reward = cumulated_reward[:, 0].mean()
        return DictTensor({
            "avg_reward": avg_reward,
            "reinforce_loss": reinforce_loss.mean(),
            "entropy_loss": entropy_loss.mean(),
            "baseline_loss": baseline_loss.mean(),
        })


@pytest.mark.timeout(120)
def test_an_rlstructures_reinforce_program_runs_unchanged():
    config = {
        "env_name": "CartPole-v1", "n_envs": 4, "max_episode_steps": 20, "env_seed": 42, "n_processes": 0,
        "lr": 0.01, "discount_factor": 0.9, "baseline_coef": 0.1, "entropy_coef": 0.01, "reinforce_coef": 1.0,
        "n_iterations": 3,
    }
    torch.manual_seed(0)
    algo = Reinforce(config, create_env, create_agent)
    losses = algo.run()
    assert len(losses) == 3 and all(loss.is_record() for loss in losses)
    assert set(algo.logger.scalars) == {"avg_reward", "reinforce_loss", "entropy_loss", "baseline_loss"}
    for name, values in algo.logger.scalars.items():
        assert [i for i, _ in values] == [0, 1, 2] and all(isinstance(v, float) for _, v in values), name
    # The losses are the ones back-propagated: replay_agent gave them a graph reaching every weight.
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in algo.learning_model.parameters())
    entropy = [v for _, v in algo.logger.scalars["entropy_loss"]]
    assert all(0.0 < h <= float(torch.log(torch.tensor(2.0))) + 1e-6 for h in entropy)
    printed = repr(losses[0])
    assert printed.startswith("DictTensor(record, device=cpu, {avg_reward: ")
