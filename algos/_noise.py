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

from rlstruct._accel import accelerator_for
from rlstruct.envs._rng import EPISODE_STRIDE, MASK32, env_keys, mix32

__all__ = ["CounterNoise", "GeneratorNoise", "NoiseSource"]

# Set in the high half of the seed that env_keys hashes: the agent's keys are not the env keys of the same seed.
_AGENT_SALT = 0x5EED_A6E7 << 32
_COLUMN_STRIDE = 0x2C1B3C6D
_TWO_POW_M23 = 2.0**-23
#: the most steps of one draw the CPU computes at once
BLOCK_STEPS = 64
# and the most draws in a block (memory)
_BLOCK_ELEMENTS = 1 << 16


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
    advanced in place, so that a CUDA graph that captures the agent's calls replays the count; so it is on a CPU
    that has an accelerator (a test's recording fake, :func:`rlstruct._accel.installed`), whose graphs replay the
    same code. Rows: ``B`` rows are envs ``env_index, ..., env_index + B - 1`` (every env of an auto-reset batcher's
    worker; an episodic batcher's shrinking running set draws as its first rows).

    On the CPU a draw asked for at consecutive steps is computed for a block of steps at once (a step only adds
    ``t * EPISODE_STRIDE`` to the counters), the block growing up to :data:`BLOCK_STEPS` steps, and served a step at a
    time: the same bits as one step's draws, in a few array operations per block instead of per step. What a draw
    returns is then a view of that block: read it, do not write into it.

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
        self._numpy = self.device.type == "cpu" and accelerator_for(self.device) is None
        # (rows, columns, stream) -> the counters at step 0 (key + salt): uint32 [rows * columns] on the CPU
        self._counters: dict[tuple[int, int, int], Any] = {}
        # on the CPU, (kind, shape, stream, high) -> [first step, the steps' draws, steps in the next block]
        self._blocks: dict[tuple, list] = {}
        self._step: Any = 0 if self._numpy else torch.zeros((), dtype=torch.int64, device=self.device)

    def _counters_of(self, B: int, n_columns: int, stream: int) -> Any:
        cached = self._counters.get((B, n_columns, stream))
        if cached is None:
            keys = env_keys(self.seed | _AGENT_SALT, B, self.device, first=self.env_index).view(B, 1)
            columns = torch.arange(n_columns, dtype=torch.int64) + (stream << 20)
            cached = (keys + mix32((columns * _COLUMN_STRIDE + 1) & MASK32).to(self.device)) & MASK32
            if self._numpy:
                cached = cached.numpy().astype(np.uint32).reshape(-1)
            self._counters[(B, n_columns, stream)] = cached
        return cached

    def _bits(self, shape: Sequence[int], stream: int) -> torch.Tensor:
        """Off the CPU: hashes in ``[0, 2**32)``, ``int64`` of shape ``[B, *rest]``."""
        counters = self._counters_of(shape[0], math.prod(shape[1:]), stream)
        return mix32((counters + (self._step & MASK32) * EPISODE_STRIDE) & MASK32).view(*shape)

    def _block_bits(self, shape: Sequence[int], stream: int, start: int, n_steps: int) -> np.ndarray:
        """On the CPU: hashes in ``[0, 2**32)``, ``uint32 [n_steps, B * prod(rest)]``, of steps ``start, ...``."""
        counters = self._counters_of(shape[0], math.prod(shape[1:]), stream)
        # uint64 products wrap modulo 2**64, so their low 32 bits are the step offsets modulo 2**32.
        steps = (np.arange(start, start + n_steps, dtype=np.uint64) * np.uint64(EPISODE_STRIDE)).astype(np.uint32)
        # uint32 wraps modulo 2**32: mix32 with its masks implicit.
        return mix32(counters + steps[:, None], True)

    def _block_uniform(self, shape: Sequence[int], stream: int, start: int, n_steps: int) -> torch.Tensor:
        u = (self._block_bits(shape, stream, start, n_steps) >> 9).astype(np.float32)
        u += np.float32(0.5)
        u *= np.float32(_TWO_POW_M23)
        return torch.from_numpy(u).view(n_steps, *shape)

    def _block(self, kind: str, shape: Sequence[int], stream: int, high: int, start: int,
               n_steps: int) -> torch.Tensor:
        """``[n_steps, *shape]``: the draws of steps ``start, ...``."""
        if kind == "uniform":
            return self._block_uniform(shape, stream, start, n_steps)
        if kind == "normal":
            u1 = self._block_uniform(shape, stream | 1 << 10, start, n_steps)
            u2 = self._block_uniform(shape, stream | 2 << 10, start, n_steps)
            return _box_muller(u1, u2)
        bits = self._block_bits(shape, stream, start, n_steps).astype(np.uint64)
        return torch.from_numpy(((bits * np.uint64(high)) >> np.uint64(32)).astype(np.int64)).view(n_steps, *shape)

    def _served(self, kind: str, shape: Sequence[int], stream: int, high: int = 0) -> torch.Tensor:
        """On the CPU: this step's draws, from the block that holds them (a new one, twice as long, when the last
        block of the same draw has run out, or one step when the draw is new or skipped steps)."""
        shape = tuple(shape)
        key = (kind, shape, stream, high)
        block = self._blocks.get(key)
        if block is not None:
            k = self._step - block[0]
            if 0 <= k < len(block[1]):
                return block[1][k]
            n_steps = block[2] if k == len(block[1]) else 1
        else:
            n_steps = 1
        n_steps = min(n_steps, max(1, _BLOCK_ELEMENTS // max(1, math.prod(shape))))
        draws = self._block(kind, shape, stream, high, self._step, n_steps).unbind(0)
        self._blocks[key] = [self._step, draws, min(2 * n_steps, BLOCK_STEPS)]
        return draws[0]

    def uniform(self, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Uniform ``float32`` in ``(0, 1)`` of ``shape`` ``[B, ...]``: 23 hashed bits, centred (exact in float32)."""
        if self._numpy:
            return self._served("uniform", shape, stream)
        return ((self._bits(shape, stream) >> 9).to(torch.float32) + 0.5) * _TWO_POW_M23

    def normal(self, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Standard normal ``float32`` of ``shape`` ``[B, ...]`` (Box-Muller over two uniform streams of their own)."""
        if self._numpy:
            return self._served("normal", shape, stream)
        return _box_muller(self.uniform(shape, stream | 1 << 10), self.uniform(shape, stream | 2 << 10))

    def integers(self, high: int, shape: Sequence[int], stream: int = 0) -> torch.Tensor:
        """Uniform ``int64`` in ``[0, high)`` of ``shape`` ``[B, ...]``."""
        if self._numpy:
            return self._served("integers", shape, stream, high)
        return (self._bits(shape, stream) * high) >> 32

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


def _box_muller(u1: torch.Tensor, u2: torch.Tensor) -> torch.Tensor:
    # Elementwise, each element computed alike wherever it lies in the tensor: a block's draws are a step's draws.
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


#: what an agent draws from
NoiseSource = GeneratorNoise | CounterNoise
