"""Action distributions of the policies: :class:`Categorical` (discrete actions), :class:`DiagGaussian` (continuous
ones) and the log-density of SAC's tanh-squashed Gaussian.

:class:`Categorical` and :class:`DiagGaussian` answer the same questions (``log_prob``, ``entropy``,
``sample(generator)``, ``mode``), so a loss is written once for both kinds of action.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Categorical", "DiagGaussian", "ActionDistribution", "squashed_gaussian_log_prob"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class Categorical:
    """A categorical distribution over the last axis of ``logits``.

    Args:
        logits: ``float [..., A]`` unnormalised log-probabilities (of a network's forward under ``torch.autocast``
            too: the distribution computes in float32).

    >>> d = Categorical(torch.tensor([[0.0, math.log(3.0)]]))
    >>> d.log_prob(torch.tensor([1])).exp(), d.mode()
    (tensor([0.7500]), tensor([1]))
    """

    def __init__(self, logits: torch.Tensor):
        self.logits = logits.float()
        self.log_probs = torch.log_softmax(self.logits, -1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log p(a)`` of ``actions int64 [...]``: ``float [...]``."""
        return self.log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """``float [...]``."""
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """One draw per row from ``generator``: ``int64 [...]``."""
        return self.sample_from(Categorical.noise(self.logits.shape, generator, self.logits.device))

    @staticmethod
    def noise(shape: Sequence[int], generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """The randomness of :meth:`sample` for logits of ``shape``: uniform ``float32`` in ``[0, 1)``."""
        return torch.rand(tuple(shape), generator=generator, device=device, dtype=torch.float32)

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """The draw that ``noise`` (from :meth:`noise`) makes: :meth:`sample`'s, ``int64 [...]``."""
        # Gumbel-max: one uniform draw per logit, no per-row branch, works on every device with a generator.
        return (self.logits - torch.log(-torch.log(noise.clamp_min(1e-20)))).argmax(-1)

    def mode(self) -> torch.Tensor:
        """The most likely action: ``int64 [...]``."""
        return self.logits.argmax(-1)


class DiagGaussian:
    """A Gaussian with a diagonal covariance over the last axis (``D`` independent action dimensions).

    Args:
        mean: ``float [..., D]`` (of a network's forward under ``torch.autocast`` too: the distribution computes in
            float32).
        log_std: ``float [D]`` (state-independent) or ``[..., D]``.

    >>> d = DiagGaussian(torch.zeros(2, 1), torch.zeros(1))
    >>> d.log_prob(torch.zeros(2, 1)), d.entropy()
    (tensor([-0.9189, -0.9189]), tensor([1.4189, 1.4189]))
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean.float()
        self.log_std = log_std.expand_as(self.mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log p(a)`` of ``actions float [..., D]``, summed over ``D``: ``float [...]``."""
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        """``float [...]``."""
        return (self.log_std + 0.5 + _HALF_LOG_2PI).sum(-1)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """One draw per row from ``generator``: ``float [..., D]`` (unbounded: clip it for the env)."""
        return self.sample_from(DiagGaussian.noise(self.mean.shape, generator, self.mean.device))

    @staticmethod
    def noise(shape: Sequence[int], generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """The randomness of :meth:`sample` for means of ``shape``: standard normal ``float32``."""
        return torch.randn(tuple(shape), generator=generator, device=device, dtype=torch.float32)

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """The draw that ``noise`` (from :meth:`noise`) makes: :meth:`sample`'s, ``float [..., D]``."""
        return self.mean + self.log_std.exp() * noise

    def mode(self) -> torch.Tensor:
        """The mean: ``float [..., D]``."""
        return self.mean


#: what an actor-critic's ``policy(frame)`` returns
ActionDistribution = Categorical | DiagGaussian


def squashed_gaussian_log_prob(
    pre_tanh: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """Log-density of ``a = tanh(u) * scale + bias`` with ``u ~ N(mean, exp(log_std))``, per row.

    The change of variables (SAC paper, appendix C) subtracts ``log |da/du| = log scale + log(1 - tanh(u)^2)``
    from the Gaussian's log-density, written ``2 * (log 2 - u - softplus(-2u))`` so that it stays finite where
    ``tanh(u)`` rounds to 1.

    Args:
        pre_tanh: ``u``, ``float [N, D]``.
        mean: ``float [N, D]``.
        log_std: ``float [N, D]``.
        scale: ``float [D]``, half the action range.

    Returns:
        ``float [N]``, summed over the ``D`` action dimensions.

    >>> lp = squashed_gaussian_log_prob(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1))
    >>> round(float(lp), 4)  # N(0, 1) at 0, and tanh has slope 1 there
    -0.9189
    """
    gaussian = -0.5 * ((pre_tanh - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    log_det = torch.log(scale) + 2.0 * (math.log(2.0) - pre_tanh - nn.functional.softplus(-2.0 * pre_tanh))
    return (gaussian - log_det).sum(-1)
