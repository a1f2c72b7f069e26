"""The policy-gradient loss of an actor-critic that REINFORCE and A2C share, and the masked normalisation of
advantages that it and PPO's loss use: free functions on ``[B, T]`` tensors, averaged over the valid steps.
"""

from __future__ import annotations

import torch

__all__ = ["masked_policy_value_loss", "normalize_masked"]


def masked_policy_value_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    value_targets: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of a policy with a learned value, averaged over the valid steps.

    ``loss = -mean(log pi(a|s) * A) + value_coef * mean((V(s) - target)^2) / 2 - entropy_coef * mean(H)``:
    the core of :func:`~rlstruct.algos.a2c.a2c_loss` (GAE targets) and
    :func:`~rlstruct.algos.reinforce.reinforce_loss` (Monte-Carlo returns, ``V`` the baseline), which
    compute their own ``value_targets`` and ``advantages``. It takes log-probabilities and entropies, so it
    serves every :data:`~rlstruct.algos.distributions.ActionDistribution`.

    Args:
        log_probs: ``float [B, T]``, ``log pi(a|s)`` of the sampled actions, with gradient.
        entropy: ``float [B, T]``, the policy's entropy at each step, with gradient.
        values: ``float [B, T]`` with gradient.
        value_targets: ``float [B, T]``, what ``values`` regresses on (no gradient).
        advantages: ``float [B, T]`` (no gradient).
        mask: ``float [B, T]``, 1 on valid steps; an all-zero mask gives a zero loss, not nan.
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise the advantages over the valid steps for the policy term.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d ``policy``, ``value`` and ``entropy`` terms.

    >>> from rlstruct.algos.distributions import Categorical
    >>> d = Categorical(torch.zeros(1, 2, 2))
    >>> loss, stats = masked_policy_value_loss(d.log_prob(torch.zeros(1, 2, dtype=torch.long)), d.entropy(),
    ...                                        torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2),
    ...                                        value_coef=1.0, entropy_coef=0.0, normalize_advantages=False)
    >>> round(loss.item(), 4), round(stats["value"].item(), 4)
    (1.1931, 0.5)
    """
    n = mask.sum().clamp_min(1.0)
    adv = advantages
    if normalize_advantages:
        adv = normalize_masked(adv, mask)
    policy_loss = -(log_probs * adv * mask).sum() / n
    value_loss = 0.5 * (((values - value_targets) ** 2) * mask).sum() / n
    mean_entropy = (entropy * mask).sum() / n
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    return loss, {"policy": policy_loss.detach(), "value": value_loss.detach(), "entropy": mean_entropy.detach()}


def normalize_masked(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with the mean and (biased) std taken over the valid entries of ``mask``.

    >>> normalize_masked(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0]))[:2]
    tensor([-1.,  1.])
    """
    n = mask.sum().clamp_min(1.0)
    mean = (x * mask).sum() / n
    std = (((x - mean) ** 2 * mask).sum() / n).sqrt()
    return (x - mean) / (std + eps)
