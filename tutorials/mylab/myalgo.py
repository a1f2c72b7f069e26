"""Tutorial 12's A2C learner, handed to rlstruct's harness from a file of your own.

The loss is part 1's: the policy gradient of the n-step returns bootstrapped through time limits (GAE with
lambda = 1 gives them), a value regression and an entropy bonus. The harness gives the rest: the workers, the
network (``--hidden-sizes``), presets, checkpoints, resume, the stopping rule, ``rlstruct eval``, ``load(RUN)``,
``export``, ``compare`` and ``sweep``. Train it from the folder that holds ``mylab``:
``rlstruct train mylab.myalgo:ALGORITHM --env CartPole-v1``.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from rlstruct.algos.harness import (
    ACTOR_CRITIC,
    Batch,
    OnPolicyAlgorithm,
    OnPolicyConfig,
    RecurrentPart,
    RolloutPart,
    default,
    main,
    reads,
    setting,
    trainer,
)
from rlstruct.algos.policies import actor_critic_outputs, policy_actions
from rlstruct.algos.returns import gae_advantages


@dataclasses.dataclass
class MyA2CConfig(RolloutPart, RecurrentPart, OnPolicyConfig):
    """Part 1's settings: 16 envs x 8 steps per update, Adam at 3e-3, the gradient's norm clipped at 0.5."""

    n_envs: int = default(16)
    n_steps: int = default(8)
    lr: float = default(3e-3)
    value_coef: float = setting(0.5, "weight of the value loss")
    entropy_coef: float = setting(0.01, "weight of the entropy bonus")


@reads("frame", "next_frame", "action", "reward", "terminated", "done")
def a2c_loss(model, config: MyA2CConfig, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = actor_critic_outputs(model, batch["frame"], batch["next_frame"], batch["action"])
    with torch.no_grad():  # returns - V(s): part 1's n_step_returns, as GAE with lambda = 1
        advantage = gae_advantages(batch["reward"], out["value"], out["next_value"], batch["terminated"],
                                   batch["done"], config.gamma, 1.0)
    policy = -(out["log_prob"] * advantage).mean()
    value = (out["value"] - (advantage + out["value"]).detach()).pow(2).mean()
    entropy = out["entropy"].mean()
    loss = policy + config.value_coef * value - config.entropy_coef * entropy
    return loss, {"loss/policy": policy.detach(), "loss/value": value.detach(), "loss/entropy": entropy.detach()}


def learn_step(config: MyA2CConfig, learner):
    """One gradient step per collection, as in part 1."""
    update = learner.update_step(functools.partial(a2c_loss, learner.model, config), config, max_grad_norm=0.5)

    def learn(traj, rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        tt = traj.trajectories
        return update({"frame": tt["observation/frame"], "next_frame": tt["_observation/frame"],
                       "action": policy_actions(tt), "reward": rewards, "terminated": tt["_observation/terminated"],
                       "done": tt["_observation/done"]})

    return learn


ALGORITHM = OnPolicyAlgorithm(name="mya2c", title="My A2C", config_cls=MyA2CConfig, model=ACTOR_CRITIC,
                              description="Tutorial 12's A2C learner through rlstruct's harness",
                              make_learn=learn_step, search_space={"lr": {"low": 1e-4, "high": 1e-2, "log": True}})
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main(ALGORITHM))
