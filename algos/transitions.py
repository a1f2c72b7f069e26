"""The transitions an acquisition of auto-reset envs gives a replay buffer: one-step (SAC) and n-step (DQN).

Each comes as the acquisition's steps and the transitions over them (each observation stored once: the arguments
of :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`), or flattened
(:meth:`~rlstruct.algos.replay.ReplayBuffer.push`'s).
Targets bootstrap through time limits and not through terminations: a transition's next observation is
``_observation/frame`` (the observation a step reached before any auto-reset), and its discount is 0 where the
episode terminated. n-step returns are cut at episode ends; :class:`NStepWindow` carries the last ``n - 1`` steps of
an acquisition into the next, where they complete their returns.
"""

from __future__ import annotations

import torch

from rlstruct.algos.replay import steps_to_transitions
from rlstruct.structures import TemporalDictTensor

__all__ = ["one_step_steps", "one_step_transitions", "n_step_returns", "window_steps", "window_transitions",
           "NStepWindow"]


def one_step_steps(trajectories: TemporalDictTensor, gamma: float) -> dict[str, torch.Tensor]:
    """The one-step transitions of an acquisition of auto-reset envs (every row full), as the steps and the
    transitions over them (:meth:`ReplayBuffer.push_steps`'s arguments: each observation is stored once).

    A transition's next observation is ``_observation/frame``, the observation the step reached *before* any
    auto-reset (at a time limit, the truncated episode's last observation), and ``discount`` is ``gamma``, or 0
    where the episode terminated: targets bootstrap through truncations and not through terminations.

    Args:
        trajectories: ``[B, T, ...]`` with ``observation/frame``, ``action/action``, ``_observation/reward``,
            ``_observation/done``, ``_observation/terminated`` and ``_observation/frame``.
        gamma: discount factor.

    Returns:
        ``obs [B, T, obs_dim]``, ``next_obs [B, T, obs_dim]``, ``done [B, T]``, ``action [B, T, action_dim]``,
        ``ret [B, T]``, ``last [B, T]`` (``last[b, t] = t``) and ``discount [B, T]``.
    """
    tt = trajectories
    reward = tt["_observation/reward"]
    discount = gamma * (~tt["_observation/terminated"].bool()).to(reward.dtype)
    B, T = reward.shape
    last = torch.arange(T, device=reward.device).expand(B, T)
    return {"obs": tt["observation/frame"], "next_obs": tt["_observation/frame"], "done": tt["_observation/done"],
            "action": tt["action/action"], "ret": reward, "last": last, "discount": discount}


def one_step_transitions(trajectories: TemporalDictTensor, gamma: float) -> dict[str, torch.Tensor]:
    """The transitions of :func:`one_step_steps`, flattened, each with its own ``obs`` and ``next_obs``.

    Returns:
        ``obs [N, obs_dim]``, ``action [N, action_dim]``, ``ret [N]``, ``next_obs [N, obs_dim]``,
        ``discount [N]`` with ``N = B * T``: :meth:`ReplayBuffer.push`'s arguments.
    """
    return steps_to_transitions(one_step_steps(trajectories, gamma))


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
    discounts = torch.pow(torch.tensor(gamma, dtype=rewards.dtype, device=dev), steps) * (~term_end)
    return returns, base + steps - 1, discounts


def window_steps(window: dict[str, torch.Tensor], gamma: float, n: int) -> dict[str, torch.Tensor]:
    """The n-step transitions of a window of consecutive steps of ``B`` auto-reset envs, as steps and the
    transitions over them (:meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`'s arguments).

    Args:
        window: ``[B, L, ...]`` tensors ``observation/frame``, ``action/action``, ``_observation/reward``,
            ``_observation/done``, ``_observation/terminated`` and ``_observation/frame``.
        gamma: discount factor.
        n: steps per return.

    Returns:
        The steps ``obs [B, L, *obs_shape]``, ``next_obs [B, L, *obs_shape]``, ``done bool [B, L]``, and the
        transitions starting at the first ``M = L - n + 1`` steps: ``action [B, M]``, ``ret [B, M]``,
        ``last int64 [B, M]`` (the step each ends at) and ``discount [B, M]`` (see :func:`n_step_returns`).
    """
    ret, last, discount = n_step_returns(window["_observation/reward"], window["_observation/done"],
                                         window["_observation/terminated"], gamma, n)
    return {"obs": window["observation/frame"], "next_obs": window["_observation/frame"],
            "done": window["_observation/done"], "action": window["action/action"][:, : ret.shape[1]], "ret": ret,
            "last": last, "discount": discount}


def window_transitions(window: dict[str, torch.Tensor], gamma: float, n: int) -> dict[str, torch.Tensor]:
    """The n-step transitions of a window of consecutive steps of ``B`` auto-reset envs, flattened (the arguments
    are :func:`window_steps`'s).

    Returns:
        ``obs [N, *obs_shape]``, ``action [N]``, ``ret [N]``, ``next_obs [N, *obs_shape]``, ``discount [N]`` with
        ``N = B * (L - n + 1)``: the transitions starting at the first ``L - n + 1`` steps.
    """
    return steps_to_transitions(window_steps(window, gamma, n))


class NStepWindow:
    """Turns consecutive acquisitions of auto-reset envs into n-step transitions.

    The batcher carries every env across ``execute`` calls, so the steps of one row are consecutive from
    one acquisition to the next: the last ``n - 1`` steps of a window are kept and put in front of the
    next acquisition, where they complete their n-step returns. After ``k`` acquisitions of ``T`` steps,
    ``B * (k * T - n + 1)`` transitions have come out, the same as from one window of ``k * T`` steps.

    Args:
        gamma: discount factor.
        n: steps per return (at most the steps of the first acquisition).
    """

    KEYS = ("observation/frame", "action/action", "_observation/reward", "_observation/done",
            "_observation/terminated", "_observation/frame")

    def __init__(self, gamma: float, n: int):
        self.gamma = gamma
        self.n = n
        self.carry: dict[str, torch.Tensor] | None = None

    def __call__(self, trajectories: TemporalDictTensor) -> dict[str, torch.Tensor]:
        """The transitions completed by this acquisition (``[B, T, ...]``, every row full), flattened."""
        return steps_to_transitions(self.steps(trajectories))

    def steps(self, trajectories: TemporalDictTensor) -> dict[str, torch.Tensor | int]:
        """The transitions completed by this acquisition as :func:`window_steps` gives them, with ``carried``: the
        steps of the window that the previous one held (:meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`'s
        arguments)."""
        if self.carry is None:
            window = {k: trajectories[k] for k in self.KEYS}
        else:
            window = {k: torch.cat([self.carry[k], trajectories[k]], 1) for k in self.KEYS}
        out: dict[str, torch.Tensor | int] = {**window_steps(window, self.gamma, self.n)}
        out["carried"] = 0 if self.carry is None else self.n - 1
        M = window["_observation/reward"].shape[1] - self.n + 1
        self.carry = {k: v[:, M:] for k, v in window.items()}
        return out
