"""The evaluation agent of a saved run: which agent an algorithm's checkpoint evaluates with, and its arguments.

``rlstruct eval`` and the videos (:mod:`rlstruct.algos.video`) rebuild the policy of a checkpoint from its
``algo``, ``config`` and ``env_spec``; this module is the one map from those to the agent, so that both build it the
same way (DQN's Q-network with or without the dueling head, PQN's with its LayerNorm, SAC's squashed Gaussian, a
recurrent policy, the actor-critics' policy, and the observation normaliser whose statistics the checkpoint holds).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlstruct.algos.config import check_evaluation_policy
from rlstruct.algos.env_spec import EnvSpec
from rlstruct.algos.evaluation import evaluation_info
from rlstruct.algos.networks import create_policy_agent
from rlstruct.structures import DictTensor

__all__ = ["ALGORITHMS", "evaluation_agent"]

#: the algorithms whose checkpoints rlstruct evaluates
ALGORITHMS = ("reinforce", "a2c", "dqn", "ppo", "sac", "pqn")


def evaluation_agent(algo: str, config: Mapping[str, Any], spec: EnvSpec, device: str = "cpu", *,
                     policy: str | None = None) -> tuple[Callable[..., Any], dict[str, Any], DictTensor]:
    """The agent factory of ``algo`` as its checkpoint's ``config`` built it, its keyword arguments for an env of
    ``spec`` on ``device``, and its evaluation ``agent_info`` (one row; :func:`evaluation_info`: greedy unless the
    run evaluated with ``evaluation_policy="sample"``, or ``policy`` when given).

    Raises:
        ValueError: ``algo`` is not one of :data:`ALGORITHMS`, or ``policy`` is not greedy or sample.

    >>> spec = EnvSpec((4,), "float32", 2, 500)
    >>> create, kwargs, info = evaluation_agent("ppo", {"hidden_sizes": [8]}, spec)
    >>> create.__name__, kwargs["hidden_sizes"], list(info.keys())
    ('create_policy_agent', (8,), ['stochastic'])
    """
    if config.get("recurrent"):
        from rlstruct.algos.recurrent import create_recurrent_agent

        create: Callable[..., Any] = create_recurrent_agent
    elif algo == "dqn":
        from rlstruct.algos.dqn import create_q_agent

        create = functools.partial(create_q_agent, dueling=bool(config.get("dueling", False)))
    elif algo == "pqn":
        from rlstruct.algos.dqn import create_q_agent
        create = functools.partial(create_q_agent, layer_norm=bool(config["layer_norm"]),
                                   activation=str(config["activation"]))
    elif algo == "sac":
        from rlstruct.algos.sac import create_sac_agent

        create = create_sac_agent
    elif algo in ("reinforce", "a2c", "ppo"):
        create = create_policy_agent
    else:
        raise ValueError(f"unknown algorithm {algo!r} in the checkpoint; expected one of {list(ALGORITHMS)}")
    kwargs: dict[str, Any] = {"spec": spec, "hidden_sizes": tuple(config["hidden_sizes"]), "device": device}
    if config.get("normalize_observations"):  # the network has the normalizer whose statistics the checkpoint holds
        kwargs["normalize_observations"] = True
    if policy is not None:
        config = {**config, "evaluation_policy": check_evaluation_policy(policy, argument="policy")}
    info = DictTensor({key: torch.tensor([value]) for key, value in evaluation_info(algo, config).items()})
    return create, kwargs, info
