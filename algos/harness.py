"""What an algorithm is written against: the public face of the run harness.

Each built-in algorithm module (:mod:`~rlstruct.algos.reinforce`, :mod:`~rlstruct.algos.a2c`,
:mod:`~rlstruct.algos.ppo`, :mod:`~rlstruct.algos.dqn`, :mod:`~rlstruct.algos.sac`, :mod:`~rlstruct.algos.pqn`,
:mod:`~rlstruct.algos.td3`) imports from here and from the public building blocks (returns, losses, networks, policies,
replay, encoders), and an algorithm in a researcher's own package does the same: its description (``ALGORITHM``) then
gets what the built-in ones get (presets, checkpoints, resume, the stopping rule, ``rlstruct eval``, ``load(RUN)``,
``export``, ``compare``, ``sweep``, trackers, videos) through ``rlstruct train MODULE:ATTRIBUTE`` or the
``rlstruct.algorithms`` entry-point group (see the "Extending rlstruct" page).

The config, typed by family:
    :class:`RunConfig` (every run's settings), :class:`OnPolicyConfig`, :class:`OffPolicyConfig`, and the parts an
    on-policy config adds for the pieces of the loop it uses: :class:`RolloutPart` (fixed-length rollouts),
    :class:`MinibatchPart` (epochs of minibatches), :class:`ActorCriticPart`, :class:`RecurrentPart`,
    :class:`AdvantagePart` (GAE and the loss's weights), and the fast path's parts, which an off-policy config may
    take too: :class:`AutocastPart`, :class:`FastPathPart` (the compiled update, the shared weights) and
    :class:`CapturedPart` (the captured acquisition); :func:`setting` declares a field with its ``--help``,
    :func:`default` gives an inherited field a new default.

The description, plain data that runs nothing but names its family's loop (:class:`TrainingLoop`):
    :class:`Algorithm`, :class:`OnPolicyAlgorithm` (with the :class:`OnPolicyModel` it learns, e.g.
    :data:`ACTOR_CRITIC`), :class:`OffPolicyAlgorithm` (with its :class:`OffPolicyLearner`); :class:`EnvSpec` is what
    a model and a check know of the env; :func:`check_actor_critic_network` checks an actor-critic's network
    settings against it.

What trains a description:
    :func:`trainer` (the module's ``train(config)``), :func:`main` (the module's ``rlstruct train``), and
    :func:`algorithm`, which finds a description by name, ``MODULE:ATTRIBUTE`` or entry point.

The learn step:
    :class:`ActorCriticLearner` (its parts), :data:`LearnFn` (its type), :data:`Batch` and :func:`reads` (the
    tensors a loss reads), :class:`UpdateStep` (one update, compiled with ``compile_update``), :func:`minibatch_epochs`,
    :func:`training_agent_kwargs`, :func:`autocast_dtype`, :func:`mean_over_ranks` (a statistic averaged over
    data-parallel ranks).

A learner's state:
    :class:`LearnerState` (what a learner owns, by name: the harness saves it and restores it on ``--resume``),
    :func:`seeded_model`, :class:`Resume` (the checkpoint a run continues), :func:`load_state`,
    :func:`restore_optimizer`.

A new family's loop, written with the pieces both built-in loops are made of:
    :class:`Setup` (a run's checked settings, the loop's argument), :func:`open_run` (the run's frame),
    :func:`open_batchers` (the training batcher and the evaluator) or :func:`open_evaluator` (the evaluator alone),
    :func:`record_iteration` (the end of every iteration: its row, the evaluation's and the checkpoint's turns),
    :class:`TrainingEpisodes` (the training episodes' mean return and length of each collection),
    :func:`finish_training` and :func:`finish_diverged` (the two ends of a run), :func:`until_a_worker_fails`
    (a batcher worker that fails with no restart left stops the run as a signal does).

>>> from rlstruct.algos.harness import OnPolicyConfig, algorithm
>>> issubclass(algorithm("ppo").config_cls, OnPolicyConfig)
True
"""

from __future__ import annotations

import rlstruct.algos._train.population_loop  # noqa: F401  (registers the families' population loops)
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.actor_critic import ACTOR_CRITIC, check_actor_critic_network
from rlstruct.algos._train.checkpoints import Resume, load_state, restore_optimizer
from rlstruct.algos._train.config import (
    ActorCriticPart,
    AdvantagePart,
    AutocastPart,
    CapturedPart,
    FastPathPart,
    MinibatchPart,
    OffPolicyConfig,
    OnPolicyConfig,
    RecurrentPart,
    RolloutPart,
    RunConfig,
    default,
    setting,
)
from rlstruct.algos._train.distributed import mean_over_ranks
from rlstruct.algos._train.family import (
    TrainingEpisodes,
    TrainingLoop,
    open_run,
    record_iteration,
    until_a_worker_fails,
)
from rlstruct.algos._train.finish import finish_diverged, finish_training
from rlstruct.algos._train.learner_state import LearnerState
from rlstruct.algos._train.loops import ActorCriticLearner, LearnFn, OffPolicyLearner, UniformStartLearner, trainer
from rlstruct.algos._train.registry import Algorithm, OffPolicyAlgorithm, OnPolicyAlgorithm, OnPolicyModel, algorithm
from rlstruct.algos._train.session import Setup, open_batchers, open_evaluator, seeded_model
from rlstruct.algos._train.train_command import main
from rlstruct.algos._train.update import (
    Batch,
    UpdateStep,
    autocast_dtype,
    minibatch_epochs,
    reads,
    training_agent_kwargs,
)

__all__ = [
    "ACTOR_CRITIC",
    "ActorCriticLearner",
    "ActorCriticPart",
    "AdvantagePart",
    "Algorithm",
    "AutocastPart",
    "Batch",
    "CapturedPart",
    "EnvSpec",
    "FastPathPart",
    "LearnFn",
    "LearnerState",
    "MinibatchPart",
    "OffPolicyAlgorithm",
    "OffPolicyConfig",
    "OffPolicyLearner",
    "OnPolicyAlgorithm",
    "OnPolicyConfig",
    "OnPolicyModel",
    "RecurrentPart",
    "Resume",
    "RolloutPart",
    "RunConfig",
    "Setup",
    "TrainingEpisodes",
    "TrainingLoop",
    "UniformStartLearner",
    "UpdateStep",
    "algorithm",
    "autocast_dtype",
    "check_actor_critic_network",
    "default",
    "finish_diverged",
    "finish_training",
    "load_state",
    "main",
    "mean_over_ranks",
    "minibatch_epochs",
    "open_batchers",
    "open_evaluator",
    "open_run",
    "reads",
    "record_iteration",
    "until_a_worker_fails",
    "restore_optimizer",
    "seeded_model",
    "setting",
    "trainer",
    "training_agent_kwargs",
]
