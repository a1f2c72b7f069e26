"""PPO over A2C-GAE's recurrent agent, as rlstructures' example pairs them: ``k_epochs`` passes over each window, the
probabilities the batcher recorded (``action/action_probabilities``) as the old policy of the clipped ratio, and
the weights sent to the batcher as a CPU state dict. Before the first pass, ``replay_agent`` recomputes exactly
the probabilities the acting agent recorded."""

from __future__ import annotations

import torch

from rlstruct import DictTensor, replay_agent
from tests.project.rlstructures_programs.a2c_gae import A2C, create_agent, create_env, create_train_env, get_gae


class PPO(A2C):
    timesteps_key = "ppo_timesteps"

    def learn(self, trajectories):
        for epoch in range(self.config["k_epochs"]):
            self.optimizer.zero_grad()
            dt = self.get_loss(trajectories, check_replay=epoch == 0)
            for k in dt.keys():
                self.logger.add_scalar("loss/" + k, dt[k].item(), self.iteration)
            floss = (self.config["coef_critic"] * dt["critic_loss"] - self.config["coef_entropy"] * dt["entropy_loss"]
                     - self.config["coef_ppo"] * dt["ppo_loss"])
            floss.backward()
            if self.config["clip_grad"] > 0:
                torch.nn.utils.clip_grad_norm_(self.learning_model.parameters(), self.config["clip_grad"])
            self.optimizer.step()
            self.iteration += 1

    def get_loss(self, trajectories, check_replay=False):
        trajectories = trajectories.to(self.config["learner_device"])
        replayed = replay_agent(self.agent, trajectories)
        trajectories = trajectories.trajectories
        old_probabilities = trajectories["action/action_probabilities"]
        if check_replay:  # the weights that acted are the learner's: the replay gives the same probabilities
            difference = (replayed["action_probabilities"] - old_probabilities).abs().max()
            self.logger.add_scalar("replay_difference", difference.item(), self.iteration)
            assert difference < 1e-5, difference
        gae = get_gae(trajectories["_observation/done"], trajectories["_observation/reward"],
                      replayed["critic"].squeeze(-1), replayed["_critic"].squeeze(-1),
                      self.config["discount_factor"], self.config["gae_coef"])
        advantage = gae.detach()
        action = trajectories["action/action"].unsqueeze(-1)
        probability = replayed["action_probabilities"].gather(-1, action).squeeze(-1)
        old_probability = old_probabilities.gather(-1, action).squeeze(-1)
        ratio = probability / old_probability
        clipped = ratio.clamp(1 - self.config["clip_epsilon"], 1 + self.config["clip_epsilon"])
        ppo_loss = torch.min(ratio * advantage, clipped * advantage)
        entropy = torch.distributions.Categorical(replayed["action_probabilities"]).entropy()
        return DictTensor({"critic_loss": (gae ** 2).mean(), "ppo_loss": ppo_loss.mean(),
                           "entropy_loss": entropy.mean()})


CONFIG = {
    "env_name": "CartPole-v1", "ppo_timesteps": 20, "n_envs": 4, "max_episode_steps": 100, "env_seed": 42,
    "n_processes": 4, "n_evaluation_processes": 2, "n_evaluation_envs": 32, "time_limit": 3600, "n_windows": 10**9,
    "lr": 0.001, "model/hidden_size": 32, "discount_factor": 0.9, "coef_critic": 1.0, "coef_entropy": 0.01,
    "coef_ppo": 1.0, "gae_coef": 0.3, "clip_epsilon": 0.2, "k_epochs": 4, "clip_grad": 40, "learner_device": "cpu",
    "optim": "Adam", "logdir": "./results",
}

if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.set_start_method("spawn")
    PPO(CONFIG, create_train_env, create_env, create_agent).run()
