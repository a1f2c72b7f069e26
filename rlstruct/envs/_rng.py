"""The counter-based RNG of the torch simulators: one hash, its constants, and the reset draws built on it.

Draw ``d`` of episode ``e`` of env ``k`` is ``mix32(counter(key_k, e, salt_d))`` mapped to ``(low_d, high_d)``,
where :func:`mix32` is a two-multiply xorshift hash with odd multipliers below ``2**31``,
``counter(key, e, salt) = (e * EPISODE_STRIDE + key + salt) mod 2**32`` and ``key_k`` (:func:`env_keys`) a hash
of ``(seed, k)``. Everything is computed in ``int64`` with every intermediate below ``2**63`` (no signed
overflow, so CPU and CUDA give the same bits), or in ``uint32`` numpy arrays whose wrap-around does the
masking (``wrap32=True``: the same bits in fewer calls). So env ``k``'s episodes depend on ``(seed, k, e)``
only: not on ``n_envs``, on the device, on when the other envs finish, or on the order of calls.

:func:`mix32` and :func:`counter` are the one definition of the algorithm: the compiled CPU kernels
(:mod:`rlstruct.envs._jit_kernels`) compile these very functions.

>>> import numpy as np
>>> x = np.array([0, 1, 2**32 - 1], dtype=np.int64)
>>> bool((mix32(x) == mix32(x.astype(np.uint32), True)).all())
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["MASK32", "mix32", "counter", "env_keys", "draw_table", "uniform_draws", "step_uniforms"]

MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a value below 2**32 times one of them stays below 2**63.
MIX_C1 = 0x21F0AAAD
MIX_C2 = 0x735A2D97
EPISODE_STRIDE = 0x61C88647  # 2**32 - golden-ratio constant, below 2**31
DRAW_STRIDE = 0x2C1B3C6D
ENV_STRIDE = 0x5BD1E995 & 0x7FFFFFFF
SEED_SALT = (0x3C6EF372, 0x1B873593)
STEP_SALT = 0x7F4A7C15
# The stream of a random start (MinAtarEnv's random_start_steps): its length and its actions, apart from the game's.
START_SALT = 0x4F1BBCDD
STEP_STRIDE = 0x68E31DA5 & 0x7FFFFFFF
TWO_POW_M32 = 2.0**-32


def mix32(x: Any, wrap32: bool = False) -> Any:
    """A 32-bit avalanche hash of ``x``, same range out.

    Args:
        x: values in ``[0, 2**32)``: an ``int64`` tensor, array or scalar, or (``wrap32``) a ``uint32`` numpy array.
        wrap32: ``x`` is ``uint32``, whose arithmetic wraps modulo ``2**32``: the masks are implicit (the same bits
            in two fewer calls).

    >>> int(mix32(torch.tensor(1)))
    2261973619
    """
    x = x ^ (x >> 16)
    x = x * MIX_C1
    if not wrap32:
        x = x & MASK32
    x = x ^ (x >> 15)
    x = x * MIX_C2
    if not wrap32:
        x = x & MASK32
    return x ^ (x >> 15)


def counter(key: Any, episode: Any, salt: Any, wrap32: bool = False) -> Any:
    """``(episode * EPISODE_STRIDE + key + salt) mod 2**32``: the counter hashed for a draw.

    Args:
        key: env keys in ``[0, 2**32)`` (``[B]``).
        episode: episode indices ``>= 0`` (``[B]``), any integer dtype.
        salt: the draws' salts in ``[0, 2**32)`` (``[D, 1]`` for ``[D, B]`` counters, or scalars).
        wrap32: every operand is ``uint32`` (``episode`` cast to it, which is ``& MASK32`` for values ``>= 0``).
    """
    if wrap32:
        return episode * EPISODE_STRIDE + key + salt
    return ((episode & MASK32) * EPISODE_STRIDE + key + salt) & MASK32


def env_keys(seed: int, n_envs: int, device: torch.device, first: int = 0) -> torch.Tensor:
    """``int64 [n_envs]`` in ``[0, 2**32)``: the RNG keys of envs ``first, ..., first + n_envs - 1``, the key of env
    ``k`` depending on ``(seed, k)`` only.

    >>> cpu = torch.device("cpu")
    >>> bool((env_keys(0, 8, cpu)[:4] == env_keys(0, 4, cpu)).all()), torch.equal(env_keys(0, 8, cpu)[4:],
    ...                                                                          env_keys(0, 4, cpu, first=4))
    (True, True)
    """
    seed64 = seed & 0xFFFFFFFFFFFFFFFF
    halves = torch.tensor([seed64 & MASK32, seed64 >> 32], dtype=torch.int64)
    halves = mix32(halves ^ torch.tensor(SEED_SALT, dtype=torch.int64))
    base = mix32(halves[:1] ^ mix32(halves[1:] + 1))
    k = torch.arange(first, first + n_envs, dtype=torch.int64)
    keys = mix32(mix32((base + (k & MASK32) * ENV_STRIDE) & MASK32) ^ (k >> 32))
    return keys.to(device)


def draw_table(low: tuple[float, ...], high: tuple[float, ...]) -> dict[str, torch.Tensor]:
    """The per-draw constants of :func:`uniform_draws` for draws uniform in ``(low[d], high[d])``.

    Returns:
        ``draw_salt`` ``int64 [D, 1]``, ``draw_scale`` and ``draw_offset`` ``float64 [D, 1]`` (CPU tensors).
    """
    n_draws = len(low)
    lo = torch.tensor(low, dtype=torch.float64)
    scale = (torch.tensor(high, dtype=torch.float64) - lo) * TWO_POW_M32
    return {
        "draw_salt": (torch.arange(n_draws, dtype=torch.int64) * DRAW_STRIDE & MASK32).view(-1, 1),
        "draw_scale": scale.view(-1, 1),
        # low + (h + 1/2) * (high - low) / 2**32, with the 1/2 folded into the offset.
        "draw_offset": (lo + 0.5 * scale).view(-1, 1),
    }


def uniform_draws(key: Any, episode: Any, table: Any) -> Any:
    """Uniform draws ``float64 [D, B]`` in ``(low_d, high_d)``: episode ``episode[b]`` of the env with key ``key[b]``.

    Integer operations, then correctly rounded IEEE operations: numpy and torch on every device give the same bits.

    Args:
        key: ``int64 [B]`` tensor in ``[0, 2**32)``, or a ``uint32`` numpy array (then ``episode`` is any integer
            numpy array and the hash runs in ``uint32``).
        episode: ``int64 [B]``, ``>= 0``.
        table: :func:`draw_table`'s constants as attributes, tensors on ``key``'s device or numpy arrays
            (with ``draw_salt_u32``, the salts as ``uint32``, for numpy keys).

    >>> from types import SimpleNamespace
    >>> t = draw_table((0.0,), (1.0,))
    >>> key, episode = env_keys(0, 3, torch.device("cpu")), torch.zeros(3, dtype=torch.int64)
    >>> a = uniform_draws(key, episode, SimpleNamespace(**t))
    >>> n = SimpleNamespace(**{k: v.numpy() for k, v in t.items()}, draw_salt_u32=t["draw_salt"].numpy().astype("u4"))
    >>> b = uniform_draws(key.numpy().astype(np.uint32), episode.numpy(), n)
    >>> a.shape, torch.equal(a, torch.from_numpy(b))
    (torch.Size([1, 3]), True)
    """
    if isinstance(key, np.ndarray):
        # uint32, whose wrap-around does the masking (numpy only: torch's unsigned types lack kernels on some
        # devices). Episodes are >= 0, so the cast is ``& MASK32``.
        h = mix32(counter(key, episode.astype(np.uint32), table.draw_salt_u32, True), True)
        return h * table.draw_scale + table.draw_offset
    h = mix32(counter(key, episode, table.draw_salt))  # [B] and [D, 1]: [D, B]
    return h.to(torch.float64) * table.draw_scale + table.draw_offset


def step_uniforms(key: torch.Tensor, episode: torch.Tensor, step: torch.Tensor, n_draws: int,
                  salt: int = STEP_SALT) -> torch.Tensor:
    """Uniform draws ``float64 [B, n_draws]`` in ``(0, 1)`` for step ``step[b]`` of episode ``episode[b]`` of the env
    with key ``key[b]``: draw ``d`` is ``mix32(mix32(s + step * STEP_STRIDE) + d * DRAW_STRIDE)``, ``s`` the
    episode's stream (``mix32`` of :func:`counter` with the salt ``salt``, ``STEP_SALT`` for the game's steps), all
    modulo ``2**32``.

    So a step's draws depend on ``(key, episode, step, d)`` only (the simulators whose steps are random draw
    them here; the reset draws are :func:`uniform_draws`'s, another stream).

    Args:
        key: ``int64 [B]`` in ``[0, 2**32)``.
        episode: ``int64 [B]``, ``>= 0``.
        step: ``int64 [B]``, ``>= 0``: the steps already taken in the episode.
        n_draws: ``D >= 1``.
        salt: the stream's salt in ``[0, 2**32)``: another salt (``START_SALT``) is another stream.

    >>> key = env_keys(0, 4, torch.device("cpu"))
    >>> zero = torch.zeros(4, dtype=torch.int64)
    >>> u = step_uniforms(key, zero, zero, 3)
    >>> u.shape, bool(((u > 0) & (u < 1)).all()), torch.equal(step_uniforms(key[2:], zero[2:], zero[2:], 3), u[2:])
    (torch.Size([4, 3]), True, True)
    """
    stream = mix32(counter(key, episode, salt))
    s = mix32((stream + (step & MASK32) * STEP_STRIDE) & MASK32)
    salts = torch.arange(n_draws, dtype=torch.int64, device=key.device) * DRAW_STRIDE & MASK32
    h = mix32((s.unsqueeze(1) + salts) & MASK32)
    return (h.to(torch.float64) + 0.5) * TWO_POW_M32
