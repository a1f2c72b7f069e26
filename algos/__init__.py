"""Algorithms on top of the batchers: REINFORCE, A2C, PPO, DQN, SAC, PQN, TD3 and IMPALA, one module each, and the
``rlstruct`` command.

Each algorithm module holds its config, its loss as a function of tensors, its learn step (or learner) and
``ALGORITHM``, its description for the training loops and the command line; ``train(config)`` trains the algorithm
whose config it is, and ``validate(config)`` checks it (its preset applied) without training. What several
algorithms share sits in public modules named for what they hold:
:mod:`~rlstruct.algos.returns`, :mod:`~rlstruct.algos.distributions`, :mod:`~rlstruct.algos.encoders`,
:mod:`~rlstruct.algos.networks` (with their Adam), :mod:`~rlstruct.algos.policies`,
:mod:`~rlstruct.algos.losses` and :mod:`~rlstruct.algos.replay`; :class:`EnvSpec` is what the networks know of an env
(:func:`describe_env` reads it, :func:`create_env` is the batchers' env factory); ``load(run)`` reads a trained run
back as a :class:`Policy`; :mod:`~rlstruct.algos.statistics` compares runs over seeds. What
runs a training job (flags, loops, logs, evaluation, checkpoints, presets, sweeps, data-parallel ranks, the
``rlstruct`` command) is a private package beneath them, whose public face, :mod:`~rlstruct.algos.harness`, holds
what an algorithm is written against.

The names below load their module on first use, so that ``python -m rlstruct.algos.a2c`` does not find itself
already imported by this package.

>>> from rlstruct.algos import A2CConfig
>>> A2CConfig().env, A2CConfig().learner_device
('CartPole-v1', 'cpu')
"""

from typing import TYPE_CHECKING

# First: importing it checks that rlstruct is the installed package, not a clone named rlstruct in the current folder.
import rlstruct.batchers._shadow  # noqa: F401

# isort: split
from rlstruct._lazy import by_name, lazy_names
from rlstruct.algos._train.registry import exports

if TYPE_CHECKING:  # the lazy names below, for editors and type checkers
    from rlstruct.algos._env_spec import EnvSpec, create_env, describe_env  # noqa: F401
    from rlstruct.algos._train.config import OffPolicyConfig, OnPolicyConfig, RunConfig  # noqa: F401
    from rlstruct.algos._train.entry import train, validate  # noqa: F401
    from rlstruct.algos._train.policy import Policy, load  # noqa: F401
    from rlstruct.algos._train.presets import PRESETS, Preset  # noqa: F401
    from rlstruct.algos._train.profile import profile_training  # noqa: F401
    from rlstruct.algos._train.result import TrainResult  # noqa: F401
    from rlstruct.algos._train.sweep import run_sweep  # noqa: F401
    from rlstruct.algos.a2c import A2CConfig, a2c_loss  # noqa: F401
    from rlstruct.algos.dqn import DQNConfig, double_dqn_targets, dqn_loss  # noqa: F401
    from rlstruct.algos.impala import IMPALAConfig  # noqa: F401
    from rlstruct.algos.ppo import PPOConfig, ppo_loss  # noqa: F401
    from rlstruct.algos.pqn import PQNConfig, pqn_loss, q_lambda_targets  # noqa: F401
    from rlstruct.algos.reinforce import ReinforceConfig, reinforce_loss  # noqa: F401
    from rlstruct.algos.returns import discounted_returns, gae_advantages, n_step_returns  # noqa: F401
    from rlstruct.algos.sac import SACConfig, sac_actor_loss, sac_critic_loss, sac_temperature_loss  # noqa: F401
    from rlstruct.algos.td3 import TD3Config, td3_actor_loss, td3_critic_loss, td3_targets  # noqa: F401

_LAZY = {
    **by_name({
        "rlstruct.algos._train.entry": ("train", "validate"),
        "rlstruct.algos._train.policy": ("load", "Policy"),
        "rlstruct.algos._train.config": ("RunConfig", "OnPolicyConfig", "OffPolicyConfig"),
        "rlstruct.algos._train.result": ("TrainResult",),
        "rlstruct.algos._env_spec": ("EnvSpec", "describe_env", "create_env"),
        "rlstruct.algos._train.profile": ("profile_training",),
        "rlstruct.algos._train.sweep": ("run_sweep",),
        "rlstruct.algos._train.presets": ("PRESETS", "Preset"),
        "rlstruct.algos.returns": ("discounted_returns", "gae_advantages", "n_step_returns"),
    }),
    **exports(),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
