"""The learner's update: one step (loss, backward, clipping, optimizer step), compiled or not, and what the loops
build around it from the run's settings (the on-policy learner's state, the collection pipeline of both families).

:class:`UpdateStep` runs one update (loss, backward, gradient clipping, optimizer step) with the forward and the
loss compiled by ``torch.compile`` (``mode="reduce-overhead"``, i.e. CUDA graphs, on CUDA; the default mode on
the CPU); the backward runs through the compiled graph (AOTAutograd) and the optimizer is the fused Adam of
:func:`~rlstruct.algos.networks.make_adam`. Uncompiled it runs the same function eagerly, which is what the
compiled update is tested against. With ``autocast`` its forward and loss run under :func:`torch.autocast`
(bfloat16 products and activations, half the memory traffic of float32; the weights, their gradients and the
optimizer stay float32).

A loss reads its batch by name: a batch is a dict of named tensors (or of a
:class:`~rlstruct.structures.Trajectories`, for a loss that replays an agent), and each loss declares the keys it
reads with :func:`reads`, which :class:`UpdateStep` checks before the loss runs (:class:`~rlstruct.errors.BatchKeyError`
names a missing one). :func:`minibatch_epochs` runs epochs of shuffled minibatches of such a batch.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_

from rlstruct._accel import accelerator_for
from rlstruct.algos._normalization import LearnerNormalization, SumOverRanks
from rlstruct.algos._optim import Adam, OptimizerLike
from rlstruct.algos._train.config import (
    AUTOCAST_VALUES,
    ActorCriticPart,
    AutocastPart,
    FastPathPart,
    OnPolicyConfig,
    RunConfig,
)
from rlstruct.algos.networks import ActorCritic, autocast_context, make_adam
from rlstruct.batchers import Pipeline, RL_Batcher, WeightSync
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import BatchKeyError
from rlstruct.structures import Trajectories

__all__ = [
    "AUTOCAST_DTYPES",
    "weight_sync_mode",
    "autocast_dtype",
    "training_agent_kwargs",
    "actor_critic_learner",
    "start_pipeline",
    "Batch",
    "reads",
    "loss_keys",
    "UpdateStep",
    "clip_groups",
    "shuffled_minibatches",
    "minibatch_epochs",
]

log = logging.getLogger(__name__)

#: a batch of named inputs of a loss: tensors whose first dimension is the batch's rows (or a
#: :class:`~rlstruct.structures.Trajectories`, whose rows are its envs)
Batch = Mapping[str, Any]
#: a loss over a batch: ``(batch) -> (loss, stats)``, ``stats`` 0-d tensors
LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]
_F = TypeVar("_F", bound=Callable[..., Any])


def reads(*keys: str) -> Callable[[_F], _F]:
    """Declares the keys of its batch that a loss reads (its ``in_keys``, as TorchRL's losses declare theirs); the
    batch is the loss's last argument, so that ``functools.partial(loss, model, config)`` is a :data:`LossFn`.

    >>> @reads("x", "y")
    ... def loss(batch):
    ...     return (batch["x"] - batch["y"]).pow(2).mean(), {}
    >>> loss_keys(loss), loss_keys(functools.partial(loss))
    (('x', 'y'), ('x', 'y'))
    """
    def declare(fn: _F) -> _F:
        fn.in_keys = keys  # type: ignore[attr-defined]
        return fn

    return declare


def loss_keys(loss_fn: Callable[..., Any]) -> tuple[str, ...]:
    """The keys ``loss_fn`` (a function or a ``functools.partial`` of one) declares with :func:`reads`.

    Raises:
        TypeError: it declares none.
    """
    fn = loss_fn.func if isinstance(loss_fn, functools.partial) else loss_fn
    keys = getattr(fn, "in_keys", None)
    if keys is None:
        raise TypeError(f"loss_fn must declare the keys of the batch it reads, got {loss_fn!r} without them; "
                        "decorate it with @reads('key', ...)")
    return tuple(keys)

#: the dtype of each value of ``AutocastPart.autocast`` (:data:`~.config.AUTOCAST_VALUES`, checked by
#: :func:`~.config.check_autocast`): of the update's forward and loss and of the training agent's forward (``None``:
#: float32)
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    name: None if name == "none" else getattr(torch, name) for name in AUTOCAST_VALUES
}


def autocast_dtype(config: AutocastPart) -> torch.dtype | None:
    """The dtype of ``config.autocast`` (``None``: no autocast).

    >>> autocast_dtype(OnPolicyConfig()), autocast_dtype(OnPolicyConfig(autocast="bfloat16"))
    (None, torch.bfloat16)
    """
    return AUTOCAST_DTYPES[config.autocast]


def training_agent_kwargs(config: RunConfig) -> dict[str, object]:
    """The keyword arguments that the training agent of ``config``'s algorithm takes (``open_batchers``'s
    ``agent_kwargs``): its ``autocast`` where the config has an :class:`~.config.AutocastPart` (every on-policy
    algorithm, DQN), none otherwise (SAC); an on-policy model part adds its own (the actor-critic's ``compile``).

    >>> from rlstruct.algos.sac import SACConfig
    >>> training_agent_kwargs(OnPolicyConfig(autocast="bfloat16")), training_agent_kwargs(SACConfig())
    ({'autocast': torch.bfloat16}, {})
    """
    return {"autocast": autocast_dtype(config)} if isinstance(config, AutocastPart) else {}


def weight_sync_mode(config: RunConfig) -> str:
    """The :class:`~rlstruct.batchers.WeightSync` mode a run asks for: ``"auto"`` with a
    :class:`~.config.FastPathPart`'s ``share_weights`` (the weights shared or copied on the device where the training
    batcher runs in process on the learner's device, which :class:`~rlstruct.batchers.WeightSync` decides), else
    ``"cpu"`` (also for an algorithm without that part, SAC).

    >>> from rlstruct.algos.sac import SACConfig
    >>> weight_sync_mode(OnPolicyConfig()), weight_sync_mode(OnPolicyConfig(share_weights=False))
    ('auto', 'cpu')
    >>> weight_sync_mode(SACConfig())
    'cpu'
    """
    return "auto" if isinstance(config, FastPathPart) and config.share_weights else "cpu"


def actor_critic_learner(
    model: nn.Module, config: OnPolicyConfig, *, n_rows: int, device: DeviceLike,
    sum_over_ranks: SumOverRanks | None = None,
) -> tuple[Adam, LearnerNormalization]:
    """The learner's parts of the on-policy algorithms besides the model: its Adam and its
    :class:`~rlstruct.algos._normalization.LearnerNormalization` (``config.normalize_rewards``, its discount
    ``config.normalize_rewards_gamma`` or ``config.gamma``). The loop declares both in the learner's
    :class:`~.learner_state.LearnerState`, which a resumed run restores.

    Args:
        model: the learner's model, on ``device``.
        config: the run's config (a :class:`OnPolicyConfig` with the normalisation settings and ``gamma``).
        n_rows: the rows of every collection.
        device: the learner's device.
        sum_over_ranks: in a data-parallel run, the sum over the ranks that merges the normalisation statistics.

    Returns:
        ``(optimizer, normalize)``.
    """
    optimizer = make_adam(model, config.lr, device, eps=config.adam_eps)
    after = isinstance(config, ActorCriticPart) and config.obs_stats_after_update  # PQN has no normaliser
    gamma = config.gamma if config.normalize_rewards_gamma is None else config.normalize_rewards_gamma
    normalize = LearnerNormalization(model, normalize_rewards=config.normalize_rewards, n_rows=n_rows,
                                     gamma=gamma, device=device, observations_after_update=after,
                                     sum_over_ranks=sum_over_ranks)
    return optimizer, normalize


def start_pipeline(stack: contextlib.ExitStack, batcher: RL_Batcher, model: nn.Module, config: RunConfig, *,
                   device: torch.device, overlap: bool = False) -> Pipeline:
    """The training batcher's :class:`~rlstruct.batchers.Pipeline` for a run, started (initial weights sent, envs
    reset) and closed by ``stack`` before the batcher is.

    Args:
        stack: the run's exit stack, on which the batcher was pushed.
        batcher: the auto-reset training batcher.
        model: the learner's model, on ``device``.
        config: the run's settings (:func:`weight_sync_mode`'s).
        device: the learner's device (resolved).
        overlap: collect the next batch while learning on this one (the batcher's agent then gets a snapshot of
            the weights, never the learner's own tensors).
    """
    sync = WeightSync(batcher, model, device, weight_sync_mode(config), snapshot=overlap)
    pipe = Pipeline(batcher, sync, overlap=overlap)
    stack.callback(pipe.close)
    pipe.start()
    return pipe


def clip_groups(model: nn.Module, *, per_network: bool = True) -> list[tuple[str, list[nn.Parameter]]]:
    """The parameter groups whose gradient norms an update clips, each with the statistic's key.

    An :class:`~rlstruct.algos.networks.ActorCritic` with ``per_network`` gets two groups (``grad_norm/actor``,
    ``grad_norm/critic``: the critic's large early errors must not shrink the policy's step); any other model,
    or ``per_network=False``, one (``grad_norm``).
    """
    if per_network and isinstance(model, ActorCritic):
        return [("grad_norm/actor", list(model.policy_parameters())),
                ("grad_norm/critic", list(model.critic.parameters()))]
    return [("grad_norm", list(model.parameters()))]


def shuffled_minibatches(n: int, n_minibatches: int, shuffle: torch.Generator) -> Iterator[torch.Tensor]:
    """One pass over ``n`` rows in ``n_minibatches`` equal minibatches of shuffled row indices (``int64``, on the
    generator's device). When ``n_minibatches`` does not divide ``n``, the last ``n % n_minibatches`` rows of the
    shuffle (a different few at each pass) sit the pass out.

    >>> [mb.tolist() for mb in shuffled_minibatches(5, 2, torch.Generator().manual_seed(0))]
    [[4, 0], [1, 3]]
    """
    order = torch.randperm(n, generator=shuffle, device=shuffle.device)
    size = n // n_minibatches
    return (order[k * size:(k + 1) * size] for k in range(n_minibatches))


def minibatch_epochs(
    update: UpdateStep,
    batch: Batch,
    *,
    n_epochs: int,
    n_minibatches: int,
    shuffle: torch.Generator,
    stop: Callable[[dict[str, torch.Tensor]], bool] | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """``n_epochs`` passes over ``batch``'s rows in ``n_minibatches`` shuffled minibatches
    (:func:`shuffled_minibatches`), one ``update`` each.

    Args:
        update: the update of one minibatch.
        batch: tensors with the same rows (flat steps ``[N, ...]``, or whole env windows ``[B, T, ...]`` beside a
            :class:`~rlstruct.structures.Trajectories`, whose rows are its envs).
        n_epochs: passes over the batch.
        n_minibatches: minibatches per pass.
        shuffle: the generator of the minibatches' order.
        stop: ``(the last update's statistics) -> bool``, asked after each pass: ``True`` ends the passes early
            (e.g. PPO's ``target_kl``; it may sync with the host, once per pass).

    Returns:
        ``(statistics, epochs)``: the mean of every update's statistics, and the passes made.

    >>> w = torch.zeros(1, requires_grad=True)
    >>> loss_fn = reads("x")(lambda batch: ((batch["x"] * w).sum(), {"rows": torch.tensor(len(batch["x"]) * 1.0)}))
    >>> update = UpdateStep(loss_fn, torch.optim.SGD([w], lr=0.1), [], max_grad_norm=0.0, device="cpu")
    >>> minibatch_epochs(update, {"x": torch.ones(6)}, n_epochs=2, n_minibatches=3,
    ...                  shuffle=torch.Generator().manual_seed(0))
    ({'rows': tensor(2.)}, 2)
    """
    first = next(iter(batch.values()))
    n = first.n_elems() if isinstance(first, Trajectories) else first.shape[0]
    rows: list[dict[str, torch.Tensor]] = []
    epochs = 0
    for _ in range(n_epochs):
        for mb in shuffled_minibatches(n, n_minibatches, shuffle):
            rows.append(update({k: v.index(mb) if isinstance(v, Trajectories) else v[mb] for k, v in batch.items()}))
        epochs += 1
        if stop is not None and stop(rows[-1]):
            break
    return {key: torch.stack([r[key] for r in rows]).mean() for key in rows[0]}, epochs


class UpdateStep:
    """One learner update: ``loss, stats = loss_fn(batch)``, backward, gradient clipping, optimizer step.

    With ``compile``, ``loss_fn`` (the forward and the loss) is compiled once by ``torch.compile``: on CUDA in
    ``mode="reduce-overhead"`` (its forward and backward replayed as CUDA graphs; the statistics are cloned out
    of the graphs' memory, which the next replay overwrites), on the CPU in the default mode. Inputs of changing
    shapes (REINFORCE's episode lengths) need ``dynamic=True``, else every new shape compiles again. The
    backward, the clipping (``clip_grad_norm_``, foreach, no host sync) and the fused optimizer step run eagerly.
    With ``autocast``, ``loss_fn`` runs under ``torch.autocast(device.type, dtype=autocast)`` (inside what is
    compiled): its matrix products and their activations in that dtype, and through them the backward; the
    loss, the statistics and the gradients of the float32 parameters come out in float32.

    Args:
        loss_fn: ``(batch) -> (loss, stats)``, the forward and the loss over a batch of named tensors, with the keys
            it reads declared by :func:`reads`; ``stats`` are 0-d tensors.
        optimizer: the learner's optimizer.
        groups: parameter groups to clip, each with its statistic's key (see :func:`clip_groups`).
        max_grad_norm: the norm each group is clipped to (0: no clipping).
        device: the learner's device (picks the compile mode).
        compile: compile ``loss_fn``.
        dynamic: ``torch.compile``'s ``dynamic`` (``None``: decide on a shape change, ``True``: symbolic shapes).
        backend: ``torch.compile``'s backend (default inductor; ``"aot_eager"`` needs no C++ compiler).
        autocast: the dtype of ``torch.autocast`` around ``loss_fn`` (``None``: none).

    >>> model = nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> loss_fn = reads("x")(lambda batch: (model(batch["x"]).pow(2).mean(), {}))
    >>> step = UpdateStep(loss_fn, opt, clip_groups(model), max_grad_norm=1.0, device="cpu")
    >>> sorted(step({"x": torch.ones(4, 2)}))
    ['grad_norm']
    >>> step({"y": torch.ones(4, 2)})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlstruct.errors.BatchKeyError: the loss <lambda> reads batch['x'], which the batch does not hold (it holds ['y'])...
    """

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: OptimizerLike,
        groups: Sequence[tuple[str, Sequence[nn.Parameter]]],
        *,
        max_grad_norm: float,
        device: DeviceLike,
        compile: bool = False,
        dynamic: bool | None = None,
        backend: str = "inductor",
        autocast: torch.dtype | None = None,
    ):
        self.device = as_device(device)
        self.in_keys = loss_keys(loss_fn)
        self._name = getattr(loss_fn.func if isinstance(loss_fn, functools.partial) else loss_fn, "__name__",
                             repr(loss_fn))
        self.optimizer = optimizer
        self.groups = [(key, list(params)) for key, params in groups]
        self.max_grad_norm = float(max_grad_norm)
        self.compiled = bool(compile)
        # The compile mode comes from the device's accelerator (rlstruct._accel), resolved once: CUDA's picks
        # reduce-overhead (CUDA graphs) for inductor; without one (the CPU) the default mode.
        accel = accelerator_for(self.device) if self.compiled else None
        mode = accel.compile_mode(backend) if accel is not None else None
        self._graphs = accel if mode == "reduce-overhead" else None
        if autocast is not None:
            loss_fn = functools.partial(_autocast, loss_fn, self.device, autocast)
        if accel is not None:
            self.loss_fn = accel.compile(loss_fn, mode=mode, dynamic=dynamic, backend=backend)
        elif self.compiled:
            self.loss_fn = torch.compile(loss_fn, dynamic=dynamic, backend=backend)
        else:
            self.loss_fn = loss_fn

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Runs one update on ``batch``; returns ``stats`` plus one gradient norm per clipped group (before
        clipping), all 0-d tensors on the device (no host sync).

        Raises:
            BatchKeyError: ``batch`` lacks a key the loss reads.
        """
        for key in self.in_keys:
            if key not in batch:
                raise BatchKeyError(
                    f"the loss {self._name} reads batch[{key!r}], which the batch does not hold (it holds "
                    f"{sorted(batch)}); give the batch every key the loss declares with @reads: {list(self.in_keys)}",
                    key)
        graphs = self._graphs
        if graphs is not None:
            # A new iteration of the CUDA graph trees: the previous replay's outputs may be overwritten from now on.
            graphs.mark_step_begin()
        loss, stats = self.loss_fn(batch)
        if graphs is not None:
            stats = {k: v.detach().clone() for k, v in stats.items()}
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.max_grad_norm > 0:
            for key, params in self.groups:
                stats[key] = clip_grad_norm_(params, self.max_grad_norm)
        self.optimizer.step()
        return stats


def _autocast(loss_fn: LossFn, device: torch.device, dtype: torch.dtype,
              batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # The backward runs outside the context (as torch recommends): it follows the forward's dtypes by itself.
    with autocast_context(device, dtype):
        loss, stats = loss_fn(batch)
    return loss.float(), {k: v.float() for k, v in stats.items()}
