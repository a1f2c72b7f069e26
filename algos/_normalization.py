"""Running normalisation of observations and rewards for the on-policy algorithms: :class:`ObservationNormalizer`,
a module of the network whose statistics travel with the weights, and :class:`ReturnNormalizer`, which divides the
learner's rewards by the running standard deviation of their discounted return. No gradient flows through either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from rlstruct.devices import DeviceLike
from rlstruct.errors import ConfigError
from rlstruct.structures import TemporalDictTensor

__all__ = [
    "OBSERVATION_CLIP",
    "REWARD_CLIP",
    "LearnerNormalization",
    "ObservationNormalizer",
    "ReturnNormalizer",
    "RunningMoments",
    "SumOverRanks",
    "update_observation_statistics",
]

#: the bound of normalised observations (Stable-Baselines3's and CleanRL's)
OBSERVATION_CLIP = 10.0
#: the bound of normalised rewards (Stable-Baselines3's ``VecNormalize`` and CleanRL's wrappers clip them at 10 too)
REWARD_CLIP = 10.0

#: sums a tensor over the ranks of a data-parallel run, in place, and returns it
#: (:func:`rlstruct.algos._train.distributed.sum_over_ranks`); ``None`` for one process
SumOverRanks = Callable[[torch.Tensor], torch.Tensor]


class RunningMoments(nn.Module):
    """The running mean and (population) variance of a stream of batches of ``shape``-sized values.

    Each :meth:`update` merges a batch's moments into the running ones (Chan et al.'s parallel formula), with a
    mask selecting the rows that count; a batch of no valid row leaves them unchanged. In a data-parallel run the
    batch is every rank's share: its count, mean and variance are summed over the ranks before the merge, so every
    rank keeps the statistics one process would keep on the whole batch. Everything is tensor
    arithmetic on the buffers' device, in place: no host sync, safe under CUDA-graph replay and shared weights.
    ``count`` is float64 (exact up to 2^53 values); ``mean`` and ``var`` are float32, starting at 0 and 1.

    Args:
        shape: the shape of one value (``()`` for scalars).

    >>> m = RunningMoments(())
    >>> m.update(torch.tensor([1.0, 2.0, 3.0]))
    >>> m.update(torch.tensor([4.0, 5.0, 100.0]), torch.tensor([1.0, 1.0, 0.0]))
    >>> round(m.mean.item(), 4), round(m.var.item(), 4), int(m.count)
    (3.0, 2.0, 5)
    """

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(tuple(shape)))
        self.register_buffer("var", torch.ones(tuple(shape)))

    @torch.no_grad()
    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
               sum_over_ranks: SumOverRanks | None = None) -> None:
        """Merges the rows of ``x [N, *shape]`` where ``mask`` (``float [N]``, 1 on rows that count; ``None``: all
        of them) into the running moments; with ``sum_over_ranks``, the rows of every rank (two all-reduces: the
        count and sum, then the squared deviations from the global mean)."""
        x = x.float()
        n = x.shape[0]
        if mask is None:
            mask = torch.ones(n, device=x.device)
        w = mask.float().reshape((n,) + (1,) * (x.ndim - 1))
        n_batch, total_x = mask.float().sum().reshape(1), (x * w).sum(0)
        if sum_over_ranks is not None:
            both = sum_over_ranks(torch.cat([n_batch, total_x.flatten()]))
            n_batch, total_x = both[:1], both[1:].reshape(total_x.shape)
        n_batch = n_batch.reshape(())
        batch_mean = total_x / n_batch.clamp_min(1.0)
        squares = ((x - batch_mean) ** 2 * w).sum(0)
        if sum_over_ranks is not None:
            squares = sum_over_ranks(squares)
        batch_var = squares / n_batch.clamp_min(1.0)
        total = self.count + n_batch.double()
        frac = (n_batch.double() / total.clamp_min(1.0)).float()  # the batch's share of all values seen
        delta = batch_mean - self.mean
        self.var.copy_(self.var * (1.0 - frac) + batch_var * frac + delta**2 * frac * (1.0 - frac))
        self.mean.add_(delta * frac)
        self.count.copy_(total)


class ObservationNormalizer(RunningMoments):
    """``clip((x - mean) / sqrt(var + eps), -clip, clip)`` with the running moments of the observations seen.

    Before any :meth:`~RunningMoments.update` it only clips (mean 0, variance 1).

    Args:
        shape: one observation's shape, e.g. ``(obs_dim,)``.
        clip: the bound of the normalised values.
        eps: added to the variance (a constant feature is mapped to 0, not to ``nan``).

    Shapes: ``x: [..., *shape]`` of any float dtype -> ``float32 [..., *shape]``.

    >>> norm = ObservationNormalizer((2,), clip=5.0)
    >>> norm.update(torch.tensor([[0.0, 10.0], [2.0, 10.0]]))
    >>> norm(torch.tensor([[3.0, 10.0]], dtype=torch.float64))
    tensor([[2., 0.]])
    """

    def __init__(self, shape: Sequence[int], *, clip: float = OBSERVATION_CLIP, eps: float = 1e-8):
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip!r}; pass e.g. 10.0")
        super().__init__(shape)
        self.clip, self.eps = float(clip), float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised, clipped ``x``."""
        return ((x.float() - self.mean) * torch.rsqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    def extra_repr(self) -> str:
        """The shape and the clip, in the module's repr."""
        return f"shape={tuple(self.mean.shape)}, clip={self.clip}"


class ReturnNormalizer:
    """Divides rewards by the running standard deviation of the discounted return (not centred: the sign and the
    zero of the rewards are kept), the return carried across collections per env row, and clips the scaled rewards
    to ``[-clip, clip]``.

    Call it on each collection of auto-reset rows (or of episodes that start at step 0 of their row, as
    REINFORCE's): ``G_t = gamma * G_{t-1} + r_t``, reset to 0 after an episode's end; the running moments take
    every valid ``G_t`` of the collection, then its rewards are divided by ``sqrt(var + eps)``.

    Args:
        n_rows: the rows of every collection (the training batcher's ``n_elems()``).
        gamma: the discount of the returns.
        device: where the collections are (the learner's device).
        eps: added to the variance.
        clip: the bound of the scaled rewards.
        sum_over_ranks: in a data-parallel run, the sum over the ranks: the moments take every rank's returns.

    Shapes: ``rewards: float [B, T]``, ``done: bool [B, T]``, ``mask: float [B, T]`` -> ``float32 [B, T]``.

    >>> norm = ReturnNormalizer(1, gamma=0.0, device="cpu", clip=2.0)
    >>> norm(torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2, dtype=torch.bool), torch.ones(1, 2))
    tensor([[1., 2.]])
    """

    def __init__(self, n_rows: int, *, gamma: float, device: DeviceLike, eps: float = 1e-8,
                 clip: float = REWARD_CLIP, sum_over_ranks: SumOverRanks | None = None):
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip!r}; pass e.g. 10.0")
        self.gamma, self.eps, self.clip = float(gamma), float(eps), float(clip)
        self.sum_over_ranks = sum_over_ranks
        self.moments = RunningMoments(()).to(device)
        self.carry = torch.zeros(n_rows, device=device)

    @torch.no_grad()
    def __call__(self, rewards: torch.Tensor, done: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The scaled rewards, after the moments took the collection's returns."""
        rewards = rewards.float()
        ongoing = ~done.bool()
        g, returns = self.carry, []
        for t in range(rewards.shape[1]):  # T steps of [B] tensors: the recursion runs forward in time
            g = g * self.gamma + rewards[:, t]
            returns.append(g)
            g = g * ongoing[:, t]
        self.carry = g
        self.moments.update(torch.stack(returns, 1).flatten(), mask.flatten(), sum_over_ranks=self.sum_over_ranks)
        return (rewards * torch.rsqrt(self.moments.var + self.eps)).clamp(-self.clip, self.clip)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The running moments of the return (``count``, ``mean``, ``var``), what a resumed run restores."""
        return self.moments.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restores the running moments of :meth:`state_dict`; the carried returns start at 0, since a resumed run's
        envs start fresh episodes."""
        self.moments.load_state_dict(state)
        self.carry.zero_()


def update_observation_statistics(model: nn.Module, trajectories: TemporalDictTensor, *,
                                  sum_over_ranks: SumOverRanks | None = None) -> None:
    """Merges the valid steps of a collection's ``observation/frame`` into the statistics of ``model.normalizer``
    (a model without one is left alone): the learner's call once per collection, before or after its update
    (:class:`LearnerNormalization`); with ``sum_over_ranks``, every rank's collection."""
    normalizer = getattr(model, "normalizer", None)
    if normalizer is not None:
        frame = trajectories["observation/frame"]
        normalizer.update(frame.flatten(0, 1), trajectories.mask().flatten(), sum_over_ranks=sum_over_ranks)


class LearnerNormalization:
    """What the learner does to each collection around its update: ``model.normalizer`` (if any) takes the
    collection's observations (:func:`update_observation_statistics`), before the update or after it
    (``observations_after_update``), and the rewards for the loss come back divided by the running standard
    deviation of the return (``normalize_rewards``, :class:`ReturnNormalizer`) or as they are.

    Merged before the update, the statistics the update's forwards see already hold the collection, so its first
    pass starts from a policy other than the one that acted wherever they moved (most at the first collections).
    Merged after it, the update starts from the policy that acted (its probability ratios are 1 until the first
    step), as when Stable-Baselines3's ``VecNormalize`` or CleanRL's wrappers store each observation normalised as
    the policy saw it; the next collection then acts with the new statistics.

    Args:
        model: the learner's model.
        normalize_rewards: scale the rewards.
        n_rows: the rows of every collection.
        gamma: the discount of the returns.
        device: the learner's device.
        observations_after_update: merge the observations after the update (:meth:`after_update`), not before.
        sum_over_ranks: in a data-parallel run, the sum over the ranks: both statistics take every rank's
            collection, so that the ranks' models (whose buffers hold the observation statistics) stay identical.
    """

    def __init__(self, model: nn.Module, *, normalize_rewards: bool, n_rows: int, gamma: float, device: DeviceLike,
                 observations_after_update: bool = False, sum_over_ranks: SumOverRanks | None = None):
        self.model, self.sum_over_ranks = model, sum_over_ranks
        self.observations_after_update = observations_after_update
        self.returns = (ReturnNormalizer(n_rows, gamma=gamma, device=device, sum_over_ranks=sum_over_ranks)
                        if normalize_rewards else None)

    def __call__(self, trajectories: TemporalDictTensor) -> torch.Tensor:
        """The rewards ``float [B, T]`` for the loss, before the update; the observation statistics take
        ``trajectories`` now unless ``observations_after_update``."""
        if not self.observations_after_update:
            update_observation_statistics(self.model, trajectories, sum_over_ranks=self.sum_over_ranks)
        rewards = trajectories["_observation/reward"]
        if self.returns is None:
            return rewards
        return self.returns(rewards, trajectories["_observation/done"], trajectories.mask())

    def after_update(self, trajectories: TemporalDictTensor) -> None:
        """The learner's call after the update on ``trajectories``: their observations join the statistics now
        with ``observations_after_update`` (else :meth:`__call__` merged them)."""
        if self.observations_after_update:
            update_observation_statistics(self.model, trajectories, sum_over_ranks=self.sum_over_ranks)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """The learner-side statistics a resumed run restores: ``{"returns": ...}`` with ``normalize_rewards``
        (:meth:`ReturnNormalizer.state_dict`), else ``{}`` (the observation statistics are the model's buffers).

        >>> norm = LearnerNormalization(nn.Identity(), normalize_rewards=True, n_rows=1, gamma=0.9, device="cpu")
        >>> sorted(norm.state_dict()["returns"])
        ['count', 'mean', 'var']
        """
        return {} if self.returns is None else {"returns": self.returns.state_dict()}

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Restores the statistics of :meth:`state_dict`.

        Raises:
            ConfigError: ``state`` holds return statistics and this learner has none, or the reverse.
        """
        if (self.returns is None) != ("returns" not in state):
            have, got = ("no", "some") if self.returns is None else ("some", "no")
            raise ConfigError(f"normalize_rewards must match the saved learner state: this learner keeps {have} return "
                              f"statistics, got a state with {got}; resume with the run's --normalize-rewards setting")
        if self.returns is not None:
            self.returns.load_state_dict(state["returns"])
