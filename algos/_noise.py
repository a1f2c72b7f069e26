"""Where the algorithms' agents draw their randomness from: a torch generator of the process
(:class:`GeneratorNoise`), or counter-based draws keyed by ``(seed, global env index, step)`` (:class:`CounterNoise`),
which do not depend on how the envs are split over processes.

Both answer ``uniform``, ``normal`` and ``integers`` for ``B`` rows, and ``advance`` once per agent call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlstruct.envs._rng import EPISODE_STRIDE, MASK32, MIX_C1, MIX_C2, env_keys, mix32

__all__ = ["CounterNoise", "GeneratorNoise", "NoiseSource"]

# Set in the high half of the seed that env_keys hashes: the agent's keys are not the env keys of the same seed.
_AGENT_SALT = 0x5EED_A6E7 << 32
_COLUMN_STRIDE = 0x2C1B3C6D
_TWO_POW_M23 = 2.0**-23


class GeneratorNoise:
    """Draws from one ``torch.Generator`` (the process's stream: they depend on the rows the process steps)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def uniform(self, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Uniform ``float32`` in ``[0, 1)`` of ``shape``."""
        return torch.rand(tuple(shape), generator=self.generator, device=self.generator.device, dtype=torch.float32)

    def normal(self, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Standard normal ``float32`` of ``shape``."""
        return torch.randn(tuple(shape), generator=self.generator, device=self.generator.device, dtype=torch.float32)

    def integers(self, high: int, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Uniform ``int64`` in ``[0, high)`` of ``shape``."""
        return torch.randint(high, tuple(shape), generator=self.generator, device=self.generator.device)

    def advance(self) -> None:
        """Nothing: the generator moves on as it draws."""

    def get_state(self) -> torch.Tensor:
        """The generator's state (``uint8``)."""
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        """Takes back a :meth:`get_state`."""
        self.generator.set_state(state)


class CounterNoise:
    """Counter-based draws: column ``c`` of stream ``s`` for row ``j`` at step ``t`` is
    ``mix32(key_j + salt_(s, c) + t * EPISODE_STRIDE)`` (:func:`~rlstruct.envs._rng.mix32`, modulo ``2**32``, the
    scheme of the torch simulators' own draws), ``key_j`` the key of env ``env_index + j`` of ``seed``
    (:func:`~rlstruct.envs._rng.env_keys`, salted apart from the envs' keys) and ``salt_(s, c)`` a hash of ``(s, c)``.

    Integer operations, then exact float32 ones: uniform draws are the same bits on every device (the CPU hashes in
    ``uint32`` numpy arrays, other devices in ``int64`` tensors, as the torch simulators do); normal draws (Box-Muller's
    ``log`` and ``cos``) agree up to those functions' rounding. Off the CPU the step ``t`` is a device tensor
    advanced in place, so that a CUDA graph that captures the agent's calls replays the count. Rows: ``B`` rows are
    envs ``env_index, ..., env_index + B - 1`` (every env of an auto-reset batcher's worker; an episodic batcher's
    shrinking running set draws as its first rows).

    >>> a = CounterNoise(7, 0, torch.device("cpu"))
    >>> b = CounterNoise(7, 2, torch.device("cpu"))
    >>> torch.equal(a.uniform((4, 3))[2:], b.uniform((2, 3))), bool((a.uniform((4, 3)) > 0).all())
    (True, True)
    >>> x = a.uniform((4, 3)); a.advance(); bool((a.uniform((4, 3)) != x).all())
    True
    """

    def __init__(self, seed: int, env_index: int, device: torch.device):
        self.seed = seed
        self.env_index = env_index
        self.device = torch.device(device)
        self._numpy = self.device.type == "cpu"
        # (rows, columns, stream) -> the counters at step 0 (key + salt), and on the CPU two uint32 arrays to hash in
        self._counters: dict[tuple[int, int, int], tuple] = {}
        self._step: Any = 0 if self._numpy else torch.zeros((), dtype=torch.int64, device=self.device)

    def _bits(self, shape: Sequence[int], stream: int) -> Any:
        """Hashes in ``[0, 2**32)`` of shape ``[B, *rest]``: on the CPU a ``uint32`` scratch array, overwritten by the
        next call (read it at once), else an ``int64`` tensor."""
        B, rest = shape[0], tuple(shape[1:])
        n_columns = math.prod(rest)
        cached = self._counters.get((B, n_columns, stream))
        if cached is None:
            keys = env_keys(self.seed | _AGENT_SALT, B, self.device, first=self.env_index).view(B, 1)
            columns = torch.arange(n_columns, dtype=torch.int64) + (stream << 20)
            counters = (keys + mix32((columns * _COLUMN_STRIDE + 1) & MASK32).to(self.device)) & MASK32
            if self._numpy:  # the counters, the hash and a scratch for its shifts, allocated once
                counters = counters.numpy().astype(np.uint32)
                cached = (counters, np.empty_like(counters), np.empty_like(counters))
            else:
                cached = (counters,)
            self._counters[(B, n_columns, stream)] = cached
        if self._numpy:
            # uint32 wraps modulo 2**32: mix32 with its masks implicit, in place.
            counters, x, scratch = cached
            np.add(counters, np.uint32(self._step * EPISODE_STRIDE & MASK32), out=x)
            for shift, multiplier in ((16, MIX_C1), (15, MIX_C2), (15, None)):
                np.right_shift(x, shift, out=scratch)
                x ^= scratch
                if multiplier is not None:
                    x *= multiplier
            return x.reshape(B, *rest)
        return mix32((cached[0] + (self._step & MASK32) * EPISODE_STRIDE) & MASK32).view(B, *rest)

    def uniform(self, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Uniform ``float32`` in ``(0, 1)`` of ``shape`` ``[B, ...]``: 23 hashed bits, centred (exact in float32)."""
        bits = self._bits(shape, stream) >> 9
        if self._numpy:
            u = bits.astype(np.float32)
            u += np.float32(0.5)
            u *= np.float32(_TWO_POW_M23)
            return torch.from_numpy(u)
        return (bits.to(torch.float32) + 0.5) * _TWO_POW_M23

    def normal(self, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Standard normal ``float32`` of ``shape`` ``[B, ...]`` (Box-Muller over two uniform streams of their own)."""
        u1, u2 = self.uniform(shape, stream | 1 << 10), self.uniform(shape, stream | 2 << 10)
        return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)

    def integers(self, high: int, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Uniform ``int64`` in ``[0, high)`` of ``shape`` ``[B, ...]``."""
        bits = self._bits(shape, stream)
        if self._numpy:
            return torch.from_numpy(((bits.astype(np.uint64) * np.uint64(high)) >> np.uint64(32)).astype(np.int64))
        return (bits * high) >> 32

    def advance(self) -> None:
        """The next step's draws."""
        self._step += 1

    def get_state(self) -> torch.Tensor:
        """The step count, ``int64 [1]`` (on the device off the CPU).

        >>> a = CounterNoise(7, 0, torch.device("cpu")); a.advance(); b = CounterNoise(7, 0, torch.device("cpu"))
        >>> b.set_state(a.get_state()); torch.equal(a.uniform((2, 3)), b.uniform((2, 3)))
        True
        """
        return torch.as_tensor(self._step, dtype=torch.int64).reshape(1)

    def set_state(self, state: torch.Tensor) -> None:
        """Takes back a :meth:`get_state`; off the CPU in place, so that a captured CUDA graph reads it."""
        if self._numpy:
            self._step = int(state.reshape(()))
        else:
            self._step.copy_(state.reshape(()))


#: what an agent draws from
NoiseSource = GeneratorNoise | CounterNoise
