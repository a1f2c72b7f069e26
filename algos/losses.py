"""The policy-gradient loss of an actor-critic that REINFORCE and A2C share, IMPALA's loss with V-trace corrections
on it, and the masked normalisation of advantages that it and PPO's loss use: free functions on ``[B, T]`` tensors,
averaged over the valid steps.
"""

from __future__ import annotations

import torch

from rlstruct.algos.returns import _check_like_rewards, vtrace

__all__ = ["masked_policy_value_loss", "vtrace_policy_value_loss", "normalize_masked"]


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


def vtrace_policy_value_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    value_coef: float,
    entropy_coef: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lambda_: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IMPALA's loss (Espeholt et al. 2018, section 4.2): the policy gradient with V-trace advantages, the value
    regressed on the V-trace targets, and an entropy bonus, averaged over the valid steps.

    ``loss = -mean(log pi(a|s) * A_vtrace) + value_coef * mean((V(s) - v_s)^2) / 2 - entropy_coef * mean(H)``, where
    ``v_s`` and ``A_vtrace = rho_s * (r_s + gamma * v_{s+1} - V(s))`` are :func:`~rlstruct.algos.returns.vtrace`'s,
    computed from ``log_probs`` and ``values`` without gradient: the gradient reaches the policy through ``log_probs``
    and the critic through ``values`` only, never through the targets. Advantages are not standardised.

    Args:
        log_probs: ``float [B, T]``, ``log pi(a|s)`` of the actions taken under the learned policy, with gradient.
        entropy: ``float [B, T]``, the learned policy's entropy at each step, with gradient.
        values: ``float [B, T]``, ``V(observation/frame)`` with gradient.
        behaviour_log_probs: ``float [B, T]``, ``log mu(a|s)`` recorded by the policy that acted.
        rewards: ``float [B, T]``.
        next_values: ``float [B, T]``, ``V(_observation/frame)`` (no gradient needed).
        terminated: ``bool [B, T]``.
        done: ``bool [B, T]`` (terminated or truncated).
        mask: ``float [B, T]``, 1 on valid steps; an all-zero mask gives a zero loss, not nan.
        gamma: discount factor.
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        rho_bar: clip of the importance weights (``> 0``).
        c_bar: clip of the trace coefficients (``0 <= c_bar <= rho_bar``).
        lambda_: trace decay (``[0, 1]``).

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d ``policy``, ``value`` and ``entropy`` terms, ``rho`` (the
        mean clipped importance weight) and ``rho_clipped`` (the fraction of steps whose weight ``rho_bar`` clipped),
        over the valid steps.

    Raises:
        ConfigError: ``rho_bar``, ``c_bar`` or ``lambda_`` is out of range.
        BatchSizeError: a tensor is not ``[B, T]`` like ``rewards``.

    >>> from rlstruct.algos.distributions import Categorical
    >>> d = Categorical(torch.zeros(1, 2, 2)); lp = d.log_prob(torch.zeros(1, 2, dtype=torch.long))
    >>> f = torch.tensor([[False, False]])
    >>> loss, stats = vtrace_policy_value_loss(lp, d.entropy(), torch.zeros(1, 2), lp, torch.ones(1, 2),
    ...                                        torch.zeros(1, 2), f, f, torch.ones(1, 2), gamma=0.5, value_coef=1.0,
    ...                                        entropy_coef=0.0)
    >>> round(loss.item(), 4), round(stats["value"].item(), 4), stats["rho"].item()
    (1.6789, 0.8125, 1.0)
    """
    targets, advantages, rhos, _ = vtrace(behaviour_log_probs, log_probs, rewards, values, next_values, terminated,
                                          done, gamma, rho_bar=rho_bar, c_bar=c_bar, lambda_=lambda_)
    _check_like_rewards(rewards, entropy=entropy, mask=mask)
    loss, stats = masked_policy_value_loss(log_probs, entropy, values, targets, advantages, mask,
                                           value_coef=value_coef, entropy_coef=entropy_coef,
                                           normalize_advantages=False)
    with torch.no_grad():
        n = mask.sum().clamp_min(1.0)
        clipped = (log_probs - behaviour_log_probs).exp() > rho_bar
        stats["rho"] = (rhos * mask).sum() / n
        stats["rho_clipped"] = (clipped * mask).sum() / n
    return loss, stats


def normalize_masked(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with the mean and (biased) std taken over the valid entries of ``mask``.

    >>> normalize_masked(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0]))[:2]
    tensor([-1.,  1.])
    """
    n = mask.sum().clamp_min(1.0)
    mean = (x * mask).sum() / n
    std = (((x - mean) ** 2 * mask).sum() / n).sqrt()
    return (x - mean) / (std + eps)
