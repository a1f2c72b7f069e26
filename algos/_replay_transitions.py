"""How an acquisition of auto-reset envs becomes replay transitions: one-step (SAC) and n-step (DQN) windows, as the
arguments of :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps` or, flattened, of
:meth:`~rlstruct.algos.replay.ReplayBuffer.push`.
"""

from __future__ import annotations

import torch

from rlstruct.algos.returns import n_step_returns
from rlstruct.structures import TemporalDictTensor

__all__ = ["NStepWindow", "one_step_steps", "one_step_transitions", "steps_to_transitions", "window_steps",
           "window_transitions"]


def steps_to_transitions(steps: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The transitions of :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`'s arguments ``obs``, ``next_obs``,
    ``action``, ``ret``, ``last`` and ``discount``, flattened (row-major), each with its own ``obs`` and ``next_obs``:
    the arguments of :meth:`~rlstruct.algos.replay.ReplayBuffer.push` that give the same samples, ``N = B * M``.

    >>> steps = {"obs": torch.tensor([[0.0, 1.0]]), "next_obs": torch.tensor([[1.0, 9.0]]),
    ...          "action": torch.tensor([[5, 6]]), "ret": torch.ones(1, 2), "last": torch.tensor([[0, 1]]),
    ...          "discount": torch.ones(1, 2)}
    >>> t = steps_to_transitions(steps)
    >>> t["obs"].tolist(), t["next_obs"].tolist()
    ([0.0, 1.0], [1.0, 9.0])
    """
    last = steps["last"]
    B, M = last.shape
    rows = torch.arange(B, device=last.device).unsqueeze(1)
    return {
        "obs": steps["obs"][:, :M].flatten(0, 1),
        "action": steps["action"].flatten(0, 1),
        "ret": steps["ret"].flatten(),
        "next_obs": steps["next_obs"][rows, last].flatten(0, 1),  # [B, M, *obs_shape], any observation shape
        "discount": steps["discount"].flatten(),
    }


#: the trajectory keys the transitions of an acquisition are built from
_STEP_KEYS = ("observation/frame", "action/action", "_observation/reward", "_observation/done",
              "_observation/terminated", "_observation/frame")


def window_steps(window: dict[str, torch.Tensor], gamma: float, n: int) -> dict[str, torch.Tensor]:
    """The n-step transitions of a window ``[B, L, ...]`` of auto-reset envs (its ``observation/frame``,
    ``action/action`` and ``_observation/{reward, done, terminated, frame}``) as
    :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`'s
    arguments: its ``L`` steps, and the transitions starting at the first ``M = L - n + 1`` (``action``, ``ret``,
    ``last``, ``discount``, ``[B, M]``; see :func:`~rlstruct.algos.returns.n_step_returns`).
    """
    ret, last, discount = n_step_returns(window["_observation/reward"], window["_observation/done"],
                                         window["_observation/terminated"], gamma, n)
    return {"obs": window["observation/frame"], "next_obs": window["_observation/frame"],
            "done": window["_observation/done"], "action": window["action/action"][:, : ret.shape[1]], "ret": ret,
            "last": last, "discount": discount}


def window_transitions(window: dict[str, torch.Tensor], gamma: float, n: int) -> dict[str, torch.Tensor]:
    """The transitions of :func:`window_steps`, flattened (:meth:`~rlstruct.algos.replay.ReplayBuffer.push`'s arguments,
    ``N = B * (L - n + 1)``)."""
    return steps_to_transitions(window_steps(window, gamma, n))


def one_step_steps(trajectories: TemporalDictTensor, gamma: float) -> dict[str, torch.Tensor]:
    """The one-step transitions of an acquisition of auto-reset envs (``[B, T, ...]``, every row full):
    :func:`window_steps` with ``n = 1``, whose ``discount`` is ``gamma``, or 0 where the episode terminated."""
    return window_steps(trajectories, gamma, 1)


def one_step_transitions(trajectories: TemporalDictTensor, gamma: float) -> dict[str, torch.Tensor]:
    """The transitions of :func:`one_step_steps`, flattened (:meth:`~rlstruct.algos.replay.ReplayBuffer.push`'s
    arguments, ``N = B * T``)."""
    return steps_to_transitions(one_step_steps(trajectories, gamma))


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
            window = {k: trajectories[k] for k in _STEP_KEYS}
        else:
            window = {k: torch.cat([self.carry[k], trajectories[k]], 1) for k in _STEP_KEYS}
        out: dict[str, torch.Tensor | int] = {**window_steps(window, self.gamma, self.n)}
        out["carried"] = 0 if self.carry is None else self.n - 1
        M = window["_observation/reward"].shape[1] - self.n + 1
        self.carry = {k: v[:, M:] for k, v in window.items()}
        return out
