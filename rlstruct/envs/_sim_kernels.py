"""The step kernels of the torch simulators: pure functions ``(state, action) -> (state, outputs)`` over one
:class:`SimState`, touching nothing else (gymnax's split). ``system`` (the simulator) is read for its constants and
pure hooks only. :func:`restart` starts every env's next episode; the auto-reset kernels are
:func:`autoreset_dense`/:func:`autoreset_sparse` (torch: fresh draws for every env, or for the finished ones),
:func:`autoreset_numpy` and the compiled :func:`autoreset_jit`; the episodic ones :func:`episodic`,
:func:`episodic_numpy` and :func:`episodic_jit`. On the host the state's ``rng_key`` is ``uint32``.

>>> from rlstruct.envs import CartPole
>>> env = CartPole(3, seed=0, autoreset=True)
>>> _ = env.reset()
>>> state = SimState(**env.graph_state())
>>> nxt, out = autoreset_dense(env, state, torch.ones(3, dtype=torch.int64))
>>> nxt.elapsed_steps.tolist(), out.frame.shape
([1, 1, 1], torch.Size([3, 4]))
>>> env.graph_state()["elapsed_steps"].tolist()  # a kernel changes nothing it is given
[0, 0, 0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from rlstruct.envs._array_ops import NumpyOps, TorchOps

__all__ = [
    "SimState", "CompiledKernels", "AutoresetOutputs", "EpisodicOutputs", "restart", "advance", "autoreset_dense",
    "autoreset_sparse", "autoreset_numpy", "autoreset_jit", "autoreset_jit_into", "episodic", "episodic_numpy",
    "episodic_jit",
]  # fmt: skip


class SimState(NamedTuple):
    """The state of ``B`` envs of one simulator: every tensor a step reads and replaces (one column or row per env).

    Attributes:
        physics: ``float64 [P, B]`` (or float32), one contiguous row per state variable (structure of arrays:
            every elementwise kernel reads contiguous memory).
        elapsed_steps: ``int64 [B]``, steps taken in the current episode (gymnasium's ``TimeLimit`` counter).
        episode: ``int64 [B]``, index of the env's current episode (0 after the first ``reset``).
        rng_key: ``int64 [B]`` in ``[0, 2**32)`` (``uint32`` in host kernels): with ``episode``, the RNG state.
        last_action: ``int64 [B]`` (discrete actions) or ``float32 [B, *action_shape]``.
    """

    physics: Any
    elapsed_steps: Any
    episode: Any
    rng_key: Any
    last_action: Any


class CompiledKernels(NamedTuple):
    """A simulator's compiled CPU kernels (:mod:`rlstruct.envs._jit_kernels`) and the constant arrays they read.

    Attributes:
        autoreset: the compiled auto-reset step.
        episodic: the compiled episodic step.
        constants: ``float64 [C]``, the simulator's constants in the kernels' order.
        draws: the reset draws' salt, scale and offset, flat (:func:`~rlstruct.envs._rng.draw_table`).
    """

    autoreset: Callable
    episodic: Callable
    constants: np.ndarray
    draws: tuple[np.ndarray, np.ndarray, np.ndarray]


class AutoresetOutputs(NamedTuple):
    """What an auto-reset step returns besides the next state.

    ``frame``, ``reward``, ``done``, ``terminated``, ``truncated`` (``[B]``, ``frame`` ``float32 [B, obs_dim]``):
    the observation each env reached. ``frame_r``, ``reward_r``, ``initial_r``: the one the envs act on next (a
    finished env's fresh reset observation; its ``last_action`` is the next state's). ``false``: four all-false
    ``bool [B]`` when the kernel made them (the other flags of both observations), else ``None``.
    """

    frame: Any
    reward: Any
    done: Any
    terminated: Any
    truncated: Any
    frame_r: Any
    reward_r: Any
    initial_r: Any
    false: tuple | None = None


class EpisodicOutputs(NamedTuple):
    """What an episodic step returns besides the next state: the observation each env reached (``[B]`` rows)."""

    frame: Any
    reward: Any
    done: Any
    terminated: Any
    truncated: Any


def _restarted(
    state: SimState, out: AutoresetOutputs, physics: torch.Tensor, frame_r: torch.Tensor
) -> tuple[SimState, AutoresetOutputs]:
    """``state`` and ``out`` with the finished envs' physics and frames replaced by their fresh ones.

    Built field by field rather than with ``NamedTuple._replace``, which ``torch.compile`` cannot trace in every
    torch 2.x release.
    """
    return (
        SimState(physics, state.elapsed_steps, state.episode, state.rng_key, state.last_action),
        AutoresetOutputs(out.frame, out.reward, out.done, out.terminated, out.truncated, frame_r, out.reward_r,
                         out.initial_r, out.false),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- torch
def restart(system: Any, state: SimState) -> tuple[SimState, torch.Tensor]:
    """Every env's next episode: ``(state, frame)``, the fresh state and its observation ``float32 [B, obs_dim]``.

    The draws depend on ``(rng_key, episode + 1)`` only, so each call starts new episodes (gymnasium's ``reset()``
    without a seed) and the same state restarts the same way.
    """
    episode = state.episode + 1
    physics = system._initial_physics(TorchOps, system._draws(TorchOps, state.rng_key, episode))
    zeros = torch.zeros_like
    fresh = SimState(physics, zeros(state.elapsed_steps), episode, state.rng_key, zeros(state.last_action))
    return fresh, system._frame(TorchOps, physics)


def advance(system: Any, state: SimState, action: torch.Tensor) -> tuple[SimState, AutoresetOutputs]:
    """Everything of an auto-reset step but the fresh initial states: pure, branch-free, fusable.

    The returned physics and ``frame_r`` are still the terminal ones where an episode ended; the auto-reset kernels
    put the fresh states there (and the episode counter already moved on).
    """
    phys_n, reward, terminated = system._transition(TorchOps, state.physics, action)
    elapsed_n = state.elapsed_steps + 1
    truncated = elapsed_n >= system._limit
    done = terminated | truncated
    keep = ~done
    frame = system._frame(TorchOps, phys_n)
    last_r = action * keep if system._discrete else action.masked_fill(done.view(-1, 1), 0.0)
    return (
        SimState(phys_n, elapsed_n * keep, state.episode + done, state.rng_key, last_r),
        AutoresetOutputs(frame, reward, done, terminated, truncated, frame, reward.masked_fill(done, 0.0),
                         done.clone()),
    )  # fmt: skip


def autoreset_dense(
    system: Any, state: SimState, action: torch.Tensor, advance: Any = advance
) -> tuple[SimState, AutoresetOutputs]:
    """The auto-reset step with fresh draws for every env, kept where an episode ended (no host sync)."""
    nxt, out = advance(system, state, action)
    fresh = system._initial_physics(TorchOps, system._draws(TorchOps, nxt.rng_key, nxt.episode))
    physics = torch.where(out.done, fresh, nxt.physics)
    return _restarted(nxt, out, physics, system._frame(TorchOps, physics))


def autoreset_sparse(
    system: Any, state: SimState, action: torch.Tensor, advance: Any = advance
) -> tuple[SimState, AutoresetOutputs]:
    """The auto-reset step with fresh draws for the finished envs only (one host sync: their number).

    ``advance(system, state, action)`` computes the rest (:func:`advance`, or a fused version of it).
    """
    nxt, out = advance(system, state, action)
    rows = torch.nonzero(out.done).squeeze(1)
    draws = system._draws(TorchOps, nxt.rng_key.index_select(0, rows), nxt.episode.index_select(0, rows))
    fresh = system._initial_physics(TorchOps, draws)
    # The terminal states are not handed out (the frame is a copy): the fresh ones can go in place.
    physics = nxt.physics.index_copy_(1, rows, fresh)
    return _restarted(nxt, out, physics, out.frame.index_copy(0, rows, system._frame(TorchOps, fresh)))


def episodic(system: Any, state: SimState, action: Any, xp: type = TorchOps) -> tuple[SimState, EpisodicOutputs]:
    """One step of the given envs, no restart: torch tensors, or numpy arrays with ``xp=NumpyOps``."""
    phys_n, reward, terminated = system._transition(xp, state.physics, action)
    elapsed_n = state.elapsed_steps + 1
    truncated = elapsed_n >= system._limit
    done = terminated | truncated
    return (
        SimState(phys_n, elapsed_n, state.episode, state.rng_key, action),
        EpisodicOutputs(system._frame(xp, phys_n), reward, done, terminated, truncated),
    )


# ------------------------------------------------------------------------------------------- host
def autoreset_numpy(system: Any, state: SimState, action: np.ndarray) -> tuple[SimState, AutoresetOutputs]:
    """The CPU auto-reset step on numpy arrays: :func:`autoreset_sparse`'s bits.

    Up to ``10**4`` envs a step costs its number of calls, not its arithmetic, so the fresh states are written in
    place into arrays of this step that no caller has seen yet.
    """
    xp = NumpyOps
    phys_n, reward, terminated = system._transition(xp, state.physics, action)
    elapsed_n = state.elapsed_steps + 1
    truncated = elapsed_n >= system._limit
    done = terminated | truncated
    frame = system._frame(xp, phys_n)
    rows = done.nonzero()[0]
    episode_r = state.episode + done
    fresh = system._initial_physics(xp, system._draws(xp, state.rng_key[rows], episode_r[rows]))
    phys_n[:, rows] = fresh
    elapsed_n[rows] = 0
    frame_r = frame.copy()
    frame_r[rows] = system._frame(xp, fresh)
    reward_r = reward.copy()
    reward_r[rows] = 0.0
    last_r = action.copy()
    last_r[rows] = 0
    t = torch.from_numpy
    return (
        SimState(phys_n, elapsed_n, episode_r, state.rng_key, last_r),
        AutoresetOutputs(t(frame), t(reward), t(done), t(terminated), t(truncated), t(frame_r), t(reward_r),
                         t(done.copy()), t(np.zeros((4, done.shape[0]), dtype=np.bool_)).unbind(0)),
    )  # fmt: skip


def episodic_numpy(system: Any, state: SimState, action: np.ndarray) -> tuple[SimState, EpisodicOutputs]:
    """:func:`episodic` on numpy arrays (the same code, ``xp=NumpyOps``)."""
    nxt, out = episodic(system, state, action, NumpyOps)
    t = torch.from_numpy
    return nxt, EpisodicOutputs(t(out.frame), t(out.reward), t(out.done), t(out.terminated), t(out.truncated))


def autoreset_jit_into(
    system: Any, compiled: CompiledKernels, state: SimState, action: np.ndarray, *outputs: np.ndarray
) -> SimState:
    """The CPU auto-reset step in one compiled call (:mod:`rlstruct.envs._jit_kernels`), writing the outputs into
    ``outputs`` (in the compiled kernel's order: frame, frame_r, reward, reward_r, done, terminated, truncated,
    initial_r, the initial_state of the reached observation, done_r, terminated_r, truncated_r, last_r); returns the
    next state (its ``last_action`` is ``last_r``)."""
    phys, elapsed, episode = state.physics, state.elapsed_steps, state.episode
    phys_r, elapsed_r, episode_r = np.empty_like(phys), np.empty_like(elapsed), np.empty_like(episode)
    compiled.autoreset(
        phys, elapsed, episode, state.rng_key, action, *system._jit_inputs(phys), compiled.constants,
        system._limit, *compiled.draws, phys_r, elapsed_r, episode_r, *outputs,
    )  # fmt: skip
    return SimState(phys_r, elapsed_r, episode_r, state.rng_key, outputs[-1])


def autoreset_jit(
    system: Any, compiled: CompiledKernels, state: SimState, action: np.ndarray
) -> tuple[SimState, AutoresetOutputs]:
    """:func:`autoreset_jit_into` into arrays allocated here: :func:`autoreset_numpy`'s bits in one call."""
    n = action.shape[0]
    frame = np.empty((n,) + system.observation_space.shape, dtype=np.float32)
    frame_r = np.empty_like(frame)
    reward, reward_r = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    flags = np.empty((8, n), dtype=np.bool_)
    nxt = autoreset_jit_into(
        system, compiled, state, action, frame, frame_r, reward, reward_r, *flags, np.empty_like(action)
    )
    t = torch.from_numpy
    f = t(flags).unbind(0)
    return nxt, AutoresetOutputs(t(frame), t(reward), f[0], f[1], f[2], t(frame_r), t(reward_r), f[3], f[4:])


def episodic_jit(
    system: Any, compiled: CompiledKernels, state: SimState, action: np.ndarray
) -> tuple[SimState, EpisodicOutputs]:
    """:func:`episodic` on numpy arrays in one compiled call."""
    phys, elapsed = state.physics, state.elapsed_steps
    n = action.shape[0]
    phys_n, elapsed_n = np.empty_like(phys), np.empty_like(elapsed)
    frame = np.empty((n,) + system.observation_space.shape, dtype=np.float32)
    reward = np.empty(n, dtype=np.float32)
    flags = np.empty((3, n), dtype=np.bool_)
    compiled.episodic(
        phys, elapsed, action, *system._jit_inputs(phys), compiled.constants, system._limit,
        phys_n, elapsed_n, frame, reward, flags,
    )  # fmt: skip
    t = torch.from_numpy
    done, terminated, truncated = t(flags).unbind(0)
    return (
        SimState(phys_n, elapsed_n, state.episode, state.rng_key, action),
        EpisodicOutputs(t(frame), t(reward), done, terminated, truncated),
    )
