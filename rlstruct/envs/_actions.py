"""The checks of a step's ``action["action"]`` against a gymnasium action space: its shape and dtype (for the envs
that take any integer or floating dtype of the right kind and cast it: the gymnasium adapters, the JAX envs), and
its values (for every env): Discrete and MultiDiscrete actions in range, Box actions finite.

On the CPU the values are checked at every step; on an accelerator a :class:`DeferredActionCheck` records them on
the device, without a host sync, until a batcher reads the record where it synchronises anyway.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct._accel import Accelerator, accelerator_for
from rlstruct.errors import ActionRangeError, BatchSizeError, DeviceMismatchError, SpaceError

__all__ = ["ActionSpec", "DeferredActionCheck", "host_copy"]

# Offending values and env ids an ActionRangeError lists.
_SHOWN = 5

_INT_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_CPU = torch.device("cpu")


class ActionSpec:
    """What ``action["action"]`` must look like for an action space, and a valid dummy action.

    Args:
        space: a Discrete, MultiDiscrete or Box space.
        device: where actions must be.
        box_dtype: the dtype a Box's actions are cast to (default: the Box's own).

    Attributes:
        shape: the per-row shape. np_dtype, dtype: the canonical dtype (int64 for the discrete spaces).
        integer: whether the actions are integers. dummy: a valid action (numpy).
        deferred: the device-side record of the value checks on an accelerator (``None`` on the CPU, where
            :meth:`check_values` raises at once).

    Raises:
        SpaceError: another space.

    >>> from gymnasium import spaces
    >>> spec = ActionSpec(spaces.Discrete(2))
    >>> spec.check_values(torch.tensor([0, 1, 1]))
    >>> spec.check_values(torch.tensor([0, 5, -3]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlstruct.errors.ActionRangeError: action['action'] must be in Discrete(2), the integers in [0, 1], got 5, -3 ...
    """

    def __init__(self, space: gym.Space, *, device: torch.device = _CPU, box_dtype: np.dtype | None = None):
        self.device = device
        if isinstance(space, spaces.Discrete):
            self.shape, self.np_dtype, self.integer = (), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.MultiDiscrete):
            self.shape, self.np_dtype, self.integer = tuple(space.shape), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.Box):
            self.shape, self.np_dtype = tuple(space.shape), np.dtype(box_dtype or space.dtype)
            self.integer = not np.issubdtype(self.np_dtype, np.floating)
            dummy = np.clip(np.zeros(self.shape), space.low, space.high).astype(self.np_dtype)
        else:
            raise SpaceError(
                f"action_space must be Discrete, Box or MultiDiscrete, got {space}; "
                "wrap the env with a gymnasium action wrapper that exposes one of these"
            )
        self.dtype = torch.from_numpy(np.zeros((), self.np_dtype)).dtype
        self.dummy = dummy
        self.space = space
        # What check_values checks: "range" (Discrete, MultiDiscrete: low <= a <= high), "finite" (a floating Box) or
        # nothing (an integer Box: gymnasium's envs take it as given).
        self.values = None
        if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
            self.values = "range"
            if isinstance(space, spaces.Discrete):
                self.low, self.high = int(space.start), int(space.start + space.n - 1)
                # A start of 0 is one reduction: negatives viewed as uint64 are larger than any valid action.
                self._from_zero = self.low == 0
            else:
                self.low = np.asarray(space.start, np.int64)
                self.high = np.asarray(space.start + space.nvec - 1, np.int64)
                self._from_zero = False
        elif not self.integer:
            self.values = "finite"
        accel = accelerator_for(device)
        self.deferred = DeferredActionCheck(self, accel) if accel is not None and self.values else None
        # The per-step test on the host, ``a -> whether some value is out``: a single reduction where it can, called
        # without the Python wrappers of ndarray.max and .sum, which cost more than the reduction itself.
        self._host_bad = None if self.deferred is not None or self.values is None else self._host_test()
        kind = "an integer dtype" if self.integer else "a floating dtype"
        self.expected = f"shape [B{''.join(', ' + str(s) for s in self.shape)}] and {kind} (cast to {self.dtype})"

    def check(self, action: torch.Tensor, n_rows: int) -> tuple[int, ...]:
        """Validates ``action`` (one row per running env); returns the shape it stands for, ``[n_rows,
        *shape]`` (a 1-d Box takes ``[B]`` as well as ``[B, 1]``, like the torch simulators).

        Raises:
            SpaceError: not a tensor, or the wrong per-row shape or dtype kind.
            DeviceMismatchError: not on :attr:`device`. BatchSizeError: not ``n_rows`` rows.
        """
        if not isinstance(action, torch.Tensor):
            raise SpaceError(f"action['action'] must be a torch.Tensor, got {type(action).__name__}")
        if action.device != self.device:
            raise DeviceMismatchError(
                f"action['action'] must be on {self.device} (the env's device), got {action.device}; move it with "
                f".to({str(self.device)!r}) or wrap the env in DeviceEnv"
            )
        shape = tuple(action.shape)  # read once: each tensor attribute is a call into torch
        if len(shape) == 1 and self.shape == (1,):
            shape = (shape[0], 1)
        if len(shape) == 0 or shape[1:] != self.shape:
            raise SpaceError(
                f"action['action'] must have {self.expected}, got shape {list(shape)}; "
                "give one action per running env with the action space's shape"
            )
        dtype = action.dtype
        if dtype not in (_INT_DTYPES if self.integer else _FLOAT_DTYPES):
            raise SpaceError(
                f"action['action'] must have {self.expected}, got dtype {dtype}; convert it with .to({self.dtype})"
            )
        if shape[0] != n_rows:
            raise BatchSizeError(
                f"action['action'] must have one row per running env ({n_rows}), got {shape[0]}; "
                "act on the observation_running returned by the last reset/step, in the order of its ids"
            )
        return shape

    def host_copy(self, action: torch.Tensor, n_rows: int, ids: np.ndarray | None = None) -> tuple[torch.Tensor,
                                                                                                   np.ndarray]:
        """:meth:`check`, then a copy of the CPU ``action`` in the canonical dtype, as a tensor and as the array it
        views, whose values :meth:`check_values` checks (``ids``: the env of each row, ``None``: row ``i`` is env
        ``i``)."""
        t, a = host_copy(action, self.np_dtype, self.check(action, n_rows))
        self.check_values(t, a, ids)
        return t, a

    # ------------------------------------------------------------------ values
    def check_values(self, action: torch.Tensor, array: np.ndarray | None = None, ids: Any = None) -> None:
        """Checks the values of ``action`` (``[B, *shape]``, already checked for shape and dtype): at once on the CPU,
        recorded by :attr:`deferred` on an accelerator.

        Args:
            action: the step's actions, on the env's device.
            array: ``action``'s numpy view when the caller has one (a CPU env's host copy), to save a conversion.
            ids: the env of each row (``None``: row ``i`` is env ``i``), for the message.

        Raises:
            ActionRangeError: a Discrete/MultiDiscrete action out of range, or a NaN or infinite Box action.
        """
        bad = self._host_bad
        if bad is None:
            if self.deferred is not None:
                self.deferred.record(action)
            return
        a = action.numpy() if array is None else array
        if a.size and bad(a):
            raise self.error(a, ids)

    def _host_test(self) -> Any:
        """The host test of :meth:`check_values` for this space, on actions in the canonical dtype."""
        if self.values == "finite":
            if self.np_dtype.itemsize < 8:  # one pass, no temporary: a float64 sum of finite float32s cannot overflow
                return lambda a: not np.isfinite(np.add.reduce(a, axis=None, dtype=np.float64))
            return lambda a: not np.isfinite(a).all()
        if self._from_zero:
            # Negative int64s viewed as uint64 are larger than any valid action: one reduction.
            high = np.uint64(self.high)
            return lambda a: np.maximum.reduce(a.view(np.uint64), axis=None) > high
        low, high = self.low, self.high
        return lambda a: ((a < low) | (a > high)).any()

    def bad_rows(self, a: np.ndarray) -> np.ndarray:
        """The rows of ``a`` (``[B, *shape]``) with an action outside the space: bool ``[B]``."""
        if self.values == "finite":
            bad = ~np.isfinite(a)
        else:
            bad = (a < self.low) | (a > self.high)
        return bad.reshape(len(a), -1).any(1)

    def bad_rows_torch(self, a: torch.Tensor, low: Any, high: Any) -> torch.Tensor:
        """:meth:`bad_rows` on the device, without a host sync (``low``, ``high``: the bounds on the device)."""
        bad = ~torch.isfinite(a) if self.values == "finite" else (a < low) | (a > high)
        return bad.reshape(a.shape[0], -1).any(1) if bad.dim() > 1 else bad

    def describe(self) -> str:
        """What a valid action is, for messages."""
        if self.values == "finite":
            return f"{self.space}, finite values (a finite Box action goes to the env as given)"
        if isinstance(self.space, spaces.Discrete):
            return f"{self.space}, the integers in [{self.low}, {self.high}]"
        return (f"{self.space}, element k an integer in [low[k], high[k]] (low {self.low.tolist()}, high "
                f"{self.high.tolist()})")

    def error(self, a: np.ndarray, ids: Any = None, *, where: str = "", count: int | None = None) -> ActionRangeError:
        """The :class:`ActionRangeError` for the actions ``a`` (``[B, *shape]`` on the host): their offending values
        and env ids (a few), ``where`` said after them, ``count`` the offending rows when ``a`` is not all of them."""
        rows = np.flatnonzero(self.bad_rows(a))
        env_ids = rows if ids is None else np.asarray(torch.as_tensor(ids).cpu())[rows]
        values = ", ".join(_value(v) for v in a[rows[:_SHOWN]])
        shown_ids = ", ".join(str(int(i)) for i in env_ids[:_SHOWN])
        more = ", ..." if len(rows) > _SHOWN else ""
        n_bad = len(rows) if count is None else count
        fix = ("a NaN or infinite action usually means diverged weights or a log-std out of bounds: check the "
               "policy's outputs" if self.values == "finite" else
               "an out-of-range action is refused, never clamped: check the policy's output (an off-by-one, a "
               "shifted start, logits of another size than the action space's n)")
        return ActionRangeError(
            f"action['action'] must be in {self.describe()}, got {values}{more} at env ids {shown_ids}{more} "
            f"({n_bad} of {len(a)} rows){where}; {fix}"
        )


def host_copy(a: torch.Tensor, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
    """A copy of the CPU tensor ``a`` as ``dtype [shape]``: ``(tensor, array)`` sharing one fresh buffer.

    The copy and the cast are one numpy call: inside an env step, after the env's own numpy (or gymnasium)
    work, a torch ``copy_`` costs several times more. The env keeps the copy (as ``last_action``), so it
    never aliases a tensor the caller may reuse.
    """
    if a.requires_grad:
        a = a.detach()
    try:
        buf = np.array(a.numpy(), dtype=dtype)
        if buf.shape != shape:
            buf = buf.reshape(shape)
    except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16), negative-bit views
        buf = np.empty(shape, dtype=dtype)
        torch.from_numpy(buf).copy_(a.reshape(shape))
    return torch.from_numpy(buf), buf


def _on_host(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised CPU tensor like ``t`` (made without reading ``t``: no sync)."""
    return torch.empty(t.shape, dtype=t.dtype)


def _value(v: np.ndarray) -> str:
    return str(v.item()) if v.ndim == 0 else str(v.tolist())


class DeferredActionCheck:
    """The value checks of an env's actions on an accelerator, recorded on the device at every step without a host
    sync, and read later, where the reader synchronises anyway (a batcher: at the end of an acquisition).

    The record is three int64 device scalars updated in place (so that a CUDA graph capturing the steps replays the
    updates): the first step with an offending action since the last read (``-1``: none), the offending rows since
    then, and the steps since then; and a copy of the first offending step's actions when it has as many rows as
    the first step checked (every env running), to name the values and env ids.

    Args:
        spec: the env's action spec.
        accel: the accelerator of the env's device (:func:`rlstruct._accel.accelerator_for`).
    """

    def __init__(self, spec: ActionSpec, accel: Accelerator):
        self.spec, self._accel, self.device = spec, accel, spec.device
        dev = self.device
        self._initial = torch.tensor([-1, 0, 0], dtype=torch.int64, device=dev)
        self._stats = self._initial.clone()  # first offending step, offending rows, steps
        self._first, self._count, self._step = self._stats.unbind(0)
        self._low = torch.as_tensor(spec.low, device=dev) if spec.values == "range" else None
        self._high = torch.as_tensor(spec.high, device=dev) if spec.values == "range" else None
        self._saved: torch.Tensor | None = None  # the first offending step's actions
        self._host: torch.Tensor | None = None
        self._host_saved: torch.Tensor | None = None
        self._pending: tuple[Any, str] | None = None  # (event, what the snapshot covers) of the last snapshot

    def record(self, action: torch.Tensor) -> None:
        """Adds one step's actions (``[B, *shape]`` on the device, the env's own copy) to the record: device work
        only."""
        bad = self.spec.bad_rows_torch(action, self._low, self._high).sum()
        first_now = (bad > 0) & (self._first < 0)
        torch.where(first_now, self._step, self._first, out=self._first)
        self._count.add_(bad)
        if self._saved is None:
            self._saved = torch.zeros_like(action)
        if self._saved.shape == action.shape:
            torch.where(first_now, action, self._saved, out=self._saved)
        self._step.add_(1)

    def check(self, where: str = "") -> None:
        """Reads the record now (a host sync), clears it, and raises for what it holds.

        Raises:
            ActionRangeError: a step since the last read had an offending action; ``where`` names the steps.
        """
        stats = self._stats.tolist()
        saved = None if self._saved is None else self._saved.cpu()
        self._stats.copy_(self._initial)
        self._raise(stats, saved, where)

    def snapshot(self, where: str) -> None:
        """Queues a copy of the record to the host (no sync) and clears it, for :meth:`raise_pending`; ``where``
        names the steps it covers (e.g. an acquisition) in the error. A snapshot still pending is read first."""
        self.raise_pending(wait=True)
        if self._host is None:
            self._host = self._accel.pin(_on_host(self._stats))
        self._host.copy_(self._stats, non_blocking=True)
        if self._saved is not None:
            if self._host_saved is None:
                self._host_saved = self._accel.pin(_on_host(self._saved))
            self._host_saved.copy_(self._saved, non_blocking=True)
        event = self._accel.new_event()
        event.record(self._accel.current_stream(self.device))
        self._stats.copy_(self._initial)
        self._pending = (event, where)

    def raise_pending(self, *, wait: bool) -> None:
        """Reads the last :meth:`snapshot` once its copy is done: at once with ``wait`` (blocking on that copy only),
        else only if it is done already (otherwise it stays pending).

        Raises:
            ActionRangeError: the snapshot holds an offending action.
        """
        if self._pending is None:
            return
        event, where = self._pending
        if wait:
            event.synchronize()
        elif not event.query():
            return
        self._pending = None
        stats = self._host.tolist()
        self._raise(stats, self._host_saved, where)

    def _raise(self, stats: list[int], saved: torch.Tensor | None, where: str) -> None:
        first, count, steps = stats
        if first < 0:
            return
        at = f" at step {first}, the first of {count} offending rows over {steps} step{'s' * (steps != 1)}{where}"
        if saved is not None:
            a = saved.numpy()
            if self.spec.bad_rows(a).any():
                raise self.spec.error(a, where=at)
        raise ActionRangeError(
            f"action['action'] must be in {self.spec.describe()}, got an offending row{at} (the values of a step of "
            "fewer rows than envs are not kept); an out-of-range action is refused, never clamped: check the "
            "policy's output"
        )
