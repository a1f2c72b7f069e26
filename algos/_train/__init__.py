"""What runs a training job, beneath the algorithm modules, and the names those modules use from it.

The algorithm modules and the other public modules of :mod:`rlstruct.algos` import the harness through this
package only (``from rlstruct.algos._train import OnPolicyAlgorithm``); the modules beneath it (flags, loops,
session, logs, evaluation, videos, checkpoints, presets, sweeps, data-parallel ranks, the ``rlstruct`` command and
the saved run's :class:`~rlstruct.algos.Policy`, which :mod:`rlstruct.algos` exports) import each other directly. Each
name loads its module on first use, so that ``import rlstruct.algos`` loads of the harness only the registry (and
the settings it checks).

An algorithm's config (which extends :class:`~rlstruct.algos.OnPolicyConfig` or
:class:`~rlstruct.algos.OffPolicyConfig`, public names of :mod:`rlstruct.algos`):
    ``RolloutPart``, ``MinibatchPart``, ``ActorCriticPart``, ``RecurrentPart``,
    ``AdvantagePart``: the settings of the parts of the on-policy loop an algorithm uses (fixed-length rollouts,
    epochs of minibatches over them, an actor-critic policy, a recurrent one, GAE advantages and the loss's weights),
    which its config adds; ``AutocastPart``: the forwards under ``torch.autocast`` (every on-policy config has it;
    DQN's adds it), and ``autocast_dtype``: the dtype it names; ``setting``: a field with its ``--help``;
    ``default``: a new default for an inherited field, keeping its help (a setting declares the values it takes
    beside its help, checked before a run starts).

What an algorithm is, and what trains it:
    ``OnPolicyAlgorithm``, ``OffPolicyAlgorithm``: the description (``ALGORITHM``, plain data) an algorithm module
    gives its family's loop; ``OnPolicyModel``: how an on-policy algorithm gets its model and its agents, and the
    envs it takes; ``ACTOR_CRITIC``: that of the actor-critics; ``check_actor_critic_network``: the check of an
    actor-critic's network settings against an env, for an algorithm that gives its own ``check_env``;
    ``ActorCriticLearner``: the parts an on-policy learn step is built from; ``LearnFn``: the type of that learn
    step; ``trainer``: the module's ``train(config)`` of a description; ``main``: ``rlstruct train NAME`` of the
    algorithm the registry names ``NAME``.

The learn step:
    ``Batch``: the named tensors a loss reads; ``reads``: a loss's declaration of the keys it reads;
    ``minibatch_epochs``: epochs of shuffled minibatches, one update each; ``training_agent_kwargs``: the
    arguments of the agents that collect for training.

An off-policy learner's state:
    ``seeded_model``: a network whose weights come from the run's seed; ``Resume``: the checkpoint a run continues;
    ``load_state``, ``restore_optimizer``: a network's and an optimiser's state from it.

Data-parallel ranks:
    ``mean_over_ranks``: a statistic averaged over the run's ranks.
"""

from rlstruct._lazy import by_name, lazy_names

_LAZY = by_name({
    "rlstruct.algos._train.config": ("RolloutPart", "MinibatchPart", "ActorCriticPart", "RecurrentPart",
                                     "AdvantagePart", "AutocastPart", "setting", "default"),
    "rlstruct.algos._train.registry": ("OnPolicyAlgorithm", "OffPolicyAlgorithm", "OnPolicyModel"),
    "rlstruct.algos._train.actor_critic": ("ACTOR_CRITIC", "check_actor_critic_network"),
    "rlstruct.algos._train.loops": ("ActorCriticLearner", "LearnFn", "trainer"),
    "rlstruct.algos._train.train_command": ("main",),
    "rlstruct.algos._train.update": ("Batch", "reads", "minibatch_epochs", "training_agent_kwargs",
                                     "autocast_dtype"),
    "rlstruct.algos._train.session": ("seeded_model",),
    "rlstruct.algos._train.checkpoints": ("Resume", "load_state", "restore_optimizer"),
    "rlstruct.algos._train.distributed": ("mean_over_ranks",),
})

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, globals())
