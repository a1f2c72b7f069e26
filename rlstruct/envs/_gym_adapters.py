"""What :class:`~rlstruct.envs.GymEnv` steps: a list of ``gymnasium.Env`` or one gymnasium ``VectorEnv``, each behind
the same numpy-level calls (reset with seeds and options, step the running envs, step into given arrays)."""

from __future__ import annotations

import abc
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlstruct.envs._actions import ActionSpec
from rlstruct.envs._gym_arrays import (
    Field,
    fill,
    mark_restarted,
    observation_fields,
    split,
    stack,
    with_rows,
    write_flags,
)
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor

__all__ = ["GymAdapter", "ListAdapter", "VectorAdapter", "autoreset_mode", "resets_a_subset", "is_vector_env"]

# (observation_next fields, reward, terminated, truncated, done, observation_running fields or None): numpy arrays of
# the running envs' rows; the running fields are None when they are observation_next's (no env restarted).
Stepped = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray] | None]


class GymAdapter(abc.ABC):
    """``n`` gymnasium envs behind numpy calls: their spaces, observation fields and action check.

    Args:
        n: the number of envs.
        observation_space: the single-env observation space.
        action_space: the single-env action space.
        autoreset: whether finished envs are reset inside ``step``.

    Raises:
        SpaceError: an unsupported space.
    """

    def __init__(self, n: int, observation_space: gym.Space, action_space: gym.Space, autoreset: bool):
        self.n = n
        self.observation_space = observation_space
        self.action_space = action_space
        self.autoreset = autoreset
        self.fields: list[Field] = observation_fields(observation_space)
        self.action = ActionSpec(action_space)

    def check_options(self, env_info: DictTensor) -> None:
        """Refuses the rows of a ``reset``'s ``env_info`` that these envs cannot take as options."""

    @abc.abstractmethod
    def reset(self, seeds: list[int] | None, options: list[dict[str, Any] | None]) -> dict[str, np.ndarray]:
        """Resets every env (env ``k`` with ``seeds[k]`` and ``options[k]``; ``seeds=None``: no seed); returns one
        ``[n, ...]`` array per field."""

    @abc.abstractmethod
    def step(self, a_np: np.ndarray, running: np.ndarray) -> Stepped:
        """Steps the envs ``running`` (int ``[B]``, ascending) with ``a_np`` (``[B, ...]``); with ``autoreset``,
        also resets those that finished."""

    @abc.abstractmethod
    def step_into(self, a_np: np.ndarray, nxt: dict[str, np.ndarray], run: dict[str, np.ndarray]) -> None:
        """An auto-reset step of every env, written into the arrays of both observations."""

    @abc.abstractmethod
    def close(self) -> None:
        """Closes the envs."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What the envs are, for a repr."""


def _step_one(env: gym.Env, action: Any) -> tuple:
    return env.step(action)


class ListAdapter(GymAdapter):
    """A list of ``gymnasium.Env`` stepped one by one; the results are stacked once per field.

    Raises:
        ValueError: the list is empty. TypeError: an entry is not a ``gymnasium.Env``.
        SpaceError: the envs' spaces differ, or are not supported.
    """

    def __init__(self, envs: list[gym.Env], autoreset: bool):
        if not envs:
            raise ValueError("envs must hold at least one gymnasium.Env, got an empty list")
        for i, e in enumerate(envs):
            if not isinstance(e, gym.Env):
                raise TypeError(f"envs[{i}] must be a gymnasium.Env, got {type(e).__name__}")
        for i, e in enumerate(envs[1:], 1):
            for name in ("observation_space", "action_space"):
                if getattr(e, name) != getattr(envs[0], name):
                    raise SpaceError(
                        f"every env must have the same {name}: envs[0] has {getattr(envs[0], name)}, envs[{i}] "
                        f"has {getattr(e, name)}; build the list from one env id"
                    )
        self.envs = envs
        # Env i's options of the last reset, which its auto-resets reuse.
        self.options: list[dict[str, Any] | None] = [None] * len(envs)
        super().__init__(len(envs), envs[0].observation_space, envs[0].action_space, autoreset)

    def describe(self) -> str:
        return f"list of {type(self.envs[0].unwrapped).__name__}"

    def reset(self, seeds: list[int] | None, options: list[dict[str, Any] | None]) -> dict[str, np.ndarray]:
        observations = []
        for i, env in enumerate(self.envs):
            o, _ = env.reset(seed=None if seeds is None else seeds[i], options=options[i])
            observations.append(o)
        self.options = options
        return stack(self.fields, observations)

    def step(self, a_np: np.ndarray, running: np.ndarray) -> Stepped:
        # The only per-env Python is the env.step call itself: the results are unzipped and stacked by C loops.
        envs = self.envs if len(running) == self.n else [self.envs[i] for i in running.tolist()]
        observations, rewards, terms, truncs, _ = zip(*map(_step_one, envs, a_np))
        nxt = stack(self.fields, observations)
        reward = np.array(rewards, dtype=np.float32)
        term = np.array(terms, dtype=bool)
        trunc = np.array(truncs, dtype=bool)
        done = term | trunc
        fresh = None
        if self.autoreset:
            reset_rows = np.flatnonzero(done)
            if len(reset_rows):
                options = self.options
                reset_obs = [envs[j].reset(options=options[running[j]])[0] for j in reset_rows.tolist()]
                fresh = with_rows(nxt, reset_rows, stack(self.fields, reset_obs))
        return nxt, reward, term, trunc, done, fresh

    def step_into(self, a_np: np.ndarray, nxt: dict[str, np.ndarray], run: dict[str, np.ndarray]) -> None:
        envs = self.envs
        observations, rewards, terms, truncs, _ = zip(*map(_step_one, envs, a_np))
        for f in self.fields:
            fill(nxt[f.key], observations, f)
            run[f.key][...] = nxt[f.key]
        done = write_flags(nxt, run, rewards, terms, truncs, a_np)
        rows = np.flatnonzero(done)
        if len(rows):
            options = self.options
            fresh = [envs[j].reset(options=options[j])[0] for j in rows.tolist()]
            for f in self.fields:
                fill(run[f.key], fresh, f, rows)
            mark_restarted(run, rows)

    def close(self) -> None:
        for e in self.envs:
            e.close()


class VectorAdapter(GymAdapter):
    """One gymnasium ``VectorEnv`` (or a duck-typed one: envpool's), stepped with one call per step.

    Its ``autoreset_mode`` decides how the terminal and the fresh observations of a finished env are found:
    ``SAME_STEP``: the terminal one is in ``infos["final_obs"]``. ``NEXT_STEP`` with ``autoreset``: the adapter
    resets the finished envs itself right after the step (:func:`resets_a_subset`). ``NEXT_STEP`` episodic: a
    finished env keeps being stepped with a valid dummy action and its rows are never shown.

    Raises:
        ValueError: the vector env's autoreset mode does not fit ``autoreset``.
        SpaceError: an unsupported space.
    """

    def __init__(self, vec: Any, autoreset: bool):
        mode = autoreset_mode(vec)
        if mode == AutoresetMode.DISABLED:
            raise ValueError(
                "the vector env has autoreset_mode=DISABLED, which GymEnv cannot step past an episode end; "
                "build it with vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}"
            )
        if autoreset and mode != AutoresetMode.SAME_STEP and not resets_a_subset(vec):
            raise ValueError(
                f"GymEnvInf (autoreset=True) needs a vector env with autoreset_mode=SAME_STEP, got {mode.name} "
                f"({type(vec).__name__}), which cannot reset a subset of its envs: with NEXT_STEP a finished env "
                "only resets on its next step, so the fresh observation cannot be returned with the terminal one "
                "unless the adapter resets it at once (reset(options={'reset_mask': mask}), as gymnasium's "
                "Sync/AsyncVectorEnv, ale-py's AtariVectorEnv and envpool do); build it with "
                "gymnasium.make_vec(id, n, vectorization_mode='sync', "
                "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}), "
                "or pass a list of envs, or use GymEnv (episodic)"
            )
        self.vec = vec
        self._same_step = mode == AutoresetMode.SAME_STEP
        # NEXT_STEP with auto-reset: the adapter resets the finished envs itself, right after the step that
        # finished them, so that one step returns both observations (the vector env then has nothing to reset).
        self._reset_finished = autoreset and mode == AutoresetMode.NEXT_STEP
        # gymnasium's Sync/AsyncVectorEnv return a fresh array per step unless built with copy=False.
        self._copy = not getattr(vec, "copy", True)
        inner = getattr(vec, "unwrapped", vec)
        self._seed_list = isinstance(inner, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))
        # ale-py's AtariVectorEnv takes one seed per env as an array (an int seeds them with consecutive values).
        self._seed_array = _is_ale_vector(inner)
        self._act_buf: np.ndarray | None = None
        super().__init__(int(vec.num_envs), vec.single_observation_space, vec.single_action_space, autoreset)

    def describe(self) -> str:
        return type(self.vec).__name__

    def check_options(self, env_info: DictTensor) -> None:
        if self.autoreset:
            raise ValueError(
                "env_info cannot parametrise a vector env's auto-resets (gymnasium resets them without options); "
                "pass a list of envs to GymEnvInf, or use GymEnv"
            )
        for k, v in env_info.items():
            if not bool((v == v[:1]).all()):
                raise ValueError(
                    f"a vector env takes one options dict for all its envs, but env_info[{k!r}] differs across "
                    "rows; pass a list of envs for per-env options"
                )

    def reset(self, seeds: list[int] | None, options: list[dict[str, Any] | None]) -> dict[str, np.ndarray]:
        # Sync/AsyncVectorEnv seed env k with seed[k], AtariVectorEnv with an array; others take one int.
        if seeds is None or self._seed_list:
            vseed: Any = seeds
        elif self._seed_array:
            vseed = np.asarray(seeds, dtype=np.int64)
        else:
            vseed = seeds[0]
        obs, _ = self.vec.reset(seed=vseed, options=options[0])
        fields = split(self.fields, obs)
        if self._copy:
            fields = {k: v.copy() for k, v in fields.items()}
        return fields

    def step(self, a_np: np.ndarray, running: np.ndarray) -> Stepped:
        n = self.n
        full = len(running) == n
        if full:
            vec_action = a_np
        else:
            if self._act_buf is None:
                self._act_buf = np.broadcast_to(self.action.dummy, (n,) + self.action.shape).copy()
            self._act_buf[running] = a_np
            vec_action = self._act_buf
        obs, reward, term, trunc, infos = self.vec.step(vec_action)
        fields = split(self.fields, obs)
        reward = np.asarray(reward, dtype=np.float32)
        term = np.asarray(term, dtype=bool)
        trunc = np.asarray(trunc, dtype=bool)
        if full:
            if self._copy:
                fields = {k: v.copy() for k, v in fields.items()}
        else:
            fields = {k: v[running] for k, v in fields.items()}
            reward, term, trunc = reward[running], term[running], trunc[running]
        done = term | trunc
        if self._reset_finished and done.any():
            return fields, reward, term, trunc, done, with_rows(fields, done, self._reset_rows(done))
        if not (self._same_step and done.any()):
            return fields, reward, term, trunc, done, None
        # SAME_STEP: the vector env already holds the reset observation; the terminal one is in the infos.
        rows = np.flatnonzero(done)
        final = stack(self.fields, list(infos["final_obs"][running[rows]]))
        return with_rows(fields, rows, final), reward, term, trunc, done, fields

    def step_into(self, a_np: np.ndarray, nxt: dict[str, np.ndarray], run: dict[str, np.ndarray]) -> None:
        obs, reward, term, trunc, infos = self.vec.step(a_np)
        for f in self.fields:
            arr = obs if f.entry is None else obs[f.entry]
            np.copyto(nxt[f.key], arr, casting="unsafe")
            np.copyto(run[f.key], arr, casting="unsafe")
        done = write_flags(nxt, run, reward, term, trunc, a_np)
        if not done.any():
            return
        rows = np.flatnonzero(done)
        if self._same_step:
            final = stack(self.fields, list(infos["final_obs"][rows]))
            for k, arr in final.items():
                nxt[k][rows] = arr
        else:
            for k, arr in self._reset_rows(done).items():
                run[k][rows] = arr
        mark_restarted(run, rows)

    def _reset_rows(self, done: np.ndarray) -> dict[str, np.ndarray]:
        """Resets the finished envs of a NEXT_STEP vector env (``done``: bool ``[n_envs]``); returns their fresh
        observations (``[done.sum(), ...]`` per field)."""
        obs, _ = self.vec.reset(options={"reset_mask": done.copy()})
        fields = split(self.fields, obs)
        rows = int(done.sum())
        # A vector env returns every env's observation (gymnasium, ale-py) or the reset ones only (envpool).
        return {k: v[done] if len(v) != rows else v for k, v in fields.items()}

    def close(self) -> None:
        self.vec.close()


def autoreset_mode(vector_env: Any) -> AutoresetMode:
    """The ``autoreset_mode`` a vector env declares in its metadata (gymnasium's default, ``NEXT_STEP``, if none)."""
    mode = getattr(vector_env, "metadata", {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)


def _is_ale_vector(vec: Any) -> bool:
    # Checked by module name, so that ale-py is never imported for it.
    return type(vec).__name__ == "AtariVectorEnv" and type(vec).__module__.startswith("ale_py")


def resets_a_subset(vec: Any) -> bool:
    """Whether the vector env ``vec`` resets a subset of its envs with ``vec.reset(options={"reset_mask": mask})``
    (``mask``: bool ``[num_envs]``), returning the observations of every env or of the reset ones, and then steps
    them normally (no pending auto-reset): gymnasium's ``SyncVectorEnv``/``AsyncVectorEnv``, ale-py's
    ``AtariVectorEnv``, and any vector env whose ``metadata`` says ``"reset_mask": True`` (rlstruct's envpool
    wrapper)."""
    if getattr(vec, "metadata", {}).get("reset_mask") is True:
        return True
    inner = getattr(vec, "unwrapped", vec)
    return isinstance(inner, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)) or _is_ale_vector(inner)


def is_vector_env(envs: Any) -> bool:
    """Whether ``envs`` is a gymnasium ``VectorEnv``, or exposes the same attributes (envpool's gymnasium API)."""
    if isinstance(envs, gym.vector.VectorEnv):
        return True
    return all(hasattr(envs, a) for a in ("num_envs", "single_action_space", "single_observation_space", "step"))
