"""The actor-critic an on-policy algorithm learns unless its description names another model (A2C, PPO, REINFORCE):
its network, its agents, their ``agent_info`` and the envs it takes, gathered in :data:`ACTOR_CRITIC`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.config import ActorCriticPart, OnPolicyConfig, RecurrentPart
from rlstruct.algos._train.registry import OnPolicyModel
from rlstruct.algos._train.update import training_agent_kwargs
from rlstruct.algos.network_factories import ACTOR_CRITIC_CONTRACT, check_network, network_model
from rlstruct.algos.networks import (
    build_actor_critic,
    check_network_options,
    check_normalizable,
    recurrent_actor_critic,
)
from rlstruct.algos.policies import PolicyAgent, RecurrentPolicyAgent, create_policy_agent, create_recurrent_agent
from rlstruct.errors import ConfigError

__all__ = ["ACTOR_CRITIC", "actor_critic_agent", "actor_critic_info", "check_actor_critic_env",
           "check_actor_critic_network"]


#: the settings of :class:`ActorCriticPart` that shape the feed-forward network besides ``normalize_observations``
NETWORK_OPTIONS = ("activation", "log_std_init", "ortho_init")


def actor_critic_agent(config: Mapping[str, Any]) -> Callable[..., RL_Agent]:
    """The batchers' agent factory of an actor-critic run (its ``config`` as a dict): recurrent, or feed-forward with
    the run's network options bound (a saved config without one was trained with its default).

    >>> actor_critic_agent({"activation": "relu"}).keywords
    {'activation': 'relu', 'log_std_init': 0.0, 'ortho_init': True}
    """
    if config.get("recurrent"):
        return create_recurrent_agent
    return functools.partial(create_policy_agent,
                             **{name: config.get(name, getattr(ActorCriticPart, name)) for name in NETWORK_OPTIONS})


def actor_critic_info(config: Mapping[str, Any], sample: bool) -> dict[str, bool | float]:
    """An actor-critic's evaluation ``agent_info``: the policy's mode, or draws from it when ``sample``."""
    return {"stochastic": sample}


def actor_critic_explore(config: OnPolicyConfig) -> dict[str, bool | float]:
    """An actor-critic's training ``agent_info``: draws from the policy."""
    return {"stochastic": True}


def _recurrent(config: ActorCriticPart) -> bool:
    return isinstance(config, RecurrentPart) and config.recurrent


def actor_critic_model(config: ActorCriticPart, spec: EnvSpec) -> nn.Module:
    """The actor-critic of a run (on the CPU, its weights not yet seeded: the loop seeds them)."""
    if config.network is not None:
        return network_model(config.network, spec)
    if _recurrent(config):
        return recurrent_actor_critic(spec, config.hidden_sizes, normalize_observations=config.normalize_observations)
    return build_actor_critic(spec, config.hidden_sizes, normalize_observations=config.normalize_observations,
                              activation=config.activation, log_std_init=config.log_std_init,
                              ortho_init=config.ortho_init)


def actor_critic_learner_agent(model: nn.Module, device: torch.device, config: ActorCriticPart) -> RL_Agent:
    """The learner's agent over the actor-critic ``model``, to replay a collection."""
    return RecurrentPolicyAgent(model, device) if _recurrent(config) else PolicyAgent(model, device)


def check_actor_critic_env(title: str, config: RecurrentPart, spec: EnvSpec) -> None:
    """The envs an actor-critic of A2C's or PPO's takes (its ``check_env``, with ``title`` its name): raises
    :class:`~rlstruct.errors.SpaceError` for continuous actions with image observations or with ``recurrent``, and
    for ``normalize_observations`` of images; :class:`~rlstruct.errors.ConfigError` for a network option that the
    env's network does not have (:func:`~rlstruct.algos.networks.check_network_options`)."""
    if config.recurrent or spec.pixels:
        spec.require(f"recurrent {title}" if config.recurrent else f"{title} on images", config.env, discrete=True)
    check_actor_critic_network(config, spec, recurrent=config.recurrent, title=title)



def check_actor_critic_network(config: ActorCriticPart, spec: EnvSpec, *, recurrent: bool = False,
                               title: str = "the algorithm") -> None:
    """The settings of ``config`` that shape the actor-critic, against the network ``spec``'s env gets: raises
    :class:`~rlstruct.errors.SpaceError` for ``normalize_observations`` of images and
    :class:`~rlstruct.errors.ConfigError` for a network option that network lacks
    (:func:`~rlstruct.algos.networks.check_network_options`), and for a ``network`` factory (``--network``) whose
    model is no actor-critic, or given with ``recurrent`` or ``normalize_observations``, which only the built-in
    network has (``title``, the algorithm's, names it). Every algorithm of the family checks through here."""
    if config.network is not None:
        for name, value in (("recurrent", recurrent), ("normalize_observations", config.normalize_observations)):
            if value:  # given, or a preset's
                flag = "--no-" + name.replace("_", "-")
                raise ConfigError(f"{name}=True shapes {title}'s built-in actor-critic, got "
                                  f"network={config.network!r} as well; pass {flag} (or --preset none), or build it "
                                  "into your network")
        check_network(config.network, spec, ACTOR_CRITIC_CONTRACT, algo=title)
    check_normalizable(spec, config.normalize_observations)
    check_network_options(spec, activation=config.activation, log_std_init=config.log_std_init,
                          ortho_init=config.ortho_init, recurrent=recurrent)


def actor_critic_kwargs(config: ActorCriticPart) -> tuple[dict[str, object], dict[str, object]]:
    """The actor-critic agents' keyword arguments besides the config's: the training agent's own (its autocast, and
    ``compile`` with ``compile_policy``) and both batchers' (the network's observation normaliser)."""
    agent_kwargs = training_agent_kwargs(config)
    if config.compile_policy:
        agent_kwargs["compile"] = True
    return agent_kwargs, {"normalize_observations": True} if config.normalize_observations else {}


#: the actor-critic of A2C, PPO and REINFORCE (recurrent with ``recurrent``)
ACTOR_CRITIC = OnPolicyModel(agent=actor_critic_agent, evaluation_info=actor_critic_info,
                             explore=actor_critic_explore, build=actor_critic_model,
                             learner_agent=actor_critic_learner_agent, agent_kwargs=actor_critic_kwargs,
                             check_env=check_actor_critic_env)


