"""Frames of the 10x10 MinAtar grid: ``bool [B, 10, 10, C]`` built from cells, with batched scatters."""

from __future__ import annotations

import torch

__all__ = ["SIZE", "frame", "cell_index"]

SIZE = 10


def cell_index(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The flat index ``y * 10 + x`` of the cells ``(y, x)`` (same shapes)."""
    return y * SIZE + x


def frame(
    n_channels: int, cells: list[tuple[int, torch.Tensor, torch.Tensor]],
    planes: tuple[tuple[int, torch.Tensor], ...] = (),
) -> torch.Tensor:
    """A frame ``bool [B, 10, 10, C]`` (contiguous) whose set cells are ``cells`` and ``planes``.

    Args:
        n_channels: ``C``.
        cells: ``(channel, index, on)``: the flat cell indices ``int64 [B, K]`` (in ``[0, 100)`` where ``on``) of
            channel ``channel`` set where ``on`` (``bool [B, K]``); an off entry writes nothing.
        planes: ``(channel, plane)``: the whole channel ``channel`` is ``plane`` (``bool [B, 10, 10]``), written
            before the cells.

    >>> f = frame(2, [(1, torch.tensor([[0, 99]]), torch.tensor([[True, False]]))])
    >>> f.shape, f.sum().item(), bool(f[0, 0, 0, 1])
    (torch.Size([1, 10, 10, 2]), 1, True)
    """
    first = cells[0][1]
    n = first.shape[0]
    flat = torch.zeros(n, SIZE * SIZE * n_channels + 1, dtype=torch.bool, device=first.device)
    dump = SIZE * SIZE * n_channels  # the off entries land in a last column, cut below
    grid = flat[:, :dump].view(n, SIZE * SIZE, n_channels)
    for c, plane in planes:
        grid[:, :, c] = plane.reshape(n, SIZE * SIZE)
    idx = torch.cat([torch.where(on, index.clamp(0, SIZE * SIZE - 1) * n_channels + c, dump) for c, index, on in cells],
                    dim=1)
    flat.scatter_(1, idx, True)
    return grid.reshape(n, SIZE, SIZE, n_channels).contiguous()
