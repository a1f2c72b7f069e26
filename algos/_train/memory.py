"""The host memory that a run's collection needs, checked against what the machine has before anything is allocated:
``--n-envs`` too large for memory is one line naming the size and the memory available, rather than allocations
until the machine swaps (or a failure that names something else). Both families: an on-policy run's ``n_steps`` per
collection, an off-policy run's ``rollout_steps`` per acquisition and the transitions it pushes to its replay buffer
(whose own size :func:`~.replay_setup.check_replay_fits` checks)."""

from __future__ import annotations

import math

import numpy as np
import torch

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._replay_storage import available_memory
from rlstruct.algos._train.config import OffPolicyConfig, RolloutPart, RunConfig
from rlstruct.errors import ConfigError

__all__ = ["check_collection_fits", "collection_nbytes"]

_GB = 1e9
#: bytes per env step besides the observations and the action: reward, done flags, episode counters, the agent's
#: outputs (log-probability, value), at least
_PER_STEP_EXTRA = 32
#: copies of a collection the run holds at once at least: the batcher's buffer and the trajectories handed out; an
#: off-policy run also the transitions it pushes to its replay buffer
_COPIES, _OFF_POLICY_COPIES = 2, 3


def collection_nbytes(config: RunConfig, spec: EnvSpec) -> int:
    """A lower bound of the host bytes one collection of ``config``'s envs takes: per env and step (``n_steps`` of an
    on-policy collection, ``rollout_steps`` of an off-policy acquisition), the observation and the next one, the
    action and a few scalars, in the batcher's buffer and the trajectories it hands out (and, off-policy, the
    transitions pushed to the replay buffer).

    >>> from rlstruct.algos.a2c import A2CConfig
    >>> from rlstruct.algos.dqn import DQNConfig
    >>> cartpole = EnvSpec((4,), "float32", 2, 500)
    >>> collection_nbytes(A2CConfig(n_envs=16, n_steps=8), cartpole), collection_nbytes(DQNConfig(n_envs=16), cartpole)
    (18432, 55296)
    """
    if isinstance(config, OffPolicyConfig):
        steps, copies = config.rollout_steps, _OFF_POLICY_COPIES
    else:
        steps, copies = (config.n_steps if isinstance(config, RolloutPart) else 1), _COPIES
    observation = math.prod(spec.obs_shape) * np.dtype(spec.obs_dtype).itemsize
    action = max(math.prod(spec.action_shape), 1) * 8
    return copies * config.n_envs * steps * (2 * observation + action + _PER_STEP_EXTRA)


def check_collection_fits(config: RunConfig, spec: EnvSpec, *, available: int | None = None) -> None:
    """Raises when one collection needs more host memory than the machine has available (``MemAvailable``); a
    batcher on an accelerator (``batcher_device``) keeps its collection there, not checked here.

    Raises:
        ConfigError: it does (the message names the bytes needed, the bytes available and the largest ``n_envs``
            that fits).

    >>> from rlstruct.algos.a2c import A2CConfig
    >>> check_collection_fits(A2CConfig(n_envs=10**9, n_steps=8), EnvSpec((4,), "float32", 2, 500), available=8 * 10**9)
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: --n-envs 1000000000 needs at least 1152.0 GB of memory for one collection (1152 \
bytes per env), this machine has 8.0 GB available; pass a smaller --n-envs (at most 6944444 fits) or --n-steps
    """
    if torch.device(config.batcher_device).type != "cpu":
        return
    available = available_memory() if available is None else available
    if available is None:
        return
    needed = collection_nbytes(config, spec)
    if needed <= available:
        return
    per = needed / config.n_envs
    fewer = (" or --n-steps" if isinstance(config, RolloutPart) else " or --rollout-steps"
             if isinstance(config, OffPolicyConfig) else "")
    raise ConfigError(f"--n-envs {config.n_envs} needs at least {needed / _GB:.1f} GB of memory for one collection "
                      f"({per:.0f} bytes per env), this machine has {available / _GB:.1f} GB available; pass a smaller "
                      f"--n-envs (at most {int(available / per)} fits){fewer}")
