"""The compiled CPU auto-reset step of the MinAtar games (numba): one call steps every env of a batch.

:func:`autoreset` is :func:`~rlstruct.envs.minatar._env.autoreset_step` env by env: the sticky-action and game
draws of :func:`~rlstruct.envs._rng.step_uniforms`, the game's step, the time limit, the restart of a finished env
with the reset draws of :func:`~rlstruct.envs._rng.uniform_draws`, and both frames. The game's functions over one
env's row (``STATE_KEYS``, ``reset``, ``step``, ``observe``) are its ``rules`` module's compiled by
:func:`._scalar.kernels`: each game has its own copy of the loop, whose globals are its functions, so that numba
compiles (and caches) one loop per game with those functions inlined. Imported through
:func:`rlstruct.envs._jit.jit_module` only.
"""

from __future__ import annotations

import hashlib
import importlib
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rlstruct.envs import _jit_kernels, _rng
from rlstruct.envs._jit_kernels import _draw, autoreset_flags, counter, jit, mix32
from rlstruct.envs.minatar import _scalar

__all__ = ["CompiledStep", "autoreset", "game_module"]

_jit = jit
_MASK32 = _rng.MASK32
_STEP_SALT = _rng.STEP_SALT
_STEP_STRIDE = _rng.STEP_STRIDE
_DRAW_STRIDE = _rng.DRAW_STRIDE
_TWO_POW_M32 = _rng.TWO_POW_M32
_LOOPS: dict[str, Callable] = {}  # minatar name -> its compiled loop


def game_module(minatar_name: str) -> types.SimpleNamespace:
    """The functions of the game ``minatar_name`` (``"breakout"``) for one env at a time: its ``rules`` module
    compiled by :func:`._scalar.kernels`."""
    return _scalar.kernels(importlib.import_module(f"rlstruct.envs.minatar._{minatar_name}.rules"))


def _reset(s, i, u, ramping):
    """The game's ``reset``: bound, in each game's copy of :func:`_autoreset`, to :func:`game_module`'s."""
    raise NotImplementedError("a game's loop calls its own reset")


def _step(s, i, action, u, ramping):
    """The game's ``step`` (likewise)."""
    raise NotImplementedError("a game's loop calls its own step")


def _observe(s, i, frame):
    """The game's ``observe`` (likewise)."""
    raise NotImplementedError("a game's loop calls its own observe")


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


def _autoreset(
    g, elapsed, episode, key, last_action, sticky_action, action_set, action, sticky_prob, ramping, limit,
    n_step_draws, salt, scale, offset,
    frame, reward, done, terminated, truncated, initial, last,
    frame_r, reward_r, done_r, terminated_r, truncated_r, initial_r, last_r,
):  # fmt: skip
    """The auto-reset step of every env, in place on the state (the loop of :func:`autoreset`, whose copy for a game
    calls that game's functions).

    Args:
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
        r, ended = _step(g, i, played, u, ramping)
        steps = elapsed[i] + 1
        _observe(g, i, frame[i])
        reward[i] = r
        last[i] = a
        if autoreset_flags(i, ended, steps >= limit, done, terminated, truncated, initial,
                           done_r, terminated_r, truncated_r, initial_r):
            e = episode[i] + 1
            for d in range(u_reset.shape[0]):
                u_reset[d] = _draw(key[i], e, salt[d], scale[d], offset[d])
            _reset(g, i, u_reset, ramping)
            _observe(g, i, frame_r[i])
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


def autoreset(minatar_name: str) -> Callable:
    """The compiled auto-reset step of the game ``minatar_name`` (:func:`_autoreset` calling the functions of
    :func:`game_module`, which numba inlines), compiled once per process (and cached on disk).

    Each game's loop is a copy of :func:`_autoreset` whose globals name the game's functions, under a name that holds
    a digest of the sources compiled into it besides this module (the game's rules and the scalar operations; the
    RNG): numba checks a cached function against its own file only, so an edit of those sources
    compiles a new one.
    """
    loop = _LOOPS.get(minatar_name)
    if loop is None:
        module = game_module(minatar_name)
        digest = hashlib.sha1()
        for path in (*module.sources, Path(_rng.__file__), Path(_jit_kernels.__file__)):
            digest.update(path.read_bytes())
        scope = {**_autoreset.__globals__, "_reset": module.reset, "_step": module.step, "_observe": module.observe}
        fn = types.FunctionType(_autoreset.__code__, scope, "autoreset")
        fn.__qualname__ = f"autoreset_{minatar_name}_{digest.hexdigest()[:16]}"
        fn.__doc__ = _autoreset.__doc__
        loop = _LOOPS[minatar_name] = _jit(fn)
    return loop


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
        self.loop = autoreset(env.game.name)
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
        self.loop(
            *self._arrays(state), self.action_set, action, *self.settings, self.n_step_draws, *self.table,
            *(nxt[k] for k in _OBSERVATION), *(run[k] for k in _OBSERVATION),
        )  # fmt: skip
