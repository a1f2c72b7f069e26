"""The shared base of the torch-native simulators: batched state, counter-based RNG, step variants.

A :class:`TorchVecEnv` keeps every env's state in a few tensors on one device and steps all of
them with a handful of batched kernels, so that ``10**5``-``10**6`` envs live on one GPU (or one
CPU process) with no Python loop over envs. Subclasses only describe one system: its reset
distribution, its transition and its observation, each a pure function of arrays written once against
an array namespace ``xp``: :class:`TorchOps` (torch tensors: accelerators and ``compile=True``) or
:class:`NumpyOps` (zero-copy numpy views of CPU tensors: the default CPU step, where a numpy operation
dispatches in about a third of a torch operation's time). Both give the same bits on the CPU. A
simulator may also have compiled CPU kernels (:mod:`rlstruct.envs._jit_kernels`, with numba installed:
the whole step in one call), which repeat its numpy kernels operation for operation, to the same bits.

State layout (all on :attr:`TorchVecEnv.device`, one column or row per env):

* ``physics``: ``float64 [P, n_envs]``, one contiguous row per state variable (structure of
  arrays: every elementwise kernel reads contiguous memory); :meth:`TorchVecEnv.get_state`
  exposes it transposed, ``[n_envs, P]``, in gymnasium's order.
* ``elapsed_steps``: ``int64 [n_envs]``, steps taken in the current episode (gymnasium's
  ``TimeLimit`` counter: truncation when it reaches ``max_episode_steps``).
* ``episode``: ``int64 [n_envs]``, index of the env's current episode (0 after the first
  ``reset``); with ``rng_key`` it is the whole RNG state.
* ``rng_key``: ``int64 [n_envs]`` in ``[0, 2**32)``, a hash of ``(seed, env index)``.
* ``last_action`` and, for episodic envs, the set of running envs.

Randomness is counter based: draw ``d`` of episode ``e`` of env ``k`` is
``mix32((key_k + e * A + d * B) mod 2**32)`` mapped to ``(low_d, high_d)``, where ``mix32`` is a
two-multiply xorshift hash with odd multipliers below ``2**31`` and
``key_k = mix32(mix32(base(seed) + k * C))``, all computed in ``int64`` with every intermediate
below ``2**63`` (no signed overflow, so CPU and CUDA give the same bits). So env
``k``'s episodes depend on ``(seed, k, e)`` only: not on ``n_envs``, on the device, on when the
other envs finish, or on the order of calls.
"""

from __future__ import annotations

import abc
import functools
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch

from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._base import HostDestinations, StepResult, VecEnv, host_copy
from rlstruct.envs._jit import jit_kernels
from rlstruct.errors import BatcherStateError, BatchSizeError, DeviceMismatchError, SpaceError
from rlstruct.structures import DictTensor

__all__ = ["TorchVecEnv", "TorchOps", "NumpyOps"]

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a value below 2**32 times one of them stays below 2**63.
_MIX_C1 = 0x21F0AAAD
_MIX_C2 = 0x735A2D97
_EPISODE_STRIDE = 0x61C88647  # 2**32 - golden-ratio constant, below 2**31
_DRAW_STRIDE = 0x2C1B3C6D
_ENV_STRIDE = 0x5BD1E995 & 0x7FFFFFFF
_SEED_SALT = (0x3C6EF372, 0x1B873593)
_TWO_POW_M32 = 2.0**-32
_MIX_C1_U32, _MIX_C2_U32, _EPISODE_STRIDE_U32 = np.uint32(_MIX_C1), np.uint32(_MIX_C2), np.uint32(_EPISODE_STRIDE)
# With compile=True on the CPU, batches up to this size draw densely inside the fused step (measured
# crossover on a 2-core AVX2 machine: see BENCHMARKS.md).
_FUSED_DENSE_MAX_ENVS = 2048

_STATE_KEYS = ("physics", "elapsed_steps", "episode", "rng_key", "last_action", "running")


def _mix32(x: Any) -> Any:
    """A 32-bit avalanche hash of ``x`` (``int64`` tensor or array, values in ``[0, 2**32)``), same range out."""
    x = x ^ (x >> 16)
    x = (x * _MIX_C1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MIX_C2) & _MASK32
    return x ^ (x >> 15)


def _mix32_u32(x: np.ndarray) -> np.ndarray:
    """:func:`_mix32` on a ``uint32`` numpy array: its arithmetic wraps modulo ``2**32``, so the masks are
    implicit and the bits are the same, in five fewer calls."""
    x = x ^ (x >> 16)
    x = x * _MIX_C1_U32
    x = x ^ (x >> 15)
    x = x * _MIX_C2_U32
    return x ^ (x >> 15)


class TorchOps:
    """The array namespace of the torch kernels: any device, and what ``compile=True`` fuses.

    The simulators' kernels are written once against ``xp`` (this class or :class:`NumpyOps`), with
    Python operators for the arithmetic and ``xp.<name>`` for the rest, so that one code runs on
    torch tensors (accelerators, fused steps) and on zero-copy numpy views of CPU tensors.
    """

    is_numpy = False
    sin = staticmethod(torch.sin)
    cos = staticmethod(torch.cos)
    abs = staticmethod(torch.abs)
    ceil = staticmethod(torch.ceil)
    remainder = staticmethod(torch.remainder)
    where = staticmethod(torch.where)
    minimum = staticmethod(torch.minimum)
    maximum = staticmethod(torch.maximum)
    zeros_like = staticmethod(torch.zeros_like)

    @staticmethod
    def clip(x: torch.Tensor, low: Any = None, high: Any = None) -> torch.Tensor:
        return x.clamp(low, high)

    @staticmethod
    def lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``table[clip(index, 0, len(table) - 1)]``: a per-action constant, the action clamped into range."""
        return table[index.clamp(0, table.shape[0] - 1)]

    @staticmethod
    def stack(rows: Any) -> torch.Tensor:
        return torch.stack(tuple(rows))

    @staticmethod
    def concat(parts: Any) -> torch.Tensor:
        return torch.cat(tuple(parts))

    @staticmethod
    def float64(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float64)

    @staticmethod
    def float32(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32)

    @staticmethod
    def full_f32(like: torch.Tensor, value: float) -> torch.Tensor:
        """``float32 [B]`` filled with ``value``, ``B`` and the device those of ``like [B]``."""
        return torch.full(like.shape, value, dtype=torch.float32, device=like.device)

    @staticmethod
    def false(like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(like.shape, dtype=torch.bool, device=like.device)

    @staticmethod
    def frame(rows: Any) -> torch.Tensor:
        """``float32 [B, F]`` whose column ``f`` is ``rows[f]``: a ``[F, B]`` tensor or ``F`` tensors ``[B]``."""
        if isinstance(rows, torch.Tensor):
            return rows.t().to(torch.float32, memory_format=torch.contiguous_format)
        return torch.stack(tuple(rows), dim=1).to(torch.float32)


def _torch_sin(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=x.dtype)
    torch.sin(torch.from_numpy(x), out=torch.from_numpy(out))
    return out


def _torch_cos(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=x.dtype)
    torch.cos(torch.from_numpy(x), out=torch.from_numpy(out))
    return out


class NumpyOps:
    """The array namespace of the CPU kernels: numpy on zero-copy views of CPU tensors.

    A numpy operation dispatches in about a third of a torch operation's time, which is most of a
    step's cost up to ``10**4`` envs. ``sin`` and ``cos`` are torch's (vectorized, 2-3x numpy's
    float64 ones on AVX2, and the same bits as the torch kernels), called on the same memory.
    """

    is_numpy = True
    sin = staticmethod(_torch_sin)
    cos = staticmethod(_torch_cos)
    abs = staticmethod(np.abs)
    ceil = staticmethod(np.ceil)
    remainder = staticmethod(np.remainder)
    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    zeros_like = staticmethod(np.zeros_like)

    @staticmethod
    def lookup(table: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.take(table, index, mode="clip")

    @staticmethod
    def clip(x: np.ndarray, low: Any = None, high: Any = None) -> np.ndarray:
        if high is None:
            return np.maximum(x, low)
        if low is None:
            return np.minimum(x, high)
        return np.minimum(np.maximum(x, low), high)

    @staticmethod
    def stack(rows: Any) -> np.ndarray:
        # np.array of a tuple of [B] arrays is np.stack's result, at a quarter of its call overhead.
        return np.array(tuple(rows))

    @staticmethod
    def concat(parts: Any) -> np.ndarray:
        return np.concatenate(tuple(parts))

    @staticmethod
    def float64(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64)

    @staticmethod
    def float32(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32)

    @staticmethod
    def full_f32(like: np.ndarray, value: float) -> np.ndarray:
        out = np.empty(like.shape, dtype=np.float32)
        out.fill(value)
        return out

    @staticmethod
    def false(like: np.ndarray) -> np.ndarray:
        return np.zeros(like.shape, dtype=np.bool_)

    @staticmethod
    def frame(rows: Any) -> np.ndarray:
        if isinstance(rows, np.ndarray) and rows.shape[1] <= 512:
            return rows.T.astype(np.float32, order="C")
        # Column by column for large batches: numpy's cast of a transposed [F, B] array into C order
        # walks it F elements at a time, 2-3x slower from 4096 envs on.
        out = np.empty((len(rows[0]), len(rows)), dtype=np.float32)
        for f, row in enumerate(rows):
            out[:, f] = row
        return out


def env_keys(seed: int, n_envs: int, device: torch.device) -> torch.Tensor:
    """``int64 [n_envs]`` in ``[0, 2**32)``: the RNG key of env ``k`` depends on ``(seed, k)`` only.

    >>> bool((env_keys(0, 8, torch.device("cpu"))[:4] == env_keys(0, 4, torch.device("cpu"))).all())
    True
    """
    seed64 = seed & 0xFFFFFFFFFFFFFFFF
    halves = torch.tensor([seed64 & _MASK32, seed64 >> 32], dtype=torch.int64)
    halves = _mix32(halves ^ torch.tensor(_SEED_SALT, dtype=torch.int64))
    base = _mix32(halves[:1] ^ _mix32(halves[1:] + 1))
    k = torch.arange(n_envs, dtype=torch.int64)
    keys = _mix32(_mix32((base + (k & _MASK32) * _ENV_STRIDE) & _MASK32) ^ (k >> 32))
    return keys.to(device)


class _AutoresetStep(NamedTuple):
    """What one auto-reset step computes (``*_r``: what the running envs act on next)."""

    frame: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    reward_r: torch.Tensor
    initial_r: torch.Tensor
    last_r: torch.Tensor
    elapsed_r: torch.Tensor
    episode_r: torch.Tensor
    phys_r: torch.Tensor
    frame_r: torch.Tensor
    false: tuple[torch.Tensor, ...] | None = None  # four all-false bool [B], when the step made them


def _with_restarts(out: _AutoresetStep, phys_r: torch.Tensor, frame_r: torch.Tensor) -> _AutoresetStep:
    """``out`` with the running envs' states and frames replaced (the finished ones restarted).

    Built field by field rather than with ``NamedTuple._replace``, which ``torch.compile`` cannot trace in
    every torch 2.x release.
    """
    return _AutoresetStep(
        out.frame, out.reward, out.done, out.terminated, out.truncated, out.reward_r, out.initial_r, out.last_r,
        out.elapsed_r, out.episode_r, phys_r, frame_r, out.false,
    )  # fmt: skip


class TorchVecEnv(VecEnv):
    """``n_envs`` copies of one system, stepped together by batched torch kernels on one device.

    Subclasses set the class attributes below and implement :meth:`_initial_physics`,
    :meth:`_transition` and :meth:`_frame` as pure functions of arrays against the namespace ``xp``
    they are given (no Python branch on values), which is what lets ``compile=True`` fuse a whole
    step and the CPU step run them on numpy.

    Observations (``B`` rows, keys in this order): ``frame`` ``float32 [B, obs_dim]``, ``reward``
    ``float32 [B]``, ``done`` ``bool [B]`` (``terminated | truncated``), ``terminated``, ``truncated``,
    ``initial_state`` (``bool [B]``), ``last_action`` (``int64 [B]`` for a discrete action space,
    ``float32 [B, *action_shape]`` otherwise). Observation tensors are freshly allocated and the env
    never writes into a tensor it has handed out (the ids of every auto-reset step are one cached
    ``arange``: read them, do not write into them). With the compiled CPU kernel, an auto-reset env
    writes in place: :meth:`step_into` has the kernel fill the given tensors (a batcher's buffer).

    Args:
        n_envs: number of envs (``>= 1``).
        device: where the state, the observations and the ids live.
        seed: any int; env ``k`` of ``seed`` replays the same episodes whatever ``n_envs`` and device.
        autoreset: ``True``: every env always runs and a finished env restarts inside ``step``;
            ``False`` (episodic): finished envs drop out until :meth:`reset`.
        max_episode_steps: truncation horizon (gymnasium's ``TimeLimit``); ``None`` for none.
        compile: fuse the step with ``torch.compile`` (off by default; the first steps compile).

    Attributes:
        kernel: how a step runs: ``"jit"`` (CPU, one compiled call per step: numba installed and compiled
            kernels for this simulator), ``"numpy"`` (CPU, the kernels on numpy views of the state),
            ``"torch"`` (accelerators: torch kernels, no host sync in the auto-reset step) or ``"compiled"``
            (``compile=True``). The CPU kernels give the same bits.

    Raises:
        ValueError: ``n_envs`` or ``max_episode_steps`` is not a positive int.
        DeviceUnavailableError: ``device`` does not exist on this machine.

    >>> from rlstruct.envs import CartPole
    >>> env = CartPole(2, seed=0, autoreset=True)
    >>> _ = env.reset()
    >>> state = env.get_state()
    >>> state["physics"].shape, state["episode"].tolist(), state["running"].tolist()
    (torch.Size([2, 4]), [0, 0], [True, True])
    >>> CartPole(2, seed=7, autoreset=True).set_state(state)  # continues exactly as env would
    """

    # Set by subclasses.
    physics_names: tuple[str, ...] = ()
    reset_low: tuple[float, ...] = ()
    reset_high: tuple[float, ...] = ()
    n_actions: int | None = None
    action_shape: tuple[int, ...] = ()
    # Subclasses with compiled CPU steps (:mod:`rlstruct.envs._jit_kernels`): the kernels' name prefix, and
    # the names of the class constants the kernels read, in their order.
    _jit_name: str | None = None
    _jit_params: tuple[str, ...] = ()

    def __init__(
        self,
        n_envs: int,
        *,
        device: DeviceLike = "cpu",
        seed: int = 0,
        autoreset: bool = False,
        max_episode_steps: int | None,
        compile: bool = False,
    ):
        if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
            raise ValueError(f"n_envs must be a positive int, got {n_envs!r}; pass e.g. n_envs=1024")
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1
        ):
            raise ValueError(
                f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}; "
                "pass None for no time limit"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        self.device = check_device_exists(device)
        self.autoreset = bool(autoreset)
        self.max_episode_steps = max_episode_steps
        self.seed = seed
        self.compiled = bool(compile)
        self._n = n_envs
        dev = self.device
        self._limit = max_episode_steps if max_episode_steps is not None else 2**62
        self._ids_all = torch.arange(n_envs, dtype=torch.int64, device=dev)
        n_draws = len(self.reset_low)
        low = torch.tensor(self.reset_low, dtype=torch.float64)
        high = torch.tensor(self.reset_high, dtype=torch.float64)
        scale = (high - low) * _TWO_POW_M32
        self._arrays_torch = SimpleNamespace()
        self._arrays_numpy = SimpleNamespace()
        self._add_array("draw_salt", (torch.arange(n_draws, dtype=torch.int64) * _DRAW_STRIDE & _MASK32).view(-1, 1))
        self._add_array("draw_scale", scale.view(-1, 1))
        self._add_array("draw_offset", (low + 0.5 * scale).view(-1, 1))
        if dev.type == "cpu":
            self._arrays_numpy.draw_salt_u32 = self._arrays_numpy.draw_salt.astype(np.uint32)
        self._rng_key = env_keys(seed, n_envs, dev)
        self._started = False
        self._phys = torch.zeros(len(self.physics_names), n_envs, dtype=torch.float64, device=dev)
        self._elapsed = torch.zeros(n_envs, dtype=torch.int64, device=dev)
        self._episode = torch.full((n_envs,), -1, dtype=torch.int64, device=dev)
        self._last_action = self._zero_actions(n_envs)
        self._ids = self._ids_all
        self._discrete = self.n_actions is not None
        self._np_views: tuple | None = None
        self._key_np: tuple = (None, None)
        self._action_np: np.ndarray | None = None
        # How a step runs, chosen once here; every way gives the same bits (up to the fused kernels'
        # floating-point contractions). On the CPU: one compiled call per step where the simulator has
        # compiled kernels and numba is installed (``"jit"``), else the kernels on numpy views of the state
        # (``"numpy"``; numpy dispatches ~3x faster than torch: see BENCHMARKS.md); both draw fresh initial
        # states for the finished envs only (no device to wait for). Elsewhere the kernels run on torch
        # tensors and draw for every env then select (``"torch"``, dense: branch-free, no host sync).
        # compile=True fuses the torch kernels (``"compiled"``): the whole dense step off the CPU and for
        # small CPU batches, the physics only (with sparse draws) for large CPU batches.
        on_cpu = dev.type == "cpu"
        kernels = jit_kernels() if on_cpu and not compile and self._jit_name is not None else None
        self._advance_fn = self._advance
        if compile:
            self.kernel = "compiled"
            self._advance_fn = torch.compile(self._advance, fullgraph=True, dynamic=False)
            dense = torch.compile(self._autoreset_dense, fullgraph=True, dynamic=False)
            self._episodic_fn = torch.compile(self._episodic_kernel, fullgraph=True)
            sparse_cpu = on_cpu and n_envs > _FUSED_DENSE_MAX_ENVS
            self._autoreset_fn = self._autoreset_sparse if sparse_cpu else dense
        elif kernels is not None:
            self.kernel = "jit"
            self._jit_autoreset = getattr(kernels, self._jit_name + "_autoreset")
            self._jit_episodic = getattr(kernels, self._jit_name + "_episodic")
            self._jit_constants = np.array([getattr(self, name) for name in self._jit_params], dtype=np.float64)
            c = self._arrays_numpy
            self._jit_draws = (c.draw_salt.ravel(), c.draw_scale.ravel(), c.draw_offset.ravel())
            self._episodic_fn, self._autoreset_fn = self._episodic_jit, self._autoreset_jit
        elif on_cpu:
            self.kernel = "numpy"
            self._episodic_fn, self._autoreset_fn = self._episodic_numpy, self._autoreset_numpy
        else:
            self.kernel = "torch"
            self._episodic_fn, self._autoreset_fn = self._episodic_kernel, self._autoreset_dense

    def _numpy_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Numpy views of ``(physics, elapsed, episode)`` and the ``uint32`` key (CPU only), kept for the tensors."""
        v = self._np_views
        if v is None or v[0] is not self._phys or v[1] is not self._elapsed or v[2] is not self._episode:
            phys, elapsed, episode = self._phys, self._elapsed, self._episode
            v = self._np_views = (phys, elapsed, episode, phys.numpy(), elapsed.numpy(), episode.numpy())
        if self._key_np[0] is not self._rng_key:
            self._key_np = (self._rng_key, self._rng_key.numpy().astype(np.uint32))
        return v[3], v[4], v[5], self._key_np[1]

    def _add_array(self, name: str, values: torch.Tensor) -> None:
        """Registers a constant array of the kernels, read as ``self._arrays(xp).<name>``."""
        t = values.to(self.device)
        setattr(self._arrays_torch, name, t)
        if self.device.type == "cpu":
            setattr(self._arrays_numpy, name, t.numpy())

    def _arrays(self, xp: type) -> SimpleNamespace:
        return self._arrays_numpy if xp.is_numpy else self._arrays_torch

    # ------------------------------------------------------------ subclass hooks
    # The hooks below are pure functions of arrays, written once against the array namespace ``xp``
    # (:class:`TorchOps` or :class:`NumpyOps`): Python operators and ``xp.<name>`` only, no Python
    # branch on values. Each returns freshly allocated arrays (the step writes into them).
    @abc.abstractmethod
    def _initial_physics(self, xp: type, u: Any) -> Any:
        """Reset states ``float64 [P, B]`` from uniform draws ``float64 [D, B]`` in ``(low, high)``."""

    @abc.abstractmethod
    def _transition(self, xp: type, phys: Any, action: Any) -> tuple[Any, Any, Any]:
        """``(next physics float64 [P, B], reward float32 [B], terminated bool [B])``."""

    @abc.abstractmethod
    def _frame(self, xp: type, phys: Any) -> Any:
        """The observation ``float32 [B, obs_dim]`` of states ``float64 [P, B]``."""

    def _jit_inputs(self, phys: np.ndarray) -> tuple[np.ndarray, ...]:
        """The extra inputs of the compiled kernels for states ``phys float64 [P, B]``: the transcendental
        functions of the state, computed by torch (so that the compiled step gives the numpy kernels' bits)."""
        return ()

    # ------------------------------------------------------------------ contract
    def n_envs(self) -> int:
        """The number of environments."""
        return self._n

    def __repr__(self) -> str:
        mode = "autoreset" if self.autoreset else "episodic"
        return f"{type(self).__name__}(n_envs={self._n}, device={self.device}, seed={self.seed}, {mode})"

    def graph_state(self) -> tuple[str, ...] | None:
        """The state tensors an auto-reset step reads and rebinds (capturable off the CPU); ``None`` for episodic
        envs, whose running set shrinks (a host sync and a shape change)."""
        if not self.autoreset or self.device.type == "cpu":
            return None
        return ("_phys", "_elapsed", "_episode", "_rng_key", "_last_action")

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Starts a new episode in every env.

        Each call advances every env's episode counter, so a second ``reset`` draws new initial
        states (as gymnasium's ``reset()`` without a seed does); rebuild the env for a replay.

        Args:
            env_info: ``None``, an empty DictTensor, or ``n_envs`` rows on the CPU (accepted for
                the contract; these simulators have no per-env parameters).

        Returns:
            ``(observation [n_envs], ids)`` with ``ids = arange(n_envs)`` (int64, on :attr:`device`).

        Raises:
            TypeError: ``env_info`` is not a DictTensor.
            BatchSizeError: ``env_info`` is neither empty nor ``n_envs`` rows.
            DeviceMismatchError: ``env_info`` is not on the CPU.
        """
        self._check_env_info(env_info)
        self._episode = self._episode + 1
        self._phys = self._initial_physics(TorchOps, self._draw(TorchOps, self._rng_key, self._episode))
        self._elapsed = torch.zeros(self._n, dtype=torch.int64, device=self.device)
        self._last_action = self._zero_actions(self._n)
        self._ids = self._ids_all
        self._started = True
        if self.device.type == "cpu":
            self._numpy_state()
        false = torch.zeros(self._n, dtype=torch.bool, device=self.device)
        obs = DictTensor._trusted(
            {
                "frame": self._frame(TorchOps, self._phys),
                "reward": torch.zeros(self._n, dtype=torch.float32, device=self.device),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
                "initial_state": torch.ones(self._n, dtype=torch.bool, device=self.device),
                "last_action": self._zero_actions(self._n),
            }
        )
        return obs, self._ids_all

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs with ``action["action"]``, one row per running env.

        Args:
            action: a DictTensor whose ``"action"`` is ``[B]`` of any integer dtype (discrete
                spaces; values are clamped into ``[0, n_actions)``) or floating ``[B, *action_shape]``
                (``[B]`` is accepted for a one-dimensional Box), on :attr:`device`, rows in the
                order of the last returned ids. Other keys are ignored.

        Returns:
            ``((observation_next [B'], ids [B']), (observation_running [B''], ids [B'']))``.
            Auto-reset: ``B' = B'' = n_envs`` and both ids are ``arange(n_envs)``; a finished env's
            row in ``observation_running`` is its fresh reset observation. Episodic:
            ``ids_running = ids[~observation_next["done"]]`` and ``observation_running`` holds
            those rows of ``observation_next``.

        Raises:
            BatcherStateError: ``reset`` was never called, or every episodic env has finished.
            KeyError: ``action`` has no ``"action"`` key.
            BatchSizeError: not one row per running env.
            SpaceError: wrong dtype or per-row shape.
            DeviceMismatchError: the action is on another device.
        """
        if not self._started:
            raise BatcherStateError(f"{type(self).__name__}.step called before reset(); call env.reset() first")
        n_rows = self._ids.shape[0]
        if n_rows == 0:
            raise BatcherStateError(
                f"every one of the {self._n} episodic envs has finished; call env.reset() before stepping again "
                "(or build the env with autoreset=True)"
            )
        a = self._check_action(action, n_rows)
        if self.autoreset:
            return self._step_autoreset(a)
        return self._step_episodic(a)

    def writes_in_place(self) -> bool:
        """True for an auto-reset env stepping with its compiled CPU kernel (``kernel == "jit"``): :meth:`step_into`
        then has the kernel write both observations straight into the destinations."""
        return self.autoreset and self.kernel == "jit"

    @functools.cached_property
    def _destinations(self) -> HostDestinations:
        """What :meth:`step_into`'s destinations must be (made at its first call: subclasses set their spaces
        after this class's ``__init__``)."""
        flag = ((), np.dtype(bool))
        return HostDestinations(
            {"frame": (tuple(self.observation_space.shape), np.dtype(np.float32)),
             "reward": ((), np.dtype(np.float32)), "done": flag, "terminated": flag, "truncated": flag,
             "initial_state": flag,
             "last_action": (self.action_shape, np.dtype(np.int64 if self._discrete else np.float32))},
            self._n,
        )  # fmt: skip

    def step_into(self, action: DictTensor, observation_next: DictTensor, observation_running: DictTensor) -> None:
        """:meth:`step`, writing both observations into the given tensors (see
        :meth:`VecEnv.step_into <rlstruct.envs.VecEnv.step_into>`): with the compiled CPU kernel, the kernel writes
        them; otherwise :meth:`step` runs and its observations are copied."""
        if not self.writes_in_place():
            return super().step_into(action, observation_next, observation_running)
        if not self._started:
            raise BatcherStateError(f"{type(self).__name__}.step_into called before reset(); call env.reset() first")
        self._check_action(action, self._n)  # its copy is self._action_np
        nxt = self._destinations(observation_next, "observation_next")
        run = self._destinations(observation_running, "observation_running")
        phys_r, elapsed_r, episode_r = self._jit_autoreset_into(
            nxt["frame"], run["frame"], nxt["reward"], run["reward"], nxt["done"], nxt["terminated"],
            nxt["truncated"], run["initial_state"], nxt["initial_state"], run["done"], run["terminated"],
            run["truncated"], run["last_action"],
        )  # fmt: skip
        nxt["last_action"][...] = self._action_np
        t = torch.from_numpy
        self._phys, self._elapsed, self._episode = t(phys_r), t(elapsed_r), t(episode_r)
        self._last_action = t(run["last_action"].copy())  # the env's own: the destination is overwritten later
        self._np_views = (self._phys, self._elapsed, self._episode, phys_r, elapsed_r, episode_r)

    # ------------------------------------------------------------ step variants
    def _step_autoreset(self, a: torch.Tensor) -> StepResult:
        out = self._autoreset_fn(self._phys, self._elapsed, self._episode, self._rng_key, a)
        self._phys, self._elapsed, self._episode, self._last_action = (
            out.phys_r, out.elapsed_r, out.episode_r, out.last_r
        )
        # One allocation for the four all-false flags; each row is a separate tensor to the caller.
        false = out.false
        if false is None:
            false = torch.zeros((4,) + out.done.shape, dtype=torch.bool, device=self.device).unbind(0)
        obs_next = DictTensor._trusted(
            {
                "frame": out.frame,
                "reward": out.reward,
                "done": out.done,
                "terminated": out.terminated,
                "truncated": out.truncated,
                "initial_state": false[0],
                "last_action": a,
            }
        )
        obs_running = DictTensor._trusted(
            {
                "frame": out.frame_r,
                "reward": out.reward_r,
                "done": false[1],
                "terminated": false[2],
                "truncated": false[3],
                "initial_state": out.initial_r,
                "last_action": out.last_r,
            }
        )
        ids = self._ids_all
        return (obs_next, ids), (obs_running, ids)

    def _advance(
        self, phys: torch.Tensor, elapsed: torch.Tensor, episode: torch.Tensor, a: torch.Tensor
    ) -> _AutoresetStep:
        """Everything of an auto-reset step but the fresh initial states: pure, branch-free, fusable.

        ``phys_r`` and ``frame_r`` are still those of the terminal states; the callers put the fresh
        states of the finished envs in them.
        """
        phys_n, reward, terminated = self._transition(TorchOps, phys, a)
        elapsed_n = elapsed + 1
        truncated = elapsed_n >= self._limit
        done = terminated | truncated
        keep = ~done
        frame = self._frame(TorchOps, phys_n)
        return _AutoresetStep(
            frame=frame,
            reward=reward,
            done=done,
            terminated=terminated,
            truncated=truncated,
            reward_r=reward.masked_fill(done, 0.0),
            initial_r=done.clone(),
            last_r=a * keep if self._discrete else a.masked_fill(done.view(-1, 1), 0.0),
            elapsed_r=elapsed_n * keep,
            episode_r=episode + done,
            phys_r=phys_n,
            frame_r=frame,
        )

    def _autoreset_dense(
        self, phys: torch.Tensor, elapsed: torch.Tensor, episode: torch.Tensor, key: torch.Tensor, a: torch.Tensor
    ) -> _AutoresetStep:
        out = self._advance(phys, elapsed, episode, a)
        fresh = self._initial_physics(TorchOps, self._draw(TorchOps, key, out.episode_r))
        phys_r = torch.where(out.done, fresh, out.phys_r)
        return _with_restarts(out, phys_r, self._frame(TorchOps, phys_r))

    def _autoreset_sparse(
        self, phys: torch.Tensor, elapsed: torch.Tensor, episode: torch.Tensor, key: torch.Tensor, a: torch.Tensor
    ) -> _AutoresetStep:
        out = self._advance_fn(phys, elapsed, episode, a)
        rows = torch.nonzero(out.done).squeeze(1)
        draws = self._draw(TorchOps, key.index_select(0, rows), out.episode_r.index_select(0, rows))
        fresh = self._initial_physics(TorchOps, draws)
        # The terminal states are not handed out (the frame is a copy): the fresh ones can go in place.
        phys_r = out.phys_r.index_copy_(1, rows, fresh)
        return _with_restarts(out, phys_r, out.frame.index_copy(0, rows, self._frame(TorchOps, fresh)))

    def _autoreset_numpy(
        self, phys: torch.Tensor, elapsed: torch.Tensor, episode: torch.Tensor, key: torch.Tensor, a: torch.Tensor
    ) -> _AutoresetStep:
        """The CPU step: :meth:`_autoreset_sparse`'s results, computed by numpy on views of the tensors.

        Up to ``10**4`` envs a step costs its number of calls (about 1-2 µs each, numpy's or torch's), so
        the state's numpy views are kept between steps and the writes go in place into arrays of this
        step that no caller has seen yet.
        """
        xp = NumpyOps
        a_np = self._action_np
        phys_np, elapsed_np, episode_np, key_np = self._numpy_state()
        phys_n, reward, terminated = self._transition(xp, phys_np, a_np)
        elapsed_n = elapsed_np + 1
        truncated = elapsed_n >= self._limit
        done = terminated | truncated
        frame = self._frame(xp, phys_n)
        rows = done.nonzero()[0]
        episode_r = episode_np + done
        fresh = self._initial_physics(xp, self._draw(xp, key_np[rows], episode_r[rows]))
        phys_n[:, rows] = fresh
        elapsed_n[rows] = 0
        frame_r = frame.copy()
        frame_r[rows] = self._frame(xp, fresh)
        reward_r = reward.copy()
        reward_r[rows] = 0.0
        last_r = a_np.copy()
        last_r[rows] = 0
        t = torch.from_numpy
        out = _AutoresetStep(
            frame=t(frame),
            reward=t(reward),
            done=t(done),
            terminated=t(terminated),
            truncated=t(truncated),
            reward_r=t(reward_r),
            initial_r=t(done.copy()),
            last_r=t(last_r),
            elapsed_r=t(elapsed_n),
            episode_r=t(episode_r),
            phys_r=t(phys_n),
            frame_r=t(frame_r),
            false=t(np.zeros((4, done.shape[0]), dtype=np.bool_)).unbind(0),
        )
        self._np_views = (out.phys_r, out.elapsed_r, out.episode_r, phys_n, elapsed_n, episode_r)
        return out

    def _autoreset_jit(
        self, phys: torch.Tensor, elapsed: torch.Tensor, episode: torch.Tensor, key: torch.Tensor, a: torch.Tensor
    ) -> _AutoresetStep:
        """The CPU step in one compiled call (:mod:`rlstruct.envs._jit_kernels`): :meth:`_autoreset_numpy`'s
        bits, into arrays allocated here (no caller has seen them)."""
        n = self._action_np.shape[0]
        frame = np.empty((n,) + self.observation_space.shape, dtype=np.float32)
        frame_r = np.empty_like(frame)
        reward, reward_r = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
        flags = np.empty((8, n), dtype=np.bool_)
        last_r = np.empty_like(self._action_np)
        phys_r, elapsed_r, episode_r = self._jit_autoreset_into(frame, frame_r, reward, reward_r, *flags, last_r)
        t = torch.from_numpy
        f = t(flags).unbind(0)
        out = _AutoresetStep(
            frame=t(frame),
            reward=t(reward),
            done=f[0],
            terminated=f[1],
            truncated=f[2],
            reward_r=t(reward_r),
            initial_r=f[3],
            last_r=t(last_r),
            elapsed_r=t(elapsed_r),
            episode_r=t(episode_r),
            phys_r=t(phys_r),
            frame_r=t(frame_r),
            false=f[4:],
        )
        self._np_views = (out.phys_r, out.elapsed_r, out.episode_r, phys_r, elapsed_r, episode_r)
        return out

    def _jit_autoreset_into(self, *observations: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Runs the compiled auto-reset kernel on the current state and :attr:`_action_np`, writing the
        observations into ``observations`` (the kernel's output arrays after the state's, in its order: frame,
        frame_r, reward, reward_r, the eight flags, last_r); returns the next ``(physics, elapsed, episode)``."""
        phys_np, elapsed_np, episode_np, key_np = self._numpy_state()
        phys_r, elapsed_r, episode_r = np.empty_like(phys_np), np.empty_like(elapsed_np), np.empty_like(episode_np)
        self._jit_autoreset(
            phys_np, elapsed_np, episode_np, key_np, self._action_np, *self._jit_inputs(phys_np), self._jit_constants,
            self._limit, *self._jit_draws, phys_r, elapsed_r, episode_r, *observations,
        )  # fmt: skip
        return phys_r, elapsed_r, episode_r

    def _step_episodic(self, a: torch.Tensor) -> StepResult:
        ids = self._ids
        if ids.shape[0] == self._n:
            phys, elapsed = self._phys, self._elapsed
        else:
            phys, elapsed = self._phys.index_select(1, ids), self._elapsed.index_select(0, ids)
        phys_n, elapsed_n, frame, reward, done, terminated, truncated = self._episodic_fn(phys, elapsed, a)
        if ids.shape[0] == self._n:
            self._phys, self._elapsed, self._last_action = phys_n, elapsed_n, a
        else:
            self._phys = self._phys.index_copy(1, ids, phys_n)
            self._elapsed = self._elapsed.index_copy(0, ids, elapsed_n)
            self._last_action = self._last_action.index_copy(0, ids, a)
        obs_next = DictTensor._trusted(
            {
                "frame": frame,
                "reward": reward,
                "done": done,
                "terminated": terminated,
                "truncated": truncated,
                "initial_state": torch.zeros_like(done),
                "last_action": a,
            }
        )
        # The one host sync of the episodic variant: the size of the running set.
        rows = torch.nonzero(~done).squeeze(1)
        ids_running = ids.index_select(0, rows)
        obs_running = obs_next.index(rows)
        self._ids = ids_running
        return (obs_next, ids), (obs_running, ids_running)

    def _episodic_kernel(
        self, phys: torch.Tensor, elapsed: torch.Tensor, a: torch.Tensor, xp: type = TorchOps
    ) -> tuple[Any, ...]:
        phys_n, reward, terminated = self._transition(xp, phys, a)
        elapsed_n = elapsed + 1
        truncated = elapsed_n >= self._limit
        done = terminated | truncated
        return phys_n, elapsed_n, self._frame(xp, phys_n), reward, done, terminated, truncated

    def _episodic_numpy(self, phys: torch.Tensor, elapsed: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self._episodic_kernel(*self._episodic_views(phys, elapsed), self._action_np, NumpyOps)
        return tuple(torch.from_numpy(x) for x in out)

    def _episodic_jit(self, phys: torch.Tensor, elapsed: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        phys_np, elapsed_np = self._episodic_views(phys, elapsed)
        a_np = self._action_np
        n = a_np.shape[0]
        phys_n, elapsed_n = np.empty_like(phys_np), np.empty_like(elapsed_np)
        frame = np.empty((n,) + self.observation_space.shape, dtype=np.float32)
        reward = np.empty(n, dtype=np.float32)
        flags = np.empty((3, n), dtype=np.bool_)
        self._jit_episodic(
            phys_np, elapsed_np, a_np, *self._jit_inputs(phys_np), self._jit_constants, self._limit,
            phys_n, elapsed_n, frame, reward, flags,
        )  # fmt: skip
        t = torch.from_numpy
        done, terminated, truncated = t(flags).unbind(0)
        return t(phys_n), t(elapsed_n), t(frame), t(reward), done, terminated, truncated

    def _episodic_views(self, phys: torch.Tensor, elapsed: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Numpy views of the episodic step's inputs (the kept views when they are the whole state)."""
        if phys is self._phys and elapsed is self._elapsed:
            return self._numpy_state()[:2]
        return phys.numpy(), elapsed.numpy()

    # ------------------------------------------------------------------ RNG
    def _draw(self, xp: type, key: Any, episode: Any) -> Any:
        """Uniform draws ``float64 [D, B]`` in ``(low_d, high_d)`` for episode ``episode[b]`` of env key ``key[b]``.

        Integer operations in ``int64`` with every intermediate below ``2**63``, then correctly rounded
        IEEE operations: numpy and torch on every device give the same bits. On the numpy path ``key`` is
        the ``uint32`` array of :meth:`_numpy_state` (and ``episode`` any integer array).
        """
        c = self._arrays(xp)
        if xp.is_numpy:
            # The same hash in uint32, whose wrap-around does the masking (numpy only: torch's unsigned
            # types lack kernels on some devices). Episodes are >= 0, so the cast is ``& _MASK32``.
            x = episode.astype(np.uint32) * _EPISODE_STRIDE_U32 + key
            return _mix32_u32(x + c.draw_salt_u32) * c.draw_scale + c.draw_offset
        x = (episode & _MASK32) * _EPISODE_STRIDE + key
        h = _mix32((x + c.draw_salt) & _MASK32)  # [D, 1] + [B]: [D, B]
        # low + (h + 1/2) * (high - low) / 2**32, with the 1/2 folded into the offset.
        return xp.float64(h) * c.draw_scale + c.draw_offset

    # ----------------------------------------------------------- state I/O
    def get_state(self) -> DictTensor:
        """Everything needed to continue exactly, as a DictTensor of ``n_envs`` rows (copies).

        Keys: ``physics`` ``float64 [n_envs, P]`` (gymnasium's order, see :attr:`physics_names`),
        ``elapsed_steps`` ``int64``, ``episode`` ``int64`` and ``rng_key`` ``int64`` (the RNG
        state), ``last_action``, ``running`` ``bool`` (always all true for auto-reset envs).

        Raises:
            BatcherStateError: ``reset`` was never called.
        """
        if not self._started:
            raise BatcherStateError(f"{type(self).__name__}.get_state called before reset(); call env.reset() first")
        running = torch.zeros(self._n, dtype=torch.bool, device=self.device)
        running[self._ids] = True
        return DictTensor._trusted(
            {
                "physics": self._phys.t().contiguous(),
                "elapsed_steps": self._elapsed.clone(),
                "episode": self._episode.clone(),
                "rng_key": self._rng_key.clone(),
                "last_action": self._last_action.clone(),
                "running": running,
            }
        )

    def set_state(self, state: DictTensor) -> None:
        """Restores a state from :meth:`get_state`, possibly taken on another device or env.

        The env then continues exactly as the one the state was taken from (with the same
        actions, the same observations), e.g. GPU envs seeded from a CPU state.

        Args:
            state: a DictTensor of ``n_envs`` rows with the keys of :meth:`get_state`, on any device.

        Raises:
            TypeError: ``state`` is not a DictTensor.
            SpaceError: a key is missing or has the wrong shape or dtype, or an auto-reset env is
                given a state where some env is not running.
            BatchSizeError: ``state`` does not have ``n_envs`` rows.
        """
        if not isinstance(state, DictTensor):
            raise TypeError(f"state must be a DictTensor from get_state(), got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise SpaceError(
                f"state lacks keys {missing}; pass the DictTensor returned by get_state() "
                f"(keys {list(_STATE_KEYS)})"
            )
        if state.n_elems() != self._n:
            raise BatchSizeError(
                f"state has {state.n_elems()} rows, this env has n_envs={self._n}; "
                f"take the state from an env with {self._n} envs or slice it with state.slice(0, {self._n})"
            )
        p = len(self.physics_names)
        expected = {
            "physics": ((p,), "floating"),
            "elapsed_steps": ((), "integer"),
            "episode": ((), "integer"),
            "rng_key": ((), "integer"),
            "last_action": (((), "integer") if self._discrete else (self.action_shape, "floating")),
            "running": ((), "bool"),
        }
        for k, (shape, kind) in expected.items():
            v = state[k]
            if tuple(v.shape[1:]) != shape or _dtype_kind(v.dtype) != kind:
                raise SpaceError(
                    f"state[{k!r}] must be {kind} [{self._n}{''.join(', ' + str(s) for s in shape)}], "
                    f"got {v.dtype} {list(v.shape)}; pass the DictTensor returned by get_state()"
                )
        dev = self.device
        running = state["running"].to(dev)
        if self.autoreset and not bool(running.all()):
            raise SpaceError(
                "state['running'] has finished envs but this env auto-resets (every env always runs); "
                "set it on an env built with autoreset=False, or mark every env running"
            )
        key = state["rng_key"].to(dev, torch.int64)
        episode = state["episode"].to(dev, torch.int64)
        if bool(((key < 0) | (key > _MASK32)).any()) or bool((episode < 0).any()):
            raise SpaceError(
                "state['rng_key'] must be in [0, 2**32) and state['episode'] >= 0; "
                "pass the DictTensor returned by get_state()"
            )
        self._phys = state["physics"].detach().to(dev, torch.float64).t().contiguous()
        self._elapsed = state["elapsed_steps"].to(dev, torch.int64, copy=True)
        self._episode = episode.clone()
        self._rng_key = key.clone()
        self._last_action = state["last_action"].detach().to(dev, self._last_action.dtype, copy=True)
        self._ids = self._ids_all if bool(running.all()) else torch.nonzero(running).squeeze(1)
        self._started = True
        if dev.type == "cpu":
            self._numpy_state()

    # ------------------------------------------------------------ validation
    def _zero_actions(self, n: int) -> torch.Tensor:
        if self.n_actions is not None:
            return torch.zeros(n, dtype=torch.int64, device=self.device)
        return torch.zeros((n,) + self.action_shape, dtype=torch.float32, device=self.device)

    def _check_env_info(self, env_info: DictTensor | None) -> None:
        if env_info is None:
            return
        if not isinstance(env_info, DictTensor):
            raise TypeError(f"env_info must be a DictTensor or None, got {type(env_info).__name__}")
        if env_info.empty():
            return
        if env_info.n_elems() != self._n:
            raise BatchSizeError(
                f"env_info must be empty or have n_envs={self._n} rows, got {env_info.n_elems()}; "
                "give one row per env"
            )
        if env_info.device().type != "cpu":
            raise DeviceMismatchError(
                f"env_info must be on cpu, got {env_info.device()}; build env_info on the CPU"
            )

    def _check_action(self, action: DictTensor, n_rows: int) -> torch.Tensor:
        if not isinstance(action, DictTensor):
            raise TypeError(
                f"action must be a DictTensor with an 'action' key, got {type(action).__name__}; "
                "wrap it: DictTensor({'action': a})"
            )
        a = action["action"]
        if a.device != self.device:
            raise DeviceMismatchError(
                f"action['action'] must be on {self.device}, got {a.device}; "
                f"move it with .to({str(self.device)!r}) (or wrap the env in a DeviceEnv)"
            )
        if a.dim() == 0 or a.shape[0] != n_rows:
            raise BatchSizeError(
                f"action['action'] must have one row per running env ({n_rows} rows, in the order of the last "
                f"returned ids), got shape {list(a.shape)}"
            )
        if self._discrete:
            if a.dim() != 1 or _dtype_kind(a.dtype) != "integer":
                raise SpaceError(
                    f"action['action'] must be an integer tensor of shape [{n_rows}] for {self.action_space}, "
                    f"got {a.dtype} {list(a.shape)}; pass e.g. torch.randint(0, {self.n_actions}, ({n_rows},))"
                )
            # A copy, so that the returned last_action never aliases the caller's tensor (integer
            # tensors never require grad).
            return self._copy_action(a, torch.int64, (n_rows,))
        shape = (n_rows,) + self.action_shape
        if _dtype_kind(a.dtype) != "floating" or (tuple(a.shape) != shape and not (a.dim() == 1 and shape[1:] == (1,))):
            raise SpaceError(
                f"action['action'] must be a floating tensor of shape {list(shape)} for {self.action_space}, "
                f"got {a.dtype} {list(a.shape)}; pass e.g. torch.zeros({n_rows}, 1)"
            )
        return self._copy_action(a, torch.float32, shape)

    def _copy_action(self, a: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A copy of ``a`` as ``dtype [shape]``; on the CPU a view of a numpy array, which the step's numpy
        kernels read as :attr:`_action_np`."""
        if self.device.type != "cpu":
            return a.detach().to(dtype, copy=True).view(shape)
        out, self._action_np = host_copy(a, np.int64 if dtype == torch.int64 else np.float32, shape)
        return out


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        return "floating"
    if dtype.is_complex:
        return "complex"
    return "integer"

