"""The sum tree of prioritized replay (Schaul et al. 2016, proportional): priorities in the leaves of a binary tree
over tensors, updated and sampled a batch at a time (one step per tree level, none per transition).
"""

from __future__ import annotations

import torch

__all__ = ["SumTree", "importance_weights"]


class SumTree:
    """``capacity`` non-negative priorities in the leaves of a complete binary tree whose nodes hold the sum of their
    leaves; :meth:`find` maps a mass in ``[0, total)`` to the leaf whose prefix sum reaches it.

    Float64 nodes, so that sums over a million leaves keep the precision of each one.

    Args:
        capacity: leaves used (the tree has the next power of two).
        device: where the tree lives.

    >>> tree = SumTree(3, "cpu")
    >>> tree.update(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 1.0]))
    >>> float(tree.total), tree.find(torch.tensor([0.5, 1.5, 2.9, 3.5])).tolist()
    (4.0, [0, 1, 1, 2])
    """

    def __init__(self, capacity: int, device: torch.device | str):
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        self.sum = torch.zeros(2 * self.leaves, dtype=torch.float64, device=device)

    @property
    def total(self) -> torch.Tensor:
        """The sum of the priorities, 0-d."""
        return self.sum[1]

    def update(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Sets the priorities of leaves ``index`` (``int64 [N]``; a repeated index takes one of its values).

        Args:
            index: ``int64 [N]`` leaves.
            priority: ``[N]`` non-negative priorities.
        """
        node = index.to(self.sum.device) + self.leaves
        self.sum[node] = priority.to(self.sum)
        for _ in range(self.depth):
            # A parent twice in `node` is written twice with the same sum: no need to deduplicate.
            node = node // 2
            left, right = 2 * node, 2 * node + 1
            self.sum[node] = self.sum[left] + self.sum[right]

    def get(self, index: torch.Tensor) -> torch.Tensor:
        """The priorities of leaves ``index``, ``float64 [N]``."""
        return self.sum[index + self.leaves]

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """The leaf of each ``mass`` (``[N]``, in ``[0, total)``): the first whose prefix sum exceeds it, never a leaf
        of zero priority (a mass that rounding puts past the last positive leaf stays on it), ``int64 [N]``."""
        mass = mass.to(self.sum)
        node = torch.ones_like(mass, dtype=torch.int64)
        for _ in range(self.depth):
            left = self.sum[2 * node]
            go_right = (mass >= left) & (self.sum[2 * node + 1] > 0)
            mass = torch.where(go_right, mass - left, mass)
            node = 2 * node + go_right
        return node - self.leaves


def importance_weights(priority: torch.Tensor, beta: float) -> torch.Tensor:
    """Schaul et al.'s importance-sampling weights ``w_i = (N P(i))^-beta / max_j w_j`` of a sampled batch
    (``priority [B]``), with ``P(i) = p_i / sum p`` and the maximum over the batch, which reduces them to
    ``(p_i / min_batch p)^-beta``: 1 for the batch's least likely transition, less for the others, ``float [B]``.

    >>> importance_weights(torch.tensor([4.0, 1.0, 2.0]), 0.5).tolist()
    [0.5, 1.0, 0.7071067690849304]
    """
    # Over the batch, not the buffer: the buffer's least likely transition sits at the floor eps^alpha, and dividing
    # by its weight would shrink every update by (eps^alpha / p_i)^beta (docs/algorithms/dqn.md).
    return (priority / priority.min()).pow(-beta).float()
