"""The list of algorithms. Each name is a module, ``rlstruct.algos.NAME``, whose ``ALGORITHM`` describes it; the
command line's choices, ``rlstruct.algos``'s names, and the evaluation agent of a saved run all come from here.

Adding an algorithm is its module and one line in :data:`ALGORITHMS`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ALGORITHMS", "algorithm", "exports", "train"]

#: each algorithm's name (``rlstruct train NAME``, the module ``rlstruct.algos.NAME``) and the names its module gives
#: ``rlstruct.algos``
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "reinforce": ("ReinforceConfig", "reinforce_loss"),
    "a2c": ("A2CConfig", "a2c_loss"),
    "dqn": ("DQNConfig", "dqn_loss", "double_dqn_targets"),
    "ppo": ("PPOConfig", "ppo_loss"),
    "sac": ("SACConfig", "sac_actor_loss", "sac_critic_loss", "sac_temperature_loss"),
    "pqn": ("PQNConfig", "pqn_loss", "q_lambda_targets"),
}


def algorithm(name: str) -> Any:
    """The description (``ALGORITHM``, a :class:`~.session.Algorithm`) of the algorithm ``name``, its module
    imported on first use.

    Raises:
        ValueError: ``name`` is not one of :data:`ALGORITHMS`.

    >>> algorithm("ppo").title
    'PPO'
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {list(ALGORITHMS)}")
    return importlib.import_module(f"rlstruct.algos.{name}").ALGORITHM


def exports() -> dict[str, str]:
    """``{name: module}`` of the names the algorithm modules give ``rlstruct.algos``.

    >>> exports()["PPOConfig"]
    'rlstruct.algos.ppo'
    """
    return {export: f"rlstruct.algos.{name}" for name, names in ALGORITHMS.items() for export in names}


def train(config: Any) -> Any:
    """Trains the algorithm whose config ``config`` is (e.g. a ``PPOConfig``): its ``ALGORITHM.train(config)``.

    Raises:
        TypeError: ``config`` is no algorithm's config.
    """
    for name in ALGORITHMS:
        description = algorithm(name)
        if isinstance(config, description.config_cls):
            return description.train(config)
    raise TypeError(f"config must be an algorithm's config ({', '.join(exports())}), got {type(config).__name__}; "
                    "build one, e.g. PPOConfig(env='CartPole-v1')")
