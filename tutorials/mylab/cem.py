"""The cross-entropy method as a new family: a population of linear policies, one per training env, each scored by the
return of its first episode in a fixed-length rollout; the best fraction is refit as a Gaussian over the weights
(Szita and Lorincz 2006), and the next population is drawn from it.

Neither on-policy nor off-policy: its description is a plain ``Algorithm`` that carries its own training loop, written
with the harness's run kit only, so that ``rlstruct train``, ``eval``, ``--resume`` and ``profile`` run it through
``mylab.cem:ALGORITHM`` as they run the built-in families. The population reaches the batcher's agents as weights
(``batcher.update``), and each env's ``agent_info["member"]`` says which member acts in it (-1: the mean, which the
evaluations and ``rlstruct eval`` play).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlstruct import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos import TrainResult
from rlstruct.algos.harness import (
    Algorithm,
    EnvSpec,
    LearnerState,
    RunConfig,
    Setup,
    default,
    finish_diverged,
    finish_training,
    load_state,
    main,
    open_batchers,
    open_run,
    record_iteration,
    seeded_model,
    setting,
    trainer,
)
from rlstruct.algos.policies import NetworkAgent
from rlstruct.batchers.profile import LoopTimer
from rlstruct.devices import cpu_state_dict
from rlstruct.structures import DictTensor

__all__ = ["CEMConfig", "LinearPopulation", "first_episode_returns", "train_cem", "ALGORITHM", "train"]


@dataclasses.dataclass
class CEMConfig(RunConfig):
    """The cross-entropy method's settings: the population is the ``n_envs`` training envs, one member each."""

    n_envs: int = default(16)
    max_env_steps: int | None = default(40_000)
    eval_every: int = default(5)
    n_steps: int = setting(200, "steps of every env per iteration, from a reset: one member's score", least=1)
    elite_fraction: float = setting(0.25, "the fraction of the population refit", within="(0, 1]")
    init_std: float = setting(1.0, "the weights' initial standard deviation", least=0.0)
    extra_std: float = setting(0.05, "added to the refit standard deviation, so that the search does not collapse",
                               least=0.0)


def check_env(config: CEMConfig, spec: EnvSpec) -> None:
    """A linear policy over a flat observation, discrete actions."""
    spec.require("cem", config.env, discrete=True, pixels=False, fix="an env with discrete actions, e.g. CartPole-v1")


class LinearPopulation(nn.Module):
    """The search distribution's mean and the members drawn from it: linear policies ``argmax([obs, 1] @ W)``, ``W``
    of ``[obs_dim + 1, n_actions]``; ``mean`` and ``population [size, obs_dim + 1, n_actions]`` are buffers."""

    def __init__(self, spec: EnvSpec, size: int):
        super().__init__()
        shape = (spec.obs_dim + 1, spec.n_actions)
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("population", torch.zeros(size, *shape))

    def forward(self, frame: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """The actions ``int64 [N]`` of frames ``[N, obs_dim]``, row ``i`` by member ``member[i]`` (-1: the mean)."""
        x = torch.cat([frame.float(), torch.ones_like(frame[:, :1], dtype=torch.float32)], -1)
        drawn = self.population[member.clamp_min(0)]
        weights = torch.where((member >= 0)[:, None, None], drawn, self.mean)
        return torch.einsum("no,noa->na", x, weights).argmax(-1)


class CEMAgent(NetworkAgent):
    """The batchers' agent: each env acts with the member its ``agent_info["member"]`` names (float, -1: the mean)."""

    model: LinearPopulation

    def __call__(self, state, observation, agent_info, history=None):
        member = self._on_device(agent_info["member"], "member").long()
        return DictTensor({"action": self.model(observation["frame"], member)}), state

    def deterministic(self, frame: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor]:
        """``(action,)`` of the mean."""
        return (self.model(frame, torch.full(frame.shape[:1], -1, device=frame.device)),)


def create_cem_agent(spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False, *,
                     size: int, network: str | None = None) -> RL_Agent:
    """A batcher's :class:`CEMAgent` over a population of ``size`` (module level, so it pickles)."""
    agent: RL_Agent = CEMAgent(LinearPopulation(spec, size).to(device), device)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def agent(config: Mapping[str, Any]) -> Callable[..., RL_Agent]:
    """The agent factory of a run of ``config`` (a dict): a population of its ``n_envs``."""
    return functools.partial(create_cem_agent, size=int(config["n_envs"]))


def evaluation_info(config: Mapping[str, Any], sample: bool) -> dict[str, bool | float]:
    """The mean acts in the evaluations (a linear policy has no sample to draw)."""
    return {"member": -1.0}


def first_episode_returns(rewards: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """Each env's return up to its first episode's end within the rollout (to its last step if none ends).

    Args:
        rewards: ``float [B, T]``.
        done: ``bool [B, T]``, true at an episode's last step.

    Returns:
        ``float [B]``.

    >>> first_episode_returns(torch.ones(2, 4), torch.tensor([[False, True, False, True], [False] * 4]))
    tensor([2., 4.])
    """
    ended_before = done.long().cumsum(1) - done.long()
    return (rewards * (ended_before == 0)).sum(1)


def _draw(population: LinearPopulation, std: torch.Tensor, seed: int) -> None:
    """Draws the members from ``N(mean, std)``, from a generator keyed by the run's seed and the iteration: the same
    run draws the same populations whether or not it was resumed."""
    noise = torch.randn(population.population.shape, generator=torch.Generator().manual_seed(seed))
    population.population.copy_(population.mean + std * noise)


def train_cem(setup: Setup, *, timer: LoopTimer | None = None) -> TrainResult:
    """The cross-entropy method's training loop (a ``TrainingLoop``): every iteration resets the envs, plays each
    member ``n_steps`` steps in its env, refits the mean and the standard deviation to the elite, and draws the next
    population. The checkpoint's model is the population (its mean is the policy evaluated), its learner state the
    standard deviation."""
    algo, config, spec, resume = setup.algorithm, setup.config, setup.spec, setup.resume
    phase = timer if timer is not None else (lambda name: contextlib.nullcontext())
    with open_run(setup) as (run, stack):
        population = seeded_model(config.seed, LinearPopulation, spec, config.n_envs)
        std = torch.full_like(population.mean, config.init_std)
        owned = LearnerState(std=std)
        if resume is not None:
            load_state(population, resume.model, "the population", resume.path)
            owned.load_state_dict(resume.learner, path=resume.path)
        batcher, evaluator = open_batchers(stack, config, spec, algo.agent(config.to_dict()),
                                           n_timesteps=config.n_steps, autoreset=True, explore={"member": 0.0},
                                           evaluate=algo.evaluation_agent_info(config.to_dict()), seed=run.seed,
                                           run=run, sync_timings=timer is not None and timer.sync)
        if timer is not None:
            timer.watch(batcher)
        members = DictTensor({"member": torch.arange(config.n_envs, dtype=torch.float32)})
        n_elite = max(1, round(config.elite_fraction * config.n_envs))
        if run.logger:
            evaluator.schedule(functools.partial(cpu_state_dict, population), run.iteration, run.env_steps)
        _draw(population, std, config.seed * 1_000_003 + run.iteration)
        batcher.update(cpu_state_dict(population))
        while not run.should_stop():
            with phase("collect"):
                batcher.reset(agent_info=members)  # every member starts an episode
                batcher.execute()
                tt = batcher.get()[0].trajectories
            with phase("learn"):
                scores = first_episode_returns(tt["_observation/reward"], tt["_observation/done"])
                elite = population.population[scores.topk(n_elite).indices]
                population.mean.copy_(elite.mean(0))
                std.copy_(elite.std(0, correction=0) + config.extra_std)
                _draw(population, std, config.seed * 1_000_003 + run.iteration + 1)
            with phase("update_weights"):
                batcher.update(cpu_state_dict(population))
            with phase("record"):
                stats = {"cem/score": scores.mean(), "cem/elite_score": scores.topk(n_elite).values.mean(),
                         "cem/std": std.mean()}
                record_iteration(run, evaluator, config.n_envs * config.n_steps, stats, model=population,
                                 learner=owned.state_dict)
        return finish_training(run, evaluator, population, spec, title=algo.title, learner=owned.state_dict())
    return finish_diverged(run, title=algo.title)


ALGORITHM = Algorithm(name="cem", title="CEM", config_cls=CEMConfig, description=__doc__.splitlines()[0],
                      agent=agent, evaluation_info=evaluation_info, check_env=check_env, loop=train_cem,
                      steps_setting="n_steps")
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main(ALGORITHM))
