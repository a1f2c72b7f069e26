"""What runs a training job, beneath the algorithm modules, and the names those modules use from it.

The algorithm modules and the other public modules of :mod:`rlstruct.algos` import the harness through this
package only (``from rlstruct.algos._train import OnPolicyAlgorithm``); the modules beneath it (flags, loops,
session, logs, evaluation, videos, checkpoints, presets, sweeps, data-parallel ranks, the ``rlstruct`` command and
the saved run's :class:`~rlstruct.algos.Policy`, which :mod:`rlstruct.algos` exports) import each other directly. Each
name loads its module on first use, so that ``import rlstruct.algos`` loads none of the harness.

An algorithm's config:
    ``RunConfig``, ``OnPolicyConfig``, ``OffPolicyConfig``: the settings every run, every on-policy run and every
    off-policy run takes, which an algorithm's config extends; ``setting``: a field with its ``--help``;
    ``check_at_least``: the check that a few integer fields are at least a bound.

What an algorithm is:
    ``OnPolicyAlgorithm``, ``OffPolicyAlgorithm``: the description (``ALGORITHM``) an algorithm module gives its
    family's loop; ``ActorCriticLearner``: the parts an on-policy learn step is built from; ``LearnFn``: the type of
    that learn step; ``algorithm``: the description of an algorithm by its name, from the registry.

The learn step:
    ``UpdateStep``: one optimiser step over a loss (clipping, mixed precision, a captured graph);
    ``autocast_dtype``, ``clip_groups``: its precision and its gradient-clipping groups;
    ``shuffled_minibatches``: the minibatches of an epoch.

An off-policy learner's state:
    ``seeded_model``: a network whose weights come from the run's seed; ``Resume``: the checkpoint a run continues;
    ``load_state``, ``restore_optimizer``: a network's and an optimiser's state from it.

Data-parallel ranks:
    ``World``: this process's rank among the run's; ``mean_over_ranks``: a statistic averaged over them.
"""

from rlstruct._lazy import lazy_names

_LAZY = {
    "RunConfig": "rlstruct.algos._train.config",
    "OnPolicyConfig": "rlstruct.algos._train.config",
    "OffPolicyConfig": "rlstruct.algos._train.config",
    "setting": "rlstruct.algos._train.config",
    "check_at_least": "rlstruct.algos._train.config",
    "OnPolicyAlgorithm": "rlstruct.algos._train.loops",
    "OffPolicyAlgorithm": "rlstruct.algos._train.loops",
    "ActorCriticLearner": "rlstruct.algos._train.loops",
    "LearnFn": "rlstruct.algos._train.loops",
    "algorithm": "rlstruct.algos._train.registry",
    "UpdateStep": "rlstruct.algos._train.update",
    "autocast_dtype": "rlstruct.algos._train.update",
    "clip_groups": "rlstruct.algos._train.update",
    "shuffled_minibatches": "rlstruct.algos._train.update",
    "seeded_model": "rlstruct.algos._train.session",
    "Resume": "rlstruct.algos._train.checkpoints",
    "load_state": "rlstruct.algos._train.checkpoints",
    "restore_optimizer": "rlstruct.algos._train.checkpoints",
    "World": "rlstruct.algos._train.distributed",
    "mean_over_ranks": "rlstruct.algos._train.distributed",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
