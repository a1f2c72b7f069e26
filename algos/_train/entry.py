"""What :mod:`rlstruct.algos` offers for a config alone: :func:`train` and :func:`validate` of the algorithm whose
config it is, which the registry finds by the config's class: a built-in algorithm's, or the description that the
module defining the config's class holds (an algorithm from outside the package)."""

from __future__ import annotations

import sys
from typing import Any

from rlstruct.algos._train import loops, session
from rlstruct.algos._train.registry import ALGORITHMS, Algorithm, algorithm, exports
from rlstruct.algos._train.result import TrainResult

__all__ = ["train", "validate"]


def _description(config: Any) -> Algorithm:
    for name in ALGORITHMS:
        description = algorithm(name)
        if isinstance(config, description.config_cls):
            return description
    module = sys.modules.get(type(config).__module__)
    found = [v for v in vars(module).values() if isinstance(v, Algorithm) and v.config_cls is type(config)] if (
        module is not None) else []
    if len(found) == 1:
        return found[0]
    raise TypeError(f"config must be an algorithm's config ({', '.join(exports())}), got {type(config).__name__}; "
                    "build one, e.g. PPOConfig(env='CartPole-v1')")


def train(config: Any) -> TrainResult:
    """Trains the algorithm whose config ``config`` is (e.g. a ``PPOConfig``), as its module's ``train(config)``
    does.

    Raises:
        TypeError: ``config`` is no algorithm's config.
        ValueError: what :func:`validate` raises.
    """
    return loops.train(_description(config), config)


def validate(config: Any, **kwargs: Any) -> session.Setup:
    """Applies the preset of ``config`` and checks the result for the algorithm whose config it is, before anything
    is built; returns the checked :class:`~rlstruct.algos._train.session.Setup` (its ``config`` holds every setting
    resolved). The keyword arguments are :func:`~rlstruct.algos._train.session.validate`'s (``given``: the fields
    a preset leaves alone). The setup holds its log folder's lock (``setup.lock``, if one was taken) until its run ends;
    release it (``setup.lock.release()``) when you check without training.

    Raises:
        TypeError: ``config`` is no algorithm's config.
        ValueError: a setting out of range, or one of its subclasses (``DeviceUnavailableError``, ``SpaceError``,
            ``ConfigError``, ``CheckpointError``) for a device, the env or ``resume``.

    >>> import tempfile
    >>> from rlstruct.algos import PPOConfig
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     setup = validate(PPOConfig(env="Pendulum-v1", lr=1e-3, logdir=f"{folder}/run"))
    >>> setup.config.preset, setup.config.lr
    ('ppo-pendulum', 0.001)
    """
    return session.validate(_description(config), config, **kwargs)
