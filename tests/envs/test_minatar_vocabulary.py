"""The rules' vocabulary: each operation of ``_batched`` (torch, over a batch) gives, env by env, what its twin of
``_scalar`` (numba, one env) gives, on random inputs (the folds over slots, the write of one slot, the shift of a
row of cells, the frame's planes and bars)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstruct.envs.minatar import _batched

numba = pytest.importorskip("numba", reason="numba is not installed (rlstruct[fast])")

B, K = 6, 7


def _terms(k, a, b, c):
    """Two integer terms of slot ``k``: written with operators only, so both vocabularies run it."""
    return a * 3 - k + c, b - a * c


@pytest.fixture(scope="module")
def scalar():
    from rlstruct.envs.minatar import _scalar

    terms = numba.njit(inline="always")(_terms)

    @numba.njit
    def folds(a, b, c, out):
        for i in range(a.shape[0]):
            _, (lo0, lo1) = _scalar.each_min(terms, (), (a[i], b[i]), (c[i],), 2)
            _, (hi0, hi1) = _scalar.each_max(terms, (), (a[i], b[i]), (c[i],), 2)
            out[i, 0], out[i, 1], out[i, 2], out[i, 3] = lo0, lo1, hi0, hi1

    @numba.njit
    def slots(flags, k, on, left, right):
        for i in range(flags.shape[0]):
            _scalar.set_slot_if(flags[i], k[i], on[i])
            _scalar.shift_cells(left[i], -1)
            _scalar.shift_cells(right[i], 1)

    @numba.njit
    def planes(frames, left, right, lo, hi):
        for i in range(frames.shape[0]):
            _scalar.plane_rows(frames[i], 1, (left[i], right[i]))
            _scalar.bar(frames[i], 2, 9, lo[i], hi[i])

    return folds, slots, planes


def test_each_min_and_each_max_fold_the_terms_over_the_slots(scalar):
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-50, 50, (B, K), generator=gen) for _ in range(2))
    c = torch.randint(-3, 4, (B,), generator=gen)
    _, lo = _batched.each_min(_terms, (), (a, b), (c,), 2)
    _, hi = _batched.each_max(_terms, (), (a, b), (c,), 2)
    want = torch.stack([*lo, *hi], 1)
    terms = _terms(torch.arange(K), a, b, c.unsqueeze(1))
    assert torch.equal(want, torch.stack([terms[0].amin(1), terms[1].amin(1), terms[0].amax(1), terms[1].amax(1)], 1))
    out = np.zeros((B, 4), dtype=np.int64)
    scalar[0](a.numpy(), b.numpy(), c.numpy(), out)
    assert np.array_equal(out, want.numpy())


def test_set_slot_if_sets_one_slot_where_on_and_shift_cells_moves_the_cells(scalar):
    gen = torch.Generator().manual_seed(1)
    flags = torch.rand(B, K, generator=gen) < 0.3
    k = torch.randint(0, K, (B,), generator=gen)
    on = torch.tensor([True, False] * (B // 2))
    left, right = (torch.rand(B, 100, generator=gen) < 0.3 for _ in range(2))
    new_flags = _batched.set_slot_if(flags, k, on)
    new_left, new_right = _batched.shift_cells(left, -1), _batched.shift_cells(right, 1)
    assert torch.equal(new_flags, flags | ((torch.arange(K) == k.unsqueeze(1)) & on.unsqueeze(1)))
    moved_left, moved_right = new_left.view(B, 10, 10), new_right.view(B, 10, 10)
    assert torch.equal(moved_left[:, :, :9], left.view(B, 10, 10)[:, :, 1:]) and not moved_left[:, :, 9].any()
    assert torch.equal(moved_right[:, :, 1:], right.view(B, 10, 10)[:, :, :9]) and not moved_right[:, :, 0].any()
    arrays = [t.numpy().copy() for t in (flags, left, right)]
    scalar[1](arrays[0], k.numpy(), on.numpy(), arrays[1], arrays[2])
    assert all(np.array_equal(a, t.numpy()) for a, t in zip(arrays, (new_flags, new_left, new_right), strict=True))


def test_set_slot_if_takes_several_slots_per_env():
    row = torch.zeros(2, 5, dtype=torch.bool)
    out = _batched.set_slot_if(row, torch.tensor([[0, 3], [4, 4]]), torch.tensor([[True, True], [False, True]]))
    assert out.tolist() == [[True, False, False, True, False], [False, False, False, False, True]]


def test_plane_rows_and_bar_write_the_frames(scalar):
    gen = torch.Generator().manual_seed(2)
    left, right = (torch.rand(B, 100, generator=gen) < 0.2 for _ in range(2))
    lo, hi = torch.randint(-2, 12, (B,), generator=gen), torch.randint(-2, 12, (B,), generator=gen)
    f = _batched.frame(None, lo, 3, 0, torch.zeros(B, dtype=torch.int64), torch.zeros(B, dtype=torch.int64))
    f = _batched.bar(_batched.plane_rows(f, 1, (left, right)), 2, 9, lo, hi)
    want = f.finish()
    assert torch.equal(want[..., 1], (left | right).view(B, 10, 10))
    columns = torch.arange(10)
    assert torch.equal(want[:, 9, :, 2], (columns >= lo.unsqueeze(1)) & (columns < hi.unsqueeze(1)))
    frames = want.numpy().copy()
    frames[..., 1:] = ~frames[..., 1:]  # every cell of the two channels is written
    frames[:, :9, :, 2] = False
    scalar[2](frames, left.numpy(), right.numpy(), lo.numpy(), hi.numpy())
    assert np.array_equal(frames, want.numpy())
