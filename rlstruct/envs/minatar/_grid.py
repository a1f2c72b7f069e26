"""Frames of the 10x10 MinAtar grid: ``bool [B, 10, 10, C]`` built from cells, with batched scatters."""

from __future__ import annotations

import torch

__all__ = ["SIZE", "frame", "cell_index"]

SIZE = 10


def cell_index(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The flat index ``y * 10 + x`` of the cells ``(y, x)`` (same shapes)."""
    return y * SIZE + x


def frame(
    n_channels: int, cells: list[tuple[int | torch.Tensor, torch.Tensor, torch.Tensor | None]],
    planes: tuple[tuple[int, torch.Tensor], ...] = (),
) -> torch.Tensor:
    """A frame ``bool [B, 10, 10, C]`` whose set cells are ``cells`` and ``planes``.

    Args:
        n_channels: ``C``.
        cells: ``(channel, index, on)``: the flat cell indices ``int64 [B, K]`` (in ``[0, 100)`` where ``on``) of
            channel ``channel`` (an int, or ``int64 [B, K]``: one per cell) set where ``on`` (``bool [B, K]``; an
            off entry writes nothing; ``None``: every one is set). The first entry's ``on`` is ``None`` (the
            player's cells): the off entries write there.
        planes: ``(channel, plane)``: the whole channel ``channel`` is ``plane`` (``bool [B, 10, 10]``).

    >>> f = frame(2, [(0, torch.tensor([[5]]), None), (1, torch.tensor([[0, 99]]), torch.tensor([[True, False]]))])
    >>> f.shape, f.sum().item(), bool(f[0, 0, 0, 1]), bool(f[0, 0, 5, 0])
    (torch.Size([1, 10, 10, 2]), 2, True, True)
    """
    c0, first, _ = cells[0]
    n = first.shape[0]
    cell_size = SIZE * SIZE * n_channels
    flat = torch.zeros(n, SIZE * SIZE, n_channels, dtype=torch.bool, device=first.device)
    for c, plane in planes:
        flat[:, :, c] = plane.reshape(n, SIZE * SIZE)
    # Indices into the whole flat batch, one index_fill_ per group (a cat of narrow columns costs more).
    base = torch.arange(n, device=first.device).unsqueeze(1) * cell_size
    always = base + first * n_channels + c0
    out = flat.view(-1)
    out.index_fill_(0, always.reshape(-1), True)
    for c, index, on in cells[1:]:
        idx = base + index * n_channels + c
        if on is not None:
            idx = torch.where(on, idx, always[:, :1])
        out.index_fill_(0, idx.reshape(-1), True)
    return flat.view(n, SIZE, SIZE, n_channels)
