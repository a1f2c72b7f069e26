"""JAX envs as rlstruct VecEnvs: :class:`JaxVecEnv` vmaps and jits a pair of pure single-env functions (gymnax's
split) and hands their outputs to torch on the same device without a copy; :func:`jax_device` maps a torch device
to JAX's."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._actions import ActionSpec
from rlstruct.envs._base import (
    CallOrder,
    HostDestinations,
    StepResult,
    VecEnv,
    check_no_env_info,
    check_some_running,
)
from rlstruct.envs._imports import import_jax
from rlstruct.errors import (
    DeviceUnavailableError,
    SpaceError,
)
from rlstruct.seeding import check_seed, env_seeds
from rlstruct.structures import DictTensor

__all__ = ["JaxVecEnv", "jax_device"]

# (cache_key, "reset", frame dtype) and (cache_key, "step", frame dtype) -> the jitted function shared by the envs
# built with that key; (cache_key, "step", autoreset, frame dtype, JAX device) -> that step bound to its mode. The
# reset and the step are each one function for both kinds of env, so a run's auto-reset training envs and episodic
# evaluation envs compile each once (an XLA compile of a physics env's step takes seconds).
_COMPILED: dict[Any, Callable] = {}
_INT_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _quiet_readonly_views() -> None:
    """Spends torch's once-per-process warning that a numpy array is read-only, which every CPU hand-over would
    otherwise raise on the first step: JAX's output buffers are immutable, so numpy views them read-only. The GPU
    hand-over (DLPack) shares the same kind of buffer without a word; on both, the outputs are to be read, not
    written into (see :class:`JaxVecEnv`)."""
    readonly = np.zeros(1)
    readonly.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.from_numpy(readonly)


def jax_device(device: DeviceLike) -> Any:
    """The JAX device of a torch device: ``cpu`` -> JAX's CPU device, ``cuda:k`` -> JAX's GPU ``k``.

    Raises:
        DeviceUnavailableError: JAX has no such device (e.g. a CPU-only jaxlib asked for ``cuda:0``).
        MissingDependencyError: jax is not installed.

    >>> jax_device("cpu").platform
    'cpu'
    """
    dev = check_device_exists(device)
    jax = import_jax()
    if dev.type == "cpu":
        return jax.devices("cpu")[0]
    if dev.type != "cuda":
        raise DeviceUnavailableError(f"device must be cpu or cuda:k for a JAX env, got {dev}; pass 'cpu' or 'cuda:0'")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise DeviceUnavailableError(
            f"device {dev} needs JAX's GPU backend, which this jaxlib lacks ({e}); install jax with CUDA "
            "(`pip install 'jax[cuda12]'`) or pass device='cpu'"
        ) from None
    index = dev.index or 0
    if index >= len(gpus):
        raise DeviceUnavailableError(f"device {dev} does not exist for JAX ({len(gpus)} GPUs); pass cuda:0..")
    return gpus[index]



class JaxVecEnv(CallOrder, VecEnv):
    """``n_envs`` copies of a pure JAX env as an rlstruct :class:`~rlstruct.envs.VecEnv` on a torch device.

    The env is given as two pure single-env functions (vmapped and jitted here):

    * ``reset_fn(key) -> (observation, state)``;
    * ``step_fn(key, state, action) -> (observation, state, reward, terminated, truncated)``.

    Each step is one jitted call: the vmapped ``step_fn``, the vmapped ``reset_fn``, and selects that (auto-reset)
    keep the terminal observation in ``observation_next`` and put the fresh one in ``observation_running``, or
    (episodic) freeze the envs that are not running and discard the fresh states. Both kinds of env call that one
    function, their kind an argument of it, so an auto-reset env and an episodic one of the same kind and size (a
    run's training and evaluation envs) compile it once; an episodic step costs what an auto-reset one does. Env
    ``k`` draws from its own key, derived from :func:`~rlstruct.seeding.env_seeds`
    (``jax.random.PRNGKey(env_seeds(seed, n_envs)[k])``) and split at every step and reset, so ``reset()`` twice
    starts new episodes.

    Outputs are views of JAX's output buffers (``torch.from_dlpack`` on a GPU, numpy's view on the CPU): a step's
    observations are never overwritten by a later step; read them, do not write into them (JAX's buffers are
    immutable, and other arrays of the env may share them). ``get_state()`` returns the env's state pytree
    (``{"env": state, "key": keys, "running": bool [n_envs]}``, JAX arrays on the env's JAX device, immutable, so
    no copy) and ``set_state`` takes one back.

    Args:
        reset_fn: the single-env reset.
        step_fn: the single-env step.
        observation_space: the single-env gymnasium observation space (a Box; uint8 for bool observations).
        action_space: the single-env gymnasium action space (Discrete or Box).
        n_envs: the number of envs (>= 1).
        seed: an int in ``[0, 2**31)``.
        device: the torch device; the JAX device that matches it steps the envs (see :func:`jax_device`).
        autoreset: reset finished envs inside ``step``.
        cache_key: a hashable key that names ``(reset_fn, step_fn)`` (e.g. the env id and its settings): envs built
            with the same key share their jitted functions, so a second env of the same kind and size does not
            compile again. ``None``: no sharing.

    Attributes:
        device: the torch device of observations and ids.
        jax_device: the JAX device the envs step on.

    Raises:
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        SpaceError: a space is not supported.
        DeviceUnavailableError: JAX has no device matching ``device``.

    Shapes, for ``B`` rows: ``frame: [B, *observation_space.shape]``; ``reward: float32 [B]``;
    ``done, terminated, truncated, initial_state: bool [B]``; ``last_action: int64 [B]`` (Discrete) or
    ``float32 [B, *shape]`` (Box); ids ``int64 [B]``.

    JAX computes in 32 bits (``jax_enable_x64`` off): actions are handed over as int32 (Discrete) or float32 (Box)
    and ``last_action`` comes back as int64 / float32, as for every rlstruct env. A bool observation (e.g. gymnax
    versions whose MinAtar frames are bool ``[10, 10, C]``) is handed over as uint8 (0/1), and its space says so.
    """

    def __init__(
        self,
        reset_fn: Callable,
        step_fn: Callable,
        observation_space: gym.Space,
        action_space: gym.Space,
        n_envs: int,
        *,
        seed: int = 0,
        device: DeviceLike = "cpu",
        autoreset: bool = False,
        cache_key: Any = None,
    ):
        self._seed = check_seed(seed)
        if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1:
            raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
        self._n = int(n_envs)
        self.device = check_device_exists(device)
        self.autoreset = bool(autoreset)
        if not isinstance(observation_space, spaces.Box):
            raise SpaceError(
                f"observation_space must be a Box space, got {observation_space}; flatten the observation into one "
                "array"
            )
        if isinstance(action_space, spaces.Discrete):
            if int(action_space.start) != 0:
                raise SpaceError(f"a Discrete action_space must start at 0, got {action_space}; shift the actions")
            self._jax_action_dtype = torch.int32
        elif isinstance(action_space, spaces.Box):
            self._jax_action_dtype = torch.float32
        else:
            raise SpaceError(
                f"action_space must be Discrete or Box, got {action_space}; wrap the env so that it exposes one of "
                "these"
            )
        self.observation_space = observation_space
        self.action_space = action_space
        self._action_spec = ActionSpec(action_space, device=self.device, box_dtype=np.dtype(np.float32))
        self._action_shape, self._action_dtype = self._action_spec.shape, self._action_spec.dtype
        self._integer_action = self._action_spec.integer
        self._jax = import_jax()
        self.jax_device = jax_device(self.device)
        if self.device.type == "cpu":
            _quiet_readonly_views()
        self._reset_fn, self._step_fn = reset_fn, step_fn
        self._frame_dtype = np.dtype(observation_space.dtype)
        self._all_ids = torch.arange(self._n, device=self.device)
        self._keys = self._jax.device_put(self._initial_keys(), self.jax_device)
        self._state: Any = None
        self._running = None  # bool [n_envs] on the JAX device
        self._ids = self._all_ids
        self._started = False
        self._closed = False
        # jax.jit wraps without compiling: the first call of a function compiles it, and an env whose key was seen
        # before takes the function that compiled then.
        self._jit_reset, step = self._build()
        # The mode is the one jitted step's first argument, on the env's JAX device (a host scalar would be copied to
        # an accelerator at every step).
        mode = self._jax.device_put(np.bool_(self.autoreset), self.jax_device)
        self._jit_step = functools.partial(step, mode)
        if cache_key is not None:
            dtype = self._frame_dtype.str
            self._jit_reset = _COMPILED.setdefault((cache_key, "reset", dtype), self._jit_reset)
            step = _COMPILED.setdefault((cache_key, "step", dtype), step)
            self._jit_step = _COMPILED.setdefault((cache_key, "step", self.autoreset, dtype, self.jax_device),
                                                  functools.partial(step, mode))

    def _initial_keys(self):
        jax = self._jax
        seeds = np.asarray(env_seeds(self._seed, self._n), dtype=np.uint32)
        return jax.vmap(jax.random.PRNGKey)(jax.numpy.asarray(seeds))

    # ---------------------------------------------------------------- the jitted functions
    def _build(self) -> tuple[Callable, Callable]:
        jax = self._jax
        jnp = jax.numpy
        vreset = jax.vmap(self._reset_fn)
        vstep = jax.vmap(self._step_fn)
        frame_dtype = self._frame_dtype

        def split(keys):
            k = jax.vmap(lambda key: jax.random.split(key, 3))(keys)
            return k[:, 0], k[:, 1], k[:, 2]

        def rows(mask, x):
            # A [n] mask broadcast over x's trailing dims.
            return mask.reshape(mask.shape + (1,) * (x.ndim - 1))

        def select(mask, a, b):
            return jax.tree.map(lambda u, v: jnp.where(rows(mask, u), u, v), a, b)

        def reset(keys):
            keys, k_reset, _ = split(keys)
            obs, state = vreset(k_reset)
            return keys, state, jnp.asarray(obs).astype(frame_dtype)

        def step(autoreset, keys, state, running, action):
            keys, k_step, k_reset = split(keys)
            obs, state_next, reward, term, trunc = vstep(k_step, state, action)
            obs, reward = jnp.asarray(obs).astype(frame_dtype), jnp.asarray(reward, jnp.float32)
            term, trunc = jnp.asarray(term, bool), jnp.asarray(trunc, bool)
            done = term | trunc
            fresh = done & autoreset
            obs_fresh, state_fresh = vreset(k_reset)
            # Envs that are not running (an episodic env's finished ones) are frozen: their rows are never shown
            # until the next reset.
            state = select(fresh, state_fresh, select(running, state_next, state))
            obs_running = jnp.where(rows(fresh, obs), jnp.asarray(obs_fresh).astype(frame_dtype), obs)
            no = jnp.zeros_like(done)
            flags = jnp.stack([done, term, trunc, no, no, no, no, fresh])
            # One reward out: the host makes observation_running's (0 where an env reset) from it, since a second
            # output of kept rewards may be computed a rounding apart from the first (each fusion that reads a value
            # may recompute it, one with a fused multiply-add).
            return keys, state, running & (autoreset | ~done), jnp.stack([obs, obs_running]), reward, flags

        return jax.jit(reset), jax.jit(step)

    # ---------------------------------------------------------------- VecEnv
    def n_envs(self) -> int:
        """The number of environments."""
        return self._n

    def __repr__(self) -> str:
        label = self._label()
        head = "" if label is None else f"{label!r}, "
        return f"{type(self).__name__}({head}n_envs={self._n}, autoreset={self.autoreset}, device={self.device})"

    def _label(self) -> str | None:
        """The env's name, first in the repr (``None``: none; the subclasses built from a name give it)."""
        return None

    def _to_torch(self, x) -> torch.Tensor:
        """A JAX output as a torch tensor on the same memory: through DLPack on a GPU; on the CPU through numpy's
        zero-copy view (``np.asarray`` waits for the result and shares JAX's buffer), a fraction of
        ``torch.from_dlpack``'s Python cost per array."""
        if self.device.type == "cpu":
            return torch.from_numpy(np.asarray(x))
        return torch.from_dlpack(x)

    def _to_jax(self, a: torch.Tensor) -> Any:
        """The action (a fresh tensor of the env's, never written again) as the jitted step's argument: through
        DLPack on a GPU (as int32 for a Discrete space: JAX computes in 32 bits); on the CPU as the numpy view of
        the same memory, which the jitted call takes in C++ (narrowing int64 to int32 there) at a fraction of
        ``jax.dlpack.from_dlpack``'s Python cost."""
        if self.device.type == "cpu":
            return a.numpy()
        return self._jax.dlpack.from_dlpack(a.to(self._jax_action_dtype))

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Restarts every env (see :meth:`VecEnv.reset <rlstruct.envs.VecEnv.reset>`), each with a key split from
        its own, so every reset starts new episodes; JAX envs take no per-env options."""
        self._check_open()
        self._check_env_info(env_info)
        jnp = self._jax.numpy
        self._keys, self._state, frame = self._jit_reset(self._keys)
        self._running = self._jax.device_put(jnp.ones(self._n, bool), self.jax_device)
        self._ids = self._all_ids
        self._started = True
        n, dev = self._n, self.device
        flags = torch.zeros((4, n), dtype=torch.bool, device=dev)
        obs = DictTensor._trusted({
            "frame": self._to_torch(frame),
            "reward": torch.zeros(n, device=dev),
            "done": flags[0],
            "terminated": flags[1],
            "truncated": flags[2],
            "initial_state": ~flags[3],
            "last_action": torch.zeros((n,) + self._action_shape, dtype=self._action_dtype, device=dev),
        })
        return obs, self._all_ids

    def _check_env_info(self, env_info: DictTensor | None) -> None:
        check_no_env_info(env_info, self._n, "a JAX env", "set per-env parameters in the JAX env's params instead")

    def _check_action(self, action: DictTensor, n_rows: int, ids: torch.Tensor | None = None) -> torch.Tensor:
        a = action["action"]
        shape = self._action_spec.check(a, n_rows)
        # A fresh contiguous tensor of last_action's dtype, never the agent's: it is the step's last_action, and
        # what JAX reads.
        a = a.detach().reshape(shape).to(self._action_dtype, memory_format=torch.contiguous_format, copy=True)
        self._action_spec.check_values(a, ids=ids)
        return a


    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs (see :meth:`VecEnv.step <rlstruct.envs.VecEnv.step>`): ``action``: int
        ``[B]`` (Discrete) or float ``[B, *shape]`` (Box)."""
        self._check_steppable("step")
        ids = self._ids
        n_running = ids.shape[0]
        check_some_running(n_running, self._n)
        a = self._check_action(action, n_running, None if self.autoreset else ids)
        to_jax, to_torch = self._to_jax, self._to_torch
        if self.autoreset:
            self._keys, self._state, _, frames, reward, flags = self._jit_step(
                self._keys, self._state, self._running, to_jax(a)
            )
            # unbind: every row view in one call, cheaper than indexing row by row.
            frame, frame_running = to_torch(frames).unbind(0)
            reward = to_torch(reward)
            flags = to_torch(flags).unbind(0)
            done = flags[0]
            reward_running = reward.masked_fill(done, 0.0)
            nxt = DictTensor._trusted({
                "frame": frame, "reward": reward, "done": done, "terminated": flags[1],
                "truncated": flags[2], "initial_state": flags[3], "last_action": a,
            })
            running = DictTensor._trusted({
                "frame": frame_running, "reward": reward_running, "done": flags[4], "terminated": flags[5],
                "truncated": flags[6], "initial_state": flags[7],
                "last_action": a.masked_fill(done.view((-1,) + (1,) * len(self._action_shape)), 0),
            })
            return (nxt, ids), (running, ids)
        if n_running < self._n:
            full = torch.zeros((self._n,) + self._action_shape, dtype=a.dtype, device=self.device)
            a = full.index_copy_(0, ids, a)
        self._keys, self._state, self._running, frames, reward, flags = self._jit_step(
            self._keys, self._state, self._running, to_jax(a)
        )
        frame, reward, flags = to_torch(frames)[0], to_torch(reward), to_torch(flags).unbind(0)
        values = {"frame": frame, "reward": reward, "done": flags[0], "terminated": flags[1], "truncated": flags[2],
                  "initial_state": flags[3], "last_action": a}
        if n_running < self._n:
            values = {k: v.index_select(0, ids) for k, v in values.items()}
        nxt = DictTensor._trusted(values)
        keep = (~nxt["done"]).nonzero().squeeze(1)
        self._ids = ids.index_select(0, keep)
        return (nxt, ids), (nxt.index(keep), self._ids)

    def writes_in_place(self) -> bool:
        """True for an auto-reset env on the CPU: :meth:`step_into` copies the jitted step's output buffers
        straight into the destinations (numpy copies of numpy views, no tensors or DictTensors per step). On a GPU
        the generic :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>` (``step``, then a copy per key)."""
        return self.autoreset and self.device.type == "cpu"

    @functools.cached_property
    def _destinations(self) -> HostDestinations:
        """What :meth:`step_into`'s destinations must be: the observations' keys, per-row shapes and dtypes."""
        return HostDestinations.of_frame(
            self.observation_space.shape, self._frame_dtype, self._action_shape, self._integer_action, self._n
        )

    def step_into(self, action: DictTensor, observation_next: DictTensor, observation_running: DictTensor) -> None:
        """:meth:`step`, writing both observations into the given tensors (see
        :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>`): on the CPU, the jitted step's outputs are
        copied from their buffers into the destinations; on a GPU, :meth:`step` runs and its observations are
        copied.

        Raises:
            KeyError, DeviceMismatchError, SpaceError: a destination lacks a key, is not on the CPU, or has
                another shape or dtype than the observations.
            EnvStateError: the env does not auto-reset, was never reset, or is closed.
            Exception: whatever :meth:`step` raises for the action.
        """
        if not self.writes_in_place():
            return super().step_into(action, observation_next, observation_running)
        self._check_steppable("step_into")
        a = self._check_action(action, self._n).numpy()
        nxt = self._destinations(observation_next, "observation_next")
        run = self._destinations(observation_running, "observation_running")
        self._keys, self._state, _, frames, reward, flags = self._jit_step(self._keys, self._state, self._running, a)
        frames, reward, flags = np.asarray(frames), np.asarray(reward), np.asarray(flags)
        for i, out in enumerate((nxt, run)):
            np.copyto(out["frame"], frames[i])
            np.copyto(out["reward"], reward)
            for j, k in enumerate(("done", "terminated", "truncated", "initial_state")):
                np.copyto(out[k], flags[4 * i + j])
        np.copyto(nxt["last_action"], a)
        np.copyto(run["last_action"], a)
        run["last_action"][flags[0]] = 0
        run["reward"][flags[0]] = 0

    # ---------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """The env's state pytree: ``{"env": the vmapped env state, "key": the per-env keys, "running": bool
        [n_envs]}`` (JAX arrays on :attr:`jax_device`; immutable, so not copied).

        Raises:
            EnvStateError: ``reset`` was never called, or the env is closed.
        """
        self._check_steppable("get_state")
        return {"env": self._state, "key": self._keys, "running": self._running}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from a state of :meth:`get_state` (of this env or another of the same env and size).

        Raises:
            TypeError: ``state`` is not a dict with the keys ``env``, ``key`` and ``running``.
            SpaceError: ``running`` is not bool ``[n_envs]``, or not all true for an auto-reset env.
            EnvStateError: the env is closed.
        """
        self._check_open()
        if not isinstance(state, dict) or set(state) != {"env", "key", "running"}:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise TypeError(f"state must be a dict with the keys env, key, running (get_state()'s), got {got}")
        jax = self._jax
        running = np.asarray(state["running"])
        if running.shape != (self._n,) or running.dtype != np.bool_:
            raise SpaceError(
                f"state['running'] must be bool [{self._n}], got {running.dtype} {list(running.shape)}; "
                "pass a state from get_state() of an env with as many envs"
            )
        if self.autoreset and not running.all():
            raise SpaceError("state['running'] must be all true for an auto-reset env; pass an auto-reset env's state")
        self._state = jax.device_put(state["env"], self.jax_device)
        self._keys = jax.device_put(state["key"], self.jax_device)
        self._running = jax.device_put(state["running"], self.jax_device)
        self._ids = torch.from_numpy(np.flatnonzero(running)).to(self.device)
        self._started = True

    def close(self) -> None:
        """Drops the env's JAX state (its device buffers); idempotent."""
        self._closed = True
        self._state = self._keys = self._running = None
