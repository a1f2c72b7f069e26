"""Algorithms on top of the batchers: REINFORCE, A2C, DQN, PPO, SAC and PQN, one file each, and the ``rlstruct``
command.

What several algorithms share sits in modules named for what they hold: :mod:`rlstruct.algos.returns`
(discounted returns, GAE, episode statistics), :mod:`rlstruct.algos.networks` (the MLP, the actor-critic
and its policy agent), :mod:`rlstruct.algos.encoders` (the CNN for images, the MLP for flat frames),
:mod:`rlstruct.algos.recurrent` (the LSTM actor-critic, its agent and the replay of a window),
:mod:`rlstruct.algos.normalization` (running observation and reward normalisation of the actor-critic family),
:mod:`rlstruct.algos.update` (the learner's update step and the fast path's settings),
:mod:`rlstruct.algos.optim` (the learners' Adam: ``torch.optim.Adam``'s update and state dict without the
``torch._dynamo`` import of ``torch.optim``'s base class),
:mod:`rlstruct.algos.replay` (the replay buffer of DQN and SAC), :mod:`rlstruct.algos.transitions` (the one-step
and n-step transitions it is filled with), :mod:`rlstruct.algos.evaluation`
and :mod:`rlstruct.algos.checkpoints`.

A run is built from: :mod:`rlstruct.algos.config` (the settings every algorithm shares),
:mod:`rlstruct.algos.env_spec` (what the networks need to know about an env), :mod:`rlstruct.algos.setup` (an
algorithm's description and the one check of a run before anything is built), :mod:`rlstruct.algos.record`
(the run's clock, budget and logs), :mod:`rlstruct.algos.run` (its batchers, signals and end), and the two loops,
:mod:`rlstruct.algos.on_policy` (A2C, PPO, REINFORCE, PQN) and :mod:`rlstruct.algos.off_policy` (DQN, SAC).
:mod:`rlstruct.algos.command` builds ``rlstruct train ALGO``'s grouped flags from the config dataclasses;
:mod:`rlstruct.algos.cli` is the ``rlstruct`` command and :mod:`rlstruct.algos.profile` shows where the time
of a collect + learn loop goes.

Each of :mod:`rlstruct.algos.reinforce`, :mod:`rlstruct.algos.a2c`, :mod:`rlstruct.algos.dqn`,
:mod:`rlstruct.algos.ppo`, :mod:`rlstruct.algos.sac` and :mod:`rlstruct.algos.pqn` has the same anatomy: a config
dataclass, the loss as a function of tensors, its learn step (on-policy) or learner (off-policy), ``ALGORITHM`` (what
the loop and the command line need), ``train(config) -> TrainResult`` and ``main(argv)`` (``rlstruct train <algo>``
or ``python -m rlstruct.algos.<algo>``).

The algorithm modules are imported on first use, so that ``python -m rlstruct.algos.a2c`` does not find
itself already imported by this package.

>>> from rlstruct.algos import A2CConfig
>>> A2CConfig().env, A2CConfig().learner_device
('CartPole-v1', 'cpu')
"""

import importlib
from typing import Any

from rlstruct.algos.config import RunConfig
from rlstruct.algos.record import TrainResult
from rlstruct.algos.returns import discounted_returns, gae_advantages

__all__ = [
    "reinforce",
    "a2c",
    "dqn",
    "ppo",
    "sac",
    "pqn",
    "RunConfig",
    "TrainResult",
    "ReinforceConfig",
    "A2CConfig",
    "DQNConfig",
    "PPOConfig",
    "SACConfig",
    "PQNConfig",
    "discounted_returns",
    "gae_advantages",
    "n_step_returns",
    "double_dqn_targets",
    "profile_training",
]

_LAZY = {
    "reinforce": ("rlstruct.algos.reinforce", None),
    "a2c": ("rlstruct.algos.a2c", None),
    "dqn": ("rlstruct.algos.dqn", None),
    "ppo": ("rlstruct.algos.ppo", None),
    "sac": ("rlstruct.algos.sac", None),
    "pqn": ("rlstruct.algos.pqn", None),
    "ReinforceConfig": ("rlstruct.algos.reinforce", "ReinforceConfig"),
    "A2CConfig": ("rlstruct.algos.a2c", "A2CConfig"),
    "DQNConfig": ("rlstruct.algos.dqn", "DQNConfig"),
    "PPOConfig": ("rlstruct.algos.ppo", "PPOConfig"),
    "SACConfig": ("rlstruct.algos.sac", "SACConfig"),
    "PQNConfig": ("rlstruct.algos.pqn", "PQNConfig"),
    "n_step_returns": ("rlstruct.algos.transitions", "n_step_returns"),
    "double_dqn_targets": ("rlstruct.algos.dqn", "double_dqn_targets"),
    "profile_training": ("rlstruct.algos.profile", "profile_training"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rlstruct.algos' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attribute is None else getattr(module, attribute)
