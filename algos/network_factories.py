"""Networks from outside the package: ``--network MODULE:CALLABLE`` names a factory that is called with the env's
:class:`~rlstruct.algos.EnvSpec` and returns the model an algorithm's family learns, in place of the built-in one.

A run records the factory's name in its config (``config.json`` and the checkpoint), so that ``rlstruct eval``,
``rlstruct export``, ``rlstruct.algos.load`` and ``--resume`` rebuild the same network in any process where the
module imports. Each family states what it needs (a :class:`NetworkContract`), and the run checks the factory's model
against it at setup, with one forward pass on two zero observations, before any worker starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rlstruct._sources import resolve_source
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.errors import ConfigError

# The contracts are the families' (their checks import them by name); a user's own algorithm calls these two.
__all__ = ["check_network", "network_model"]


def network_model(source: str, spec: EnvSpec) -> Any:
    """``factory(spec)`` of the factory ``source`` names (``"MODULE:CALLABLE"``): the model, on the CPU.

    Raises:
        ConfigError: ``source`` does not resolve (its module is not importable here: the message names it).
    """
    return resolve_source(source, argument="network")(spec)


def _zeros(spec: EnvSpec, n: int = 2) -> torch.Tensor:
    return torch.zeros((n, *spec.obs_shape), dtype=getattr(torch, spec.obs_dtype))


def _shape(x: Any) -> str:
    return f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"


def _wanted(x: Any, shape: tuple[int, ...]) -> bool:
    return isinstance(x, torch.Tensor) and tuple(x.shape) == shape


def _actor_critic_problem(model: Any, spec: EnvSpec) -> str | None:
    if not isinstance(model, nn.Module):
        return f"a {type(model).__name__}, not a torch.nn.Module"
    missing = [a for a in ("policy", "value", "policy_value", "continuous", "policy_dim") if not hasattr(model, a)]
    if missing:
        return f"a {type(model).__name__} without {', '.join(missing)}"
    if bool(model.continuous) == spec.discrete:
        return f"continuous={model.continuous} for an env with {'discrete' if spec.discrete else 'continuous'} actions"
    dim = spec.n_actions if spec.discrete else spec.action_dim
    if model.policy_dim != dim:
        return f"policy_dim={model.policy_dim}, where the env's actions need {dim}"
    frame = _zeros(spec)
    with torch.no_grad():
        dist, value = model.policy(frame), model.value(frame)
    if not all(hasattr(dist, m) for m in ("sample_from", "mode", "log_prob", "entropy")):
        return f"policy() giving a {type(dist).__name__}, not a Categorical or DiagGaussian"
    mode = (2,) if spec.discrete else (2, spec.action_dim)
    if not _wanted(dist.mode(), mode):
        return f"policy(frame [2, ...]).mode() of {_shape(dist.mode())}, not {list(mode)}"
    if not _wanted(value, (2,)):
        return f"value(frame [2, ...]) of {_shape(value)}, not [2]"
    return None


def _q_problem(model: Any, spec: EnvSpec) -> str | None:
    if not isinstance(model, nn.Module):
        return f"a {type(model).__name__}, not a torch.nn.Module"
    with torch.no_grad():
        q = model(_zeros(spec))
    if not _wanted(q, (2, spec.n_actions)):
        return f"Q-values of {_shape(q)} for frames [2, ...], not [2, {spec.n_actions}]"
    return None


def _pair_problem(models: Any) -> str | None:
    if not (isinstance(models, tuple) and len(models) == 2 and all(isinstance(m, nn.Module) for m in models)):
        return f"a {type(models).__name__}, not a pair of torch.nn.Modules"
    return None


def _critic_problem(critic: nn.Module, frame: torch.Tensor, action: torch.Tensor) -> str | None:
    q = critic(frame, action)
    if not (isinstance(q, torch.Tensor) and q.dim() == 2 and q.shape[1] == 2):
        return f"a critic giving {_shape(q)} for 2 observations and actions, not [n_critics, 2]"
    return None


def _sac_problem(models: Any, spec: EnvSpec) -> str | None:
    if (problem := _pair_problem(models)) is not None:
        return problem
    actor, critic = models
    missing = [a for a in ("squash", "sample", "deterministic", "scale", "bias") if not hasattr(actor, a)]
    if missing:
        return f"an actor ({type(actor).__name__}) without {', '.join(missing)}"
    frame, d = _zeros(spec), spec.action_dim
    with torch.no_grad():
        out = actor(frame)
        if not (isinstance(out, tuple) and len(out) == 2 and all(_wanted(x, (2, d)) for x in out)):
            return f"an actor whose forward gives {type(out).__name__}, not (mean, log_std) each [2, {d}]"
        action, log_prob = actor.sample(frame, torch.zeros(2, d))
        if not (_wanted(action, (2, d)) and _wanted(log_prob, (2,))):
            return f"an actor whose sample() gives {_shape(action)} and {_shape(log_prob)}, not [2, {d}] and [2]"
        return _critic_problem(critic, frame, action)


def _td3_problem(models: Any, spec: EnvSpec) -> str | None:
    if (problem := _pair_problem(models)) is not None:
        return problem
    actor, critic = models
    missing = [a for a in ("clip", "scale", "bias") if not hasattr(actor, a)]
    if missing:
        return f"an actor ({type(actor).__name__}) without {', '.join(missing)}"
    frame, d = _zeros(spec), spec.action_dim
    with torch.no_grad():
        action = actor(frame)
        if not _wanted(action, (2, d)):
            return f"an actor whose forward gives {_shape(action)}, not actions [2, {d}]"
        return _critic_problem(critic, frame, action)


@dataclasses.dataclass(frozen=True)
class NetworkContract:
    """What a family's network must be, as ``--network``'s factory must return it.

    Attributes:
        needs: the model, in words, for the error (e.g. ``"an actor-critic module"``).
        problem: ``(model, spec) -> what is wrong, or None``: a forward pass on two zero observations.
    """

    needs: str
    problem: Callable[[Any, EnvSpec], str | None]


#: REINFORCE, A2C, PPO: an actor-critic like :class:`~rlstruct.algos.networks.ActorCritic`
ACTOR_CRITIC_CONTRACT = NetworkContract(
    "an actor-critic torch.nn.Module like rlstruct.algos.networks.ActorCritic (policy(frame) -> Categorical or "
    "DiagGaussian, value(frame) -> [N], policy_value(frame), continuous, policy_dim)", _actor_critic_problem)
#: DQN, PQN: a Q-network ``frame [N, ...] -> Q-values [N, n_actions]``
Q_CONTRACT = NetworkContract("a Q-network torch.nn.Module (frame [N, ...] -> Q-values [N, n_actions])", _q_problem)
#: SAC: ``(actor, critic)`` like ``(SquashedGaussianActor, TwinQNetwork)``
SAC_CONTRACT = NetworkContract(
    "a pair (actor, critic) like rlstruct.algos.sac's (SquashedGaussianActor, TwinQNetwork): the actor's forward "
    "(mean, log_std) [N, D], squash, sample, deterministic, scale, bias; the critic (frame, action) -> [n_critics, N]",
    _sac_problem)
#: TD3: ``(actor, critic)`` like ``(DeterministicActor, TwinQNetwork)``
TD3_CONTRACT = NetworkContract(
    "a pair (actor, critic) like rlstruct.algos.td3's (DeterministicActor, TwinQNetwork): the actor's forward "
    "actions [N, D] within the bounds, clip, scale, bias; the critic (frame, action) -> [n_critics, N]", _td3_problem)


def check_network(source: str, spec: EnvSpec, contract: NetworkContract, *, algo: str) -> None:
    """Builds the model of the factory ``source`` names for ``spec``'s env and checks it against ``contract``
    (``algo`` the algorithm's title, for the message).

    Raises:
        ConfigError: the factory does not resolve, raises, or returns another model than ``contract`` needs; one
            line naming what the family needs.
    """
    try:
        model = network_model(source, spec)
        problem = contract.problem(model, spec)
    except ConfigError:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        problem = f"an error: {type(e).__name__}: {first}"
    if problem is not None:
        raise ConfigError(f"network={source!r} must return {contract.needs} for {algo}, got {problem}; fix the "
                          "factory, which is called with the env's EnvSpec")
