"""Returns and advantages: discounted, n-step, GAE and V-trace, and episode statistics; free functions on ``[B, T]``
tensors, written over whole batches (the only Python loops run over time).

Step ``t`` of a trajectory is the transition ``observation/* (t) --action (t)--> _observation/* (t)``; its reward,
``done``, ``terminated`` and ``truncated`` are the ``_observation/*`` ones.
"""

from __future__ import annotations

import torch

from rlstruct.errors import BatchSizeError, ConfigError
from rlstruct.structures import Trajectories

__all__ = ["discounted_returns", "gae_advantages", "n_step_returns", "vtrace", "episode_statistics"]


def _as_float(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype) if x.dtype != like.dtype else x


def discounted_returns(
    rewards: torch.Tensor, done: torch.Tensor, gamma: float, *, bootstrap: torch.Tensor | None = None
) -> torch.Tensor:
    """Discounted returns computed backwards in time, cut at episode ends.

    ``G_t = r_t + gamma * ((1 - done_t) * G_{t+1} + bootstrap_t)`` with ``G_T = 0``. Set
    ``bootstrap_t = V(s_{t+1})`` where an episode is cut without terminating (a truncation, or the
    last step of an unfinished row) and ``0`` elsewhere.

    Args:
        rewards: ``float [B, T]``; padding steps must be zero, or cut off by ``done`` at the last valid step.
        done: ``bool or float [B, T]``, the episode ended at step ``t`` (terminated or truncated).
        gamma: discount factor.
        bootstrap: ``float [B, T]`` or ``None`` (no bootstrap).

    Returns:
        ``float [B, T]``, the returns.

    >>> discounted_returns(torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[False, True, False]]), 0.5)
    tensor([[1.5000, 1.0000, 1.0000]])
    """
    not_done = 1.0 - _as_float(done, rewards)
    returns = torch.empty_like(rewards)
    g = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        nxt = not_done[:, t] * g
        if bootstrap is not None:
            nxt = nxt + bootstrap[:, t]
        g = rewards[:, t] + gamma * nxt
        returns[:, t] = g
    return returns


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) with the time-limit rule.

    ``delta_t = r_t + gamma * (1 - terminated_t) * V'_t - V_t`` where ``V'_t`` is the value of the
    observation reached at ``t`` (``_observation/frame``, before any auto-reset): a truncated step
    bootstraps from its terminal observation, a terminated step does not bootstrap. The recursion
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` (``A_T = 0``) is cut at every episode end,
    so the last step of a row bootstraps from ``V'_{T-1}`` alone.

    Args:
        rewards: ``float [B, T]``.
        values: ``float [B, T]``, ``V(observation/frame)`` (no gradient needed).
        next_values: ``float [B, T]``, ``V(_observation/frame)``.
        terminated: ``bool [B, T]``.
        done: ``bool [B, T]`` (terminated or truncated).
        gamma: discount factor.
        lam: GAE lambda (1: Monte-Carlo advantages bootstrapped at the row's end; 0: one-step TD errors).

    Returns:
        ``float [B, T]``, the advantages; the critic's targets are ``advantages + values``.

    >>> r = torch.ones(1, 2); v = torch.zeros(1, 2); nv = torch.full((1, 2), 10.0)
    >>> f = torch.tensor([[False, False]]); trunc = torch.tensor([[False, True]])
    >>> gae_advantages(r, v, nv, f, trunc, gamma=0.5, lam=1.0)
    tensor([[9., 6.]])
    """
    not_term = 1.0 - _as_float(terminated, rewards)
    not_done = 1.0 - _as_float(done, rewards)
    deltas = rewards + gamma * not_term * next_values - values
    advantages = torch.empty_like(rewards)
    a = torch.zeros_like(rewards[:, 0])
    c = gamma * lam
    for t in range(rewards.shape[1] - 1, -1, -1):
        a = deltas[:, t] + c * not_done[:, t] * a
        advantages[:, t] = a
    return advantages


def n_step_returns(
    rewards: torch.Tensor, done: torch.Tensor, terminated: torch.Tensor, gamma: float, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of every step that has ``n`` steps after it in the window, cut at episode ends.

    For ``t`` in ``[0, M)``, ``M = L - n + 1``, the transition starting at ``t`` sums the rewards of
    ``m = min(n, steps up to and including the episode's end)`` steps:
    ``R_t = sum_{k<m} gamma^k r_{t+k}``; it ends at ``last_t = t + m - 1`` and its target is
    ``R_t + discount_t * Q(_observation/frame at last_t, .)`` with
    ``discount_t = gamma^m * (1 - terminated_{last_t})``: a truncated end bootstraps from the
    terminal observation, a terminated one does not.

    Args:
        rewards: ``float [B, L]``.
        done: ``bool [B, L]``.
        terminated: ``bool [B, L]``.
        gamma: discount factor.
        n: steps per return (``1 <= n <= L``).

    Returns:
        ``(returns float [B, M], last int64 [B, M], discounts float [B, M])``.

    Raises:
        ValueError: ``n`` is not in ``[1, L]``.

    >>> r = torch.ones(1, 3); truncated = torch.tensor([[False, True, False]])
    >>> R, last, disc = n_step_returns(r, truncated, torch.zeros_like(truncated), 0.5, 2)
    >>> R.tolist(), last.tolist(), disc.tolist()
    ([[1.5, 1.0]], [[1, 1]], [[0.25, 0.5]])
    """
    B, L = rewards.shape
    if not 1 <= n <= L:
        raise ValueError(f"n must be in [1, L={L}] (the window length), got {n}")
    M = L - n + 1
    dev = rewards.device
    base = torch.arange(M, device=dev).expand(B, M)
    returns = torch.zeros(B, M, dtype=rewards.dtype, device=dev)
    alive = torch.ones(B, M, dtype=torch.bool, device=dev)
    steps = torch.zeros(B, M, dtype=torch.int64, device=dev)
    term_end = torch.zeros(B, M, dtype=torch.bool, device=dev)
    for k in range(n):
        returns = returns + alive * (gamma**k) * rewards[:, k : k + M]
        steps = torch.where(alive, k + 1, steps)
        term_end = torch.where(alive, terminated[:, k : k + M].bool(), term_end)
        alive = alive & ~done[:, k : k + M].bool()
    # torch.full, not torch.tensor: a fill on the device, where a copy of a host number would wait for it
    discounts = torch.pow(torch.full((), gamma, dtype=rewards.dtype, device=dev), steps) * (~term_end)
    return returns, base + steps - 1, discounts


def _check_like_rewards(rewards: torch.Tensor, **tensors: torch.Tensor) -> None:
    if rewards.dim() != 2:
        raise BatchSizeError(f"rewards must be [B, T] (rows, steps), got shape {tuple(rewards.shape)}; pass one row "
                             "per env or episode")
    for name, x in tensors.items():
        if x.shape != rewards.shape:
            raise BatchSizeError(f"{name} must have the shape of rewards {tuple(rewards.shape)} ([B, T]), got "
                                 f"{tuple(x.shape)}; pass one {name} per step of every row")


def vtrace(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    *,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lambda_: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, eq. 1 and section 4), with the time-limit
    rule of :func:`gae_advantages`.

    With ``rho_t = min(rho_bar, pi/mu)`` and ``c_t = lambda_ * min(c_bar, pi/mu)`` (``pi`` the target policy, ``mu``
    the behaviour policy, both at the action taken), the target of ``V(x_s)`` is
    ``v_s = V_s + sum_{t>=s} gamma^(t-s) (c_s ... c_{t-1}) delta_t``,
    ``delta_t = rho_t * (r_t + gamma * (1 - terminated_t) * V'_t - V_t)``, the sum running to the episode's end or the
    row's last step, computed backwards as ``v_s - V_s = delta_s + gamma * c_s * (1 - done_s) * (v_{s+1} - V_{s+1})``.
    ``V'_t`` is the value of the observation reached at ``t``: a truncated step and the row's last step bootstrap from
    it, a terminated step does not. The policy gradient's advantage is
    ``rho_s * (r_s + gamma * (1 - terminated_s) * v'_s - V_s)``, where ``v'_s`` is ``v_{s+1}`` inside an episode and
    ``V'_s`` at its end or the row's. On-policy (``pi = mu``) with ``rho_bar, c_bar >= 1`` the targets are
    ``values + gae_advantages(..., lam=lambda_)``, and with ``lambda_ = 1`` the bootstrapped discounted returns.

    Every output is computed without gradient. Padding steps after an episode's ``done`` do not reach the valid steps.

    Args:
        behaviour_log_probs: ``float [B, T]``, ``log mu(a_t|x_t)`` recorded when acting.
        target_log_probs: ``float [B, T]``, ``log pi(a_t|x_t)`` under the policy being learned.
        rewards: ``float [B, T]``.
        values: ``float [B, T]``, ``V(observation/frame)``.
        next_values: ``float [B, T]``, ``V(_observation/frame)``.
        terminated: ``bool [B, T]``.
        done: ``bool [B, T]`` (terminated or truncated).
        gamma: discount factor.
        rho_bar: clip of the importance weights in ``delta`` and the policy gradient (``> 0``); sets the fixed point,
            the value of a policy between ``mu`` and ``pi`` (``pi`` itself when infinite).
        c_bar: clip of the trace coefficients (``0 <= c_bar <= rho_bar``, which the paper's contraction result
            assumes); sets the speed of convergence only.
        lambda_: trace decay of the paper's remark in section 4.2 (``[0, 1]``; 0: one-step targets).

    Returns:
        ``(targets, advantages, rhos, cs)``, each ``float [B, T]``: ``v_s``, the policy gradient's advantages, and the
        clipped weights ``rho_t`` and ``c_t`` (for logging).

    Raises:
        ConfigError: ``rho_bar``, ``c_bar`` or ``lambda_`` is out of range.
        BatchSizeError: ``rewards`` is not ``[B, T]``, or another tensor's shape is not ``rewards``'.

    >>> lp = torch.log(torch.tensor([[0.5, 0.25]])); blp = torch.log(torch.tensor([[0.25, 0.5]]))
    >>> f = torch.tensor([[False, False]])
    >>> v, adv, rho, c = vtrace(blp, lp, torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), f, f, 0.5)
    >>> v, adv, rho
    (tensor([[1.2500, 0.5000]]), tensor([[1.2500, 0.5000]]), tensor([[1.0000, 0.5000]]))
    """
    if not rho_bar > 0:
        raise ConfigError(f"rho_bar must be > 0 (the clip of the importance weights), got {rho_bar!r}; pass e.g. 1.0")
    if not 0 <= c_bar <= rho_bar:
        raise ConfigError(f"c_bar must be in [0, rho_bar={rho_bar!r}] (V-trace assumes rho_bar >= c_bar), got "
                          f"{c_bar!r}; pass c_bar <= rho_bar, e.g. both 1.0")
    if not 0 <= lambda_ <= 1:
        raise ConfigError(f"lambda_ must be in [0, 1], got {lambda_!r}; pass e.g. 1.0")
    _check_like_rewards(rewards, behaviour_log_probs=behaviour_log_probs, target_log_probs=target_log_probs,
                        values=values, next_values=next_values, terminated=terminated, done=done)
    with torch.no_grad():
        ratios = (target_log_probs - behaviour_log_probs).to(rewards.dtype).exp()
        rhos = ratios.clamp(max=rho_bar)
        cs = lambda_ * ratios.clamp(max=c_bar)
        not_term = 1.0 - _as_float(terminated, rewards)
        deltas = rhos * (rewards + gamma * not_term * next_values - values)
        decays = gamma * (1.0 - _as_float(done, rewards)) * cs
        corrections = torch.empty_like(rewards)
        a = torch.zeros_like(rewards[:, 0])
        for t in range(rewards.shape[1] - 1, -1, -1):
            a = deltas[:, t] + decays[:, t] * a
            corrections[:, t] = a
        targets = values + corrections
        # v_{s+1} exists only inside an episode and a row: elsewhere the step bootstraps from V'_s, as delta_s does
        next_targets = torch.cat([targets[:, 1:], next_values[:, -1:]], 1)
        next_targets = torch.where(done.bool(), next_values, next_targets)
        advantages = rhos * (rewards + gamma * not_term * next_targets - values)
    return targets, advantages, rhos, cs


def episode_statistics(
    rewards: torch.Tensor, done: torch.Tensor, carry_return: torch.Tensor, carry_length: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns and lengths of the episodes that end in a window of auto-reset rows, without a loop.

    Each row's steps are binned by episode (the number of ends before them); bin 0 continues the
    episode carried over from the previous window.

    Args:
        rewards: ``float [B, T]``.
        done: ``bool [B, T]``.
        carry_return: ``float [B]``, return so far of each row's unfinished episode.
        carry_length: ``int64 [B]``, its length so far.

    Returns:
        ``(return_sum, length_sum, count, carry_return, carry_length)``: the sums over the episodes
        that ended in the window (0-d tensors), how many ended, and the new carries.

    >>> s = episode_statistics(torch.ones(1, 3), torch.tensor([[False, True, False]]), torch.tensor([5.0]),
    ...                        torch.tensor([5]))
    >>> [x.tolist() for x in s]
    [7.0, 7, 1, [1.0], [1]]
    """
    B, T = rewards.shape
    d = done.long()
    episode = torch.cumsum(d, 1) - d
    bins = torch.zeros(B, T + 1, dtype=rewards.dtype, device=rewards.device)
    bins.scatter_add_(1, episode, rewards)
    bins[:, 0] += carry_return
    lengths = torch.zeros(B, T + 1, dtype=torch.int64, device=rewards.device)
    lengths.scatter_add_(1, episode, torch.ones_like(episode))
    lengths[:, 0] += carry_length
    n_done = d.sum(1, keepdim=True)
    completed = torch.arange(T + 1, device=rewards.device).unsqueeze(0) < n_done
    return (
        (bins * completed).sum(),
        (lengths * completed).sum(),
        n_done.sum(),
        bins.gather(1, n_done).squeeze(1),
        lengths.gather(1, n_done).squeeze(1),
    )


def episode_returns(trajectories: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    """Undiscounted return and length of each row of complete episodes (an episodic batcher's output).

    Returns:
        ``(returns float [B], lengths int64 [B])`` on the trajectories' device.
    """
    tt = trajectories.trajectories
    return (tt["_observation/reward"] * tt.mask()).sum(1), tt.lengths
