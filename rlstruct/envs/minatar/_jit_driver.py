"""The compiled CPU auto-reset step of the MinAtar games (numba): one call steps every env of a batch.

:func:`autoreset` is :func:`~rlstruct.envs.minatar._env.autoreset_step` env by env: the sticky-action and game
draws of :func:`~rlstruct.envs._rng.step_uniforms`, the game's step, the time limit, the restart of a finished env
with the reset draws of :func:`~rlstruct.envs._rng.uniform_draws`, and both frames. The game's rules come from its
kernel module ``_jit_<minatar name>`` (``STATE_KEYS``, ``reset``, ``step``, ``observe`` over one env's row), reached
through the type of an argument that names the game (:func:`game_tag`), so that numba compiles (and caches) one loop
per game with its functions inlined. Imported through :func:`rlstruct.envs._jit.jit_module` only.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType

import numba
import numpy as np
import torch
from numba.extending import overload

from rlstruct.envs import _jit_kernels, _rng
from rlstruct.envs._jit_kernels import _draw, counter, mix32

__all__ = ["CompiledStep", "autoreset", "game_module", "game_tag"]

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)
_MASK32 = _rng.MASK32
_STEP_SALT = _rng.STEP_SALT
_STEP_STRIDE = _rng.STEP_STRIDE
_DRAW_STRIDE = _rng.DRAW_STRIDE
_TWO_POW_M32 = _rng.TWO_POW_M32


def game_module(minatar_name: str) -> ModuleType:
    """The kernel module of the game ``minatar_name`` (``"breakout"``)."""
    return importlib.import_module(f"rlstruct.envs.minatar._jit_{minatar_name}")


def game_tag(minatar_name: str) -> np.ndarray:
    """The argument of :func:`autoreset` that selects the game ``minatar_name``: an empty array whose record dtype's
    one field is named ``<minatar name>@<digest>``, the digest of the sources compiled into the game's loop besides
    this module's (the game's kernels, the RNG).

    A type, not a string literal: a call then dispatches as any other (a literal is retyped at every call). numba
    checks a cached loop against this file only; with the digest in the loop's signature, an edit of those sources
    compiles a new one.
    """
    digest = hashlib.sha1()
    for module in (game_module(minatar_name), _rng, _jit_kernels):
        digest.update(Path(module.__file__).read_bytes())
    return np.empty(0, dtype=[(f"{minatar_name}@{digest.hexdigest()[:16]}", np.int8)])


def _game_reset(game, s, i, u, ramping):
    """``reset`` of the game of ``game`` (:func:`game_tag`'s), in compiled code."""
    raise NotImplementedError("compiled code only")


def _game_step(game, s, i, action, u, ramping):
    """``step`` of the game of ``game``, in compiled code."""
    raise NotImplementedError("compiled code only")


def _game_observe(game, s, i, frame):
    """``observe`` of the game of ``game``, in compiled code."""
    raise NotImplementedError("compiled code only")


def _function_of(game, name: str):
    (key,) = game.dtype.fields
    return getattr(game_module(key.split("@")[0]), name)


@overload(_game_reset, inline="always")
def _overload_reset(game, s, i, u, ramping):
    target = _function_of(game, "reset")
    return lambda game, s, i, u, ramping: target(s, i, u, ramping)


@overload(_game_step, inline="always")
def _overload_step(game, s, i, action, u, ramping):
    target = _function_of(game, "step")
    return lambda game, s, i, action, u, ramping: target(s, i, action, u, ramping)


@overload(_game_observe, inline="always")
def _overload_observe(game, s, i, frame):
    target = _function_of(game, "observe")
    return lambda game, s, i, frame: target(s, i, frame)


@_jit
def _step_stream(key, episode, step):
    """``s`` of :func:`._rng.step_uniforms` for one env: the hash of step ``step`` of episode ``episode``."""
    stream = mix32(counter(key, episode, _STEP_SALT))
    return mix32((stream + (step & _MASK32) * _STEP_STRIDE) & _MASK32)


@_jit
def _step_draw(s, d):
    """Draw ``d`` of :func:`._rng.step_uniforms` from the step's hash ``s``."""
    h = mix32((s + (d * _DRAW_STRIDE & _MASK32)) & _MASK32)
    return (np.float64(h) + 0.5) * _TWO_POW_M32


@_jit
def autoreset(
    game, g, elapsed, episode, key, last_action, sticky_action, action_set, action, sticky_prob, ramping, limit,
    n_step_draws, salt, scale, offset,
    frame, reward, done, terminated, truncated, initial, last,
    frame_r, reward_r, done_r, terminated_r, truncated_r, initial_r, last_r,
):  # fmt: skip
    """The auto-reset step of every env, in place on the state.

    Args:
        game: :func:`game_tag`'s array (its type selects the game's functions, compiled into the loop).
        g: the game's state arrays ``[B, ...]`` in its ``STATE_KEYS`` order, and ``elapsed``, ``episode``, ``key``,
            ``last_action`` (minimal set), ``sticky_action`` (full set): ``int64 [B]``, the env's own; all become
            the state after the step and the restarts.
        action_set: ``int64 [A]``, the minimal set's full-set actions. action: ``int64 [B]`` in ``[0, A)``.
        sticky_prob, ramping, limit: the env's settings (``limit``: the truncation horizon).
        n_step_draws: the game's draws per step. salt, scale, offset: ``float64 [D]`` (``salt`` ``int64``), the
            reset draws' table (:func:`._rng.draw_table`, ``D`` the game's reset draws).
        frame, reward, done, terminated, truncated, initial, last: written, the step's observation (``frame``
            ``bool [B, 10, 10, C]``, ``reward`` ``float32``, the flags ``bool``, ``last`` ``int64``).
        frame_r ... last_r: written, the observation the envs act on next.
    """
    u = np.empty(n_step_draws)
    u_reset = np.empty(salt.shape[0])
    # The frames as rows of bytes: a row copy over them is a tight loop (a copy between [10, 10, C] views is not).
    n_envs, size = frame.shape[0], frame.shape[1] * frame.shape[2] * frame.shape[3]
    flat, flat_r = frame.reshape((n_envs, size)), frame_r.reshape((n_envs, size))
    for i in range(action.shape[0]):
        a = action[i]
        s = _step_stream(key[i], episode[i], elapsed[i])
        # minatar's Environment.act: with probability sticky_prob the previous action is repeated.
        played = sticky_action[i] if _step_draw(s, 0) < sticky_prob else action_set[a]
        for d in range(n_step_draws):
            u[d] = _step_draw(s, d + 1)
        r, ended = _game_step(game, g, i, played, u, ramping)
        steps = elapsed[i] + 1
        cut = steps >= limit
        finished = ended or cut
        _game_observe(game, g, i, frame[i])
        reward[i] = r
        done[i] = finished
        terminated[i] = ended
        truncated[i] = cut
        initial[i] = False
        last[i] = a
        done_r[i] = False
        terminated_r[i] = False
        truncated_r[i] = False
        initial_r[i] = finished
        if finished:
            e = episode[i] + 1
            for d in range(u_reset.shape[0]):
                u_reset[d] = _draw(key[i], e, salt[d], scale[d], offset[d])
            _game_reset(game, g, i, u_reset, ramping)
            _game_observe(game, g, i, frame_r[i])
            episode[i] = e
            elapsed[i] = 0
            last_action[i] = 0
            sticky_action[i] = 0
            reward_r[i] = 0.0
            last_r[i] = 0
        else:
            for j in range(size):
                flat_r[i, j] = flat[i, j]
            elapsed[i] = steps
            last_action[i] = a
            sticky_action[i] = played
            reward_r[i] = r
            last_r[i] = a


_OBSERVATION = ("frame", "reward", "done", "terminated", "truncated", "initial_state", "last_action")
_ENV_KEYS = ("elapsed_steps", "episode", "rng_key", "last_action", "sticky_action")


class CompiledStep:
    """A :class:`~rlstruct.envs.minatar.MinAtarEnv`'s compiled auto-reset step: the game's kernels, the env's
    settings, and the numpy views of the state it writes in place.

    Args:
        env: the env (its game, settings, action set and reset table: CPU tensors).
        game_keys: the env's state keys of the game's ``STATE_KEYS``, in that order.
    """

    def __init__(self, env, game_keys: tuple[str, ...]):
        self.game = game_tag(env.game.name)
        self.keys = tuple(game_keys)
        self.action_set = env._action_set.numpy()
        table = env._reset_table
        self.table = tuple(t.reshape(-1).numpy() for t in (table.draw_salt, table.draw_scale, table.draw_offset))
        self.settings = (float(env.sticky_action_prob), bool(env.ramping), int(env._limit))
        self.n_step_draws = int(env.game.n_step_draws)
        self._views: tuple[dict[str, torch.Tensor], tuple] | None = None

    def _arrays(self, state: dict[str, torch.Tensor]) -> tuple:
        views = self._views
        if views is None or views[0] is not state:
            arrays = (tuple(state[k].numpy() for k in self.keys),) + tuple(state[k].numpy() for k in _ENV_KEYS)
            views = self._views = (state, arrays)
        return views[1]

    def __call__(self, state: dict[str, torch.Tensor], action: np.ndarray, nxt: dict[str, np.ndarray],
                 run: dict[str, np.ndarray]) -> None:
        """Steps ``state`` (the env's own contiguous CPU tensors, changed in place) with the minimal-set actions
        ``action`` (``int64 [B]``), writing the two observations into the arrays ``nxt`` and ``run`` (keys
        ``frame``, ``reward``, ``done``, ``terminated``, ``truncated``, ``initial_state``, ``last_action``)."""
        autoreset(
            self.game, *self._arrays(state), self.action_set, action, *self.settings, self.n_step_draws, *self.table,
            *(nxt[k] for k in _OBSERVATION), *(run[k] for k in _OBSERVATION),
        )  # fmt: skip
