"""What the tests holding a compiled MinAtar step (numba's, ``torch.compile``'s) to the torch step share: the time
limits that end episodes both ways, the actions, and the bit-for-bit comparison of two DictTensors."""

from __future__ import annotations

import torch

from rlstruct import DictTensor

# Short enough that some episodes are truncated (a random Breakout player misses the ball within some 20 steps),
# long enough that some score (a Freeway crossing takes 27 steps at least); 32 for the other games.
LIMITS = {"Breakout": 12, "Freeway": 64}


def biased_actions(n_actions: int, n_envs: int, n_steps: int) -> list[torch.Tensor]:
    """Random actions, action 1 eight times as likely as each other (Freeway's up: its chicken reaches the top and
    the step's draws are used; Breakout's left: the ball is missed)."""
    weights = torch.ones(n_actions)
    weights[1] = 8.0
    gen = torch.Generator().manual_seed(0)
    return [torch.multinomial(weights, n_envs, replacement=True, generator=gen) for _ in range(n_steps)]


def assert_same_bits(x: DictTensor, y: DictTensor) -> None:
    """The same keys in the same order, dtypes and bits."""
    assert list(x.keys()) == list(y.keys())
    for k in y.keys():
        assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
