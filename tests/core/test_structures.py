"""Contract suite for DictTensor, TemporalDictTensor, Trajectories and masked_tensor.

The algebra (cat/slice/index/mask/to round trips) is checked with Hypothesis against plain
Python loops; every user-facing error has a ``pytest.raises(..., match=...)`` test. A second
device is stood in for by ``torch.device("meta")``, which exists on every machine.
"""

from __future__ import annotations

import builtins
import re

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstruct import DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor, masked_tensor
from rlstruct.errors import BatchSizeError, DeviceMismatchError, MissingDependencyError
from tests.conftest import device_params

META = torch.device("meta")
DTYPES = [torch.float32, torch.int64, torch.bool, torch.uint8]
KEYS = ["x", "y", "obs/frame", "obs/reward", "agent_state/h", "a/b/z"]
# Values beyond float32's 24-bit mantissa: a float round trip would change them.
BIG = 2**40

# 50 examples a property (Hypothesis's default is 100; this was 200): the inputs vary in a few small integers
# (B <= 6, T <= 5, at most 4 keys of 4 dtypes, at most 2 trailing dims of 1-3), and Hypothesis draws their
# boundaries (an empty batch, zero lengths, one key, 0-d rows) among its first examples, so more examples re-draw
# the same small cases at four times the cost. No deadline: a first call that builds torch kernels is not slow code.
PROPERTY = settings(max_examples=50, deadline=None)


# ----------------------------------------------------------------------------------------- strategies
@st.composite
def tensors(draw, leading: tuple[int, ...], dtype: torch.dtype | None = None, max_extra_dims: int = 2):
    """A tensor of shape ``leading + (random trailing dims)`` and a random dtype among DTYPES."""
    if dtype is None:
        dtype = draw(st.sampled_from(DTYPES))
    trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=max_extra_dims)))
    shape = leading + trailing
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if dtype == torch.float32:
        return torch.randn(shape, generator=g)
    if dtype == torch.int64:
        return torch.randint(-BIG, BIG, shape, generator=g, dtype=torch.int64)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)


@st.composite
def dicttensors(draw, B: int | None = None, keys: list[str] | None = None, min_keys: int = 1):
    if B is None:
        B = draw(st.integers(0, 6))
    if keys is None:
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=min_keys, max_size=4, unique=True))
    return DictTensor({k: draw(tensors((B,))) for k in keys})


@st.composite
def temporal(draw, B: int | None = None, T: int | None = None, keys: list[str] | None = None):
    if B is None:
        B = draw(st.integers(0, 5))
    if T is None:
        T = draw(st.integers(0, 5))
    if keys is None:
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    variables = {k: draw(tensors((B, T), max_extra_dims=1)) for k in keys}
    lengths = torch.tensor(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)), dtype=torch.int64)
    return TemporalDictTensor(variables, lengths)


def assert_dt_equal(a: DictTensor, b: DictTensor) -> None:
    assert list(a.keys()) == list(b.keys())
    for k in a.keys():
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def assert_tdt_equal(a: TemporalDictTensor, b: TemporalDictTensor) -> None:
    assert_dt_equal(DictTensor(a.variables), DictTensor(b.variables))
    assert a.lengths.dtype == torch.int64 and b.lengths.dtype == torch.int64
    assert torch.equal(a.lengths, b.lengths)


# --------------------------------------------------------------------------------------- DictTensor
@PROPERTY
@given(d=dicttensors(), data=st.data())
def test_cat_of_slices_is_identity(d, data):
    B = d.n_elems()
    cuts = sorted(data.draw(st.lists(st.integers(0, B), max_size=4)))
    bounds = [0, *cuts, B]
    pieces = [d.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    assert sum(p.n_elems() for p in pieces) == B
    assert_dt_equal(DictTensor.cat(pieces), d)


@PROPERTY
@given(d=dicttensors(B=4), i=st.integers(-4, 3))
def test_single_index_keeps_the_batch_dim(d, i):
    one = d.slice(i)
    assert one.n_elems() == 1
    assert_dt_equal(one, d.index(i))
    assert_dt_equal(one, d.slice(i % 4, i % 4 + 1))
    assert_dt_equal(one, d.index(torch.tensor(i % 4)))  # a 0-d index is an int, not a dimension drop


@PROPERTY
@given(d=dicttensors(), data=st.data())
def test_long_index_matches_a_python_loop_and_the_bool_mask(d, data):
    B = d.n_elems()
    mask = data.draw(st.lists(st.booleans(), min_size=B, max_size=B))
    rows = [i for i, m in enumerate(mask) if m]
    by_mask = d.index(torch.tensor(mask, dtype=torch.bool))
    by_long = d.index(torch.tensor(rows, dtype=torch.long))
    assert_dt_equal(by_mask, by_long)
    assert_dt_equal(d.index(mask), by_mask)  # a list of bools is a mask too
    assert by_long.n_elems() == len(rows)
    for k in d.keys():
        for j, i in enumerate(rows):
            assert torch.equal(by_long[k][j], d[k][i])

    if B > 0:
        idx = data.draw(st.lists(st.integers(0, B - 1), max_size=6))  # repeats and any order
        picked = d.index(torch.tensor(idx, dtype=torch.long))
        assert picked.n_elems() == len(idx)
        for k in d.keys():
            for j, i in enumerate(idx):
                assert torch.equal(picked[k][j], d[k][i])


@PROPERTY
@given(d=dicttensors(), prefix=st.sampled_from(["obs/", "agent_info/", "x", ""]))
def test_truncate_key_inverts_prepend_key(d, prefix):
    p = d.prepend_key(prefix)
    assert list(p.keys()) == [prefix + k for k in d.keys()]
    back = p.truncate_key(prefix)
    assert_dt_equal(back, d)
    assert all(back[k] is d[k] for k in d.keys())  # renaming never copies


@PROPERTY
@given(a=dicttensors(B=3), b=dicttensors(B=3))
def test_truncate_key_filters_other_prefixes(a, b):
    both = a.prepend_key("left/") + b.prepend_key("right/")
    assert_dt_equal(both.truncate_key("left/"), a)
    assert_dt_equal(both.truncate_key("right/"), b)
    assert both.truncate_key("nothing/").empty()


@PROPERTY
@given(d=dicttensors())
def test_to_same_device_is_a_no_op_and_clone_is_the_copy(d):
    for device in ("cpu", "cpu:0", torch.device("cpu")):
        assert d.to(device) is d
    copy = d.to("cpu").clone()
    assert_dt_equal(copy, d)
    on_meta = d.to(META)
    assert on_meta.device() == META
    assert on_meta.specs() == d.specs()


@PROPERTY
@given(d=dicttensors())
def test_clone_is_independent(d):
    before = {k: v.tolist() for k, v in d.items()}
    c = d.clone()
    assert_dt_equal(c, d)
    for k, v in c.items():
        if v.numel():
            assert v.data_ptr() != d[k].data_ptr()
        v.copy_(~v if v.dtype == torch.bool else v + 1)
    assert {k: v.tolist() for k, v in d.items()} == before


@PROPERTY
@given(d=dicttensors())
def test_unfold_gives_rows_that_cat_back(d):
    rows = d.unfold()
    assert len(rows) == d.n_elems()
    assert all(r.n_elems() == 1 for r in rows)
    if rows:
        assert_dt_equal(DictTensor.cat(rows), d)


@PROPERTY
@given(data=st.data())
def test_copy_matches_a_python_loop(data):
    B_dst, B_src = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    dtypes = {k: data.draw(st.sampled_from(DTYPES)) for k in keys}
    dst = DictTensor({k: data.draw(tensors((B_dst,), dtypes[k], max_extra_dims=0)) for k in keys})
    src = DictTensor({k: data.draw(tensors((B_src,), dtypes[k], max_extra_dims=0)) for k in keys})
    n = data.draw(st.integers(0, min(B_dst, B_src)))
    dst_idx = data.draw(st.permutations(range(B_dst)))[:n]
    src_idx = data.draw(st.lists(st.integers(0, B_src - 1), min_size=n, max_size=n))
    expected = {k: v.tolist() for k, v in dst.items()}
    for k in keys:
        for i, j in zip(dst_idx, src_idx):
            expected[k][i] = src[k][j].item()
    dst.copy_(src, torch.tensor(src_idx, dtype=torch.long), torch.tensor(dst_idx, dtype=torch.long))
    assert {k: v.tolist() for k, v in dst.items()} == expected


@PROPERTY
@given(d=dicttensors(min_keys=2))
def test_add_is_a_union_of_disjoint_keys(d):
    keys = list(d.keys())
    left, right = d.get(keys[:1]), d.get(keys[1:])
    assert_dt_equal(left + right, d)
    assert (d + DictTensor()) is d and (DictTensor() + d) is d


def test_get_and_specs():
    d = DictTensor({"x": torch.zeros(3, 2, dtype=torch.int64), "y": torch.zeros(3)})
    assert d.get(["y"])["y"] is d["y"]
    assert d.get(["y"], clone=True)["y"] is not d["y"]
    assert d.specs() == {
        "x": {"size": torch.Size([2]), "dtype": torch.int64},
        "y": {"size": torch.Size([]), "dtype": torch.float32},
    }
    assert DictTensor().device() is None and DictTensor().n_elems() == 0
    assert not DictTensor({"x": torch.zeros(0)}).empty()


def test_set_on_an_empty_dicttensor_sets_the_batch_size():
    # rlstructures' own documented example failed: an empty DictTensor only accepted B == 0.
    d = DictTensor({})
    d.set("observation/x", torch.randn(5, 3))
    assert d.n_elems() == 5
    d.set("observation/x", torch.zeros(2))  # replacing the only key may change B
    assert d.n_elems() == 2


# ------------------------------------------------------------------------------- records (0-d tensors)
@st.composite
def records(draw, keys: list[str] | None = None):
    """A DictTensor of 0-d tensors, as rlstructures programs return their losses."""
    if keys is None:
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    return DictTensor({k: draw(tensors((), max_extra_dims=0)) for k in keys})


@PROPERTY
@given(r=records(), prefix=st.sampled_from(["loss/", "a/", ""]))
def test_a_record_supports_everything_that_needs_no_rows(r, prefix):
    keys = list(r.keys())
    assert r.is_record() and not r.empty() and r.device() == torch.device("cpu")
    assert list(r) == keys and [k for k, _ in r.items()] == keys and all(k in r for k in keys)
    assert all(v.dim() == 0 for v in r.values()) and r.variables.keys() == r.keys()
    assert_dt_equal(r.get(keys[:1]), DictTensor({keys[0]: r[keys[0]]}))
    assert r.to("cpu") is r
    on_meta = r.to(META)
    assert on_meta.is_record() and on_meta.device() == META and "record" in repr(on_meta)
    copy = r.clone()
    assert_dt_equal(copy, r)
    assert all(copy[k].data_ptr() != r[k].data_ptr() for k in keys)
    assert_dt_equal(r.prepend_key(prefix).truncate_key(prefix), r)
    assert_dt_equal(pytree.tree_map(lambda x: x, r), r)
    text = repr(r)
    assert text.startswith("DictTensor(record, device=cpu, {") and all(f"{k}: " in text for k in keys)


def test_a_record_of_losses_back_propagates_detaches_and_grows():
    w = torch.ones(3, requires_grad=True)
    losses = DictTensor({"loss": (w * 2).sum(), "entropy": w.mean()})
    total = losses["loss"] - 0.01 * losses["entropy"]
    total.backward()
    assert torch.allclose(w.grad, torch.full((3,), 2 - 0.01 / 3))
    logged = losses.detach()
    assert logged.is_record() and not any(v.requires_grad for v in logged.values())
    assert {k: round(v.item(), 4) for k, v in logged.items()} == {"loss": 6.0, "entropy": 1.0}
    grown = DictTensor({})
    grown.set("loss", torch.tensor(1.0))
    grown.set("entropy", torch.tensor(2.0))
    assert grown.is_record() and (grown + DictTensor({"kl": torch.tensor(0.0)})).is_record()
    with pytest.raises(BatchSizeError, match=r"value for 'x' must have a 0-d tensor \(this DictTensor is a record\)"):
        grown.set("x", torch.zeros(2))
    with pytest.raises(BatchSizeError, match=r"mixes the 0-d tensor 'loss' with the batched tensor 'x'"):
        grown + DictTensor({"x": torch.zeros(2)})
    assert not DictTensor({}).is_record() and not DictTensor({"x": torch.zeros(2)}).is_record()


BATCH_OPERATIONS = {
    "DictTensor.n_elems": lambda r: r.n_elems(),
    "DictTensor.specs": lambda r: r.specs(),
    "DictTensor.slice": lambda r: r.slice(0, 1),
    "DictTensor.index": lambda r: r.slice(0),
    "DictTensor.unfold": lambda r: r.unfold(),
    "DictTensor.copy_": lambda r: r.copy_(r, 0, 0),
    "masked_dicttensor": lambda r: masked_dicttensor(r, r, torch.ones(1, dtype=torch.bool)),
}


@PROPERTY
@given(r=records(), op=st.sampled_from(sorted(BATCH_OPERATIONS)), index=st.sampled_from([0, [0], torch.tensor([0])]))
def test_batch_operations_on_a_record_say_it_has_no_batch_dimension(r, op, index):
    expected = rf"{re.escape(op)} needs a batch dimension, but this DictTensor is a record of 0-d tensors .*unsqueeze"
    with pytest.raises(BatchSizeError, match=expected):
        BATCH_OPERATIONS[op](r)
    with pytest.raises(BatchSizeError, match=r"DictTensor.index needs a batch dimension"):
        r.index(index)
    with pytest.raises(BatchSizeError, match=r"DictTensor.cat concatenates rows, but an element is a record.*stack"):
        DictTensor.cat([r, r])
    with pytest.raises(BatchSizeError, match=r"DictTensor.cat .* record"):
        DictTensor.cat([r])
    with pytest.raises(BatchSizeError, match=r"DictTensor.n_elems needs a batch dimension"):
        Trajectories(r, TemporalDictTensor({"x": torch.zeros(1, 2)}))


@PROPERTY
@given(r=records(keys=["a", "b"]), B=st.integers(0, 4))
def test_a_record_and_a_batch_never_mix(r, B):
    batch = DictTensor({"c": torch.zeros(B)})
    with pytest.raises(BatchSizeError, match=r"mixes the 0-d tensor 'a' with the batched tensor 'c'"):
        r + batch
    with pytest.raises(BatchSizeError, match=r"mixes the 0-d tensor 'a' with the batched tensor 'c'"):
        batch + r
    with pytest.raises(BatchSizeError, match=r"value for 'x' must have shape \[B, \.\.\.\], got shape \(\)"):
        batch.set("x", r["a"])
    with pytest.raises(BatchSizeError, match=r"DictTensor.cat .* record"):
        DictTensor.cat([batch, r])
    # A record becomes a batch of one row by unsqueezing every tensor, as the messages say.
    one = DictTensor({k: v.unsqueeze(0) for k, v in r.items()})
    assert one.n_elems() == 1 and DictTensor.cat([one, one]).n_elems() == 2


# -------------------------------------------------------------------------------- TemporalDictTensor
def reference_cat(tdts: list[TemporalDictTensor]) -> tuple[dict[str, list], list[int]]:
    """Row by row, step by step: zero padding to the longest T."""
    T = max(x.temporal_size() for x in tdts)
    out: dict[str, list] = {k: [] for k in tdts[0].keys()}
    lengths: list[int] = []
    for x in tdts:
        for b in range(x.n_elems()):
            lengths.append(int(x.lengths[b]))
            for k in out:
                v = x[k]
                zero = torch.zeros(v.shape[2:], dtype=v.dtype).tolist()
                row = [v[b, t].tolist() if t < v.shape[1] else zero for t in range(T)]
                out[k].append(row)
    return out, lengths


@PROPERTY
@given(data=st.data())
def test_temporal_cat_matches_a_python_loop(data):
    keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    dtypes = {k: data.draw(st.sampled_from(DTYPES)) for k in keys}
    trailing = {k: data.draw(st.lists(st.integers(1, 2), max_size=1)) for k in keys}
    parts = []
    for _ in range(data.draw(st.integers(1, 3))):
        B, T = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4))
        variables = {k: data.draw(tensors((B, T, *trailing[k]), dtypes[k], max_extra_dims=0)) for k in keys}
        lengths = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
        parts.append(TemporalDictTensor(variables, torch.tensor(lengths, dtype=torch.int64)))
    out = TemporalDictTensor.cat(parts)
    expected, lengths = reference_cat(parts)
    assert out.lengths.tolist() == lengths
    assert out.temporal_size() == max(p.temporal_size() for p in parts)
    for k in keys:
        assert out[k].dtype == dtypes[k]
        assert out[k].tolist() == expected[k]


@PROPERTY
@given(x=temporal(), data=st.data())
def test_temporal_slice_matches_a_python_loop(x, data):
    T = x.temporal_size()
    a = data.draw(st.integers(0, T + 1))
    b = data.draw(st.integers(a, T + 2))
    s = x.temporal_slice(a, b)
    width = max(0, min(b, T) - min(a, T))
    assert s.temporal_size() == width
    assert s.lengths.tolist() == [min(max(int(n) - a, 0), b - a) for n in x.lengths]
    for k in x.keys():
        for row in range(x.n_elems()):
            for t in range(width):
                assert torch.equal(s[k][row, t], x[k][row, a + t])


@PROPERTY
@given(x=temporal())
def test_mask_matches_lengths(x):
    m = x.mask()
    B, T = x.n_elems(), x.temporal_size()
    assert m.dtype == torch.float32 and m.shape == (B, T)
    expected = [[1.0 if t < int(x.lengths[b]) else 0.0 for t in range(T)] for b in range(B)]
    assert m.tolist() == expected
    assert x.full() == all(int(n) == T for n in x.lengths)


@PROPERTY
@given(x=temporal(), extra=st.integers(0, 3))
def test_expand_keeps_dtypes_and_adds_empty_rows(x, extra):
    B = x.n_elems()
    e = x.expand(B + extra)
    assert e.n_elems() == B + extra
    assert e.lengths.tolist() == x.lengths.tolist() + [0] * extra
    for k in x.keys():
        assert e[k].dtype == x[k].dtype
        assert torch.equal(e[k][:B], x[k])
        assert not e[k][B:].any()


@PROPERTY
@given(x=temporal(), data=st.data())
def test_temporal_slices_index_and_unfold(x, data):
    B = x.n_elems()
    rows = x.unfold()
    assert len(rows) == B
    if B:
        assert_tdt_equal(TemporalDictTensor.cat(rows), x)
        i = data.draw(st.integers(0, B - 1))
        assert_tdt_equal(x.slice(i), x.slice(i, i + 1))
        assert_tdt_equal(x.index(i), x.slice(i, i + 1))
    mask = data.draw(st.lists(st.booleans(), min_size=B, max_size=B))
    picked = x.index(torch.tensor(mask, dtype=torch.bool))
    assert picked.lengths.tolist() == [int(n) for n, m in zip(x.lengths, mask) if m]
    assert_tdt_equal(x.prepend_key("p/").truncate_key("p/"), x)


@PROPERTY
@given(x=temporal(), data=st.data())
def test_temporal_index_variants_match_a_python_loop(x, data):
    B, T = x.n_elems(), x.temporal_size()
    if T == 0:
        return
    t = data.draw(st.integers(0, T - 1))
    step = x.temporal_index(t)
    chosen, rows = x.masked_temporal_index(t)
    expected_rows = [b for b in range(B) if t < int(x.lengths[b])]
    assert rows.tolist() == expected_rows
    index_t = data.draw(st.lists(st.integers(0, T - 1), min_size=B, max_size=B))
    multi = x.temporal_multi_index(torch.tensor(index_t, dtype=torch.long))
    for k in x.keys():
        assert step[k].shape == (B,) + x[k].shape[2:]
        for b in range(B):
            assert torch.equal(step[k][b], x[k][b, t])
            assert torch.equal(multi[k][b], x[k][b, index_t[b]])
        for j, b in enumerate(expected_rows):
            assert torch.equal(chosen[k][j], x[k][b, t])


@PROPERTY
@given(x=temporal())
def test_temporal_clone_to_and_shorten(x):
    assert x.to("cpu") is x
    before = ({k: v.tolist() for k, v in x.items()}, x.lengths.tolist())
    c = x.clone()
    assert_tdt_equal(c, x)
    c.lengths.add_(1)
    for v in c.values():
        v.copy_(~v if v.dtype == torch.bool else v + 1)
    assert ({k: v.tolist() for k, v in x.items()}, x.lengths.tolist()) == before
    s = x.shorten()
    m = int(x.lengths.max()) if x.n_elems() else 0
    assert s.temporal_size() == m
    assert torch.equal(s.lengths, x.lengths)
    for k in x.keys():
        assert torch.equal(s[k], x[k][:, :m])


@PROPERTY
@given(x=temporal(), data=st.data())
def test_temporal_per_key_operations_are_the_dicttensor_ones_with_the_lengths_following_the_rows(x, data):
    d = DictTensor(x.variables)
    B = x.n_elems()
    a = data.draw(st.integers(0, B))
    b = data.draw(st.integers(a, B))
    rows = torch.tensor(data.draw(st.lists(st.integers(0, max(B - 1, 0)), max_size=4 if B else 0)), dtype=torch.long)
    keys = data.draw(st.lists(st.sampled_from(list(x.keys())), min_size=1, unique=True))
    cases = [
        (x.slice(a, b), d.slice(a, b), x.lengths[a:b]),
        (x.index(rows), d.index(rows), x.lengths[rows]),
        (x.get(keys), d.get(keys), x.lengths),
        (x.get(keys, clone=True), d.get(keys, clone=True), x.lengths),
        (x.prepend_key("p/"), d.prepend_key("p/"), x.lengths),
        (x.prepend_key("p/").truncate_key("p/"), d, x.lengths),
        (x.clone(), d.clone(), x.lengths),
        (x.detach(), d.detach(), x.lengths),
    ]
    for got, expected, lengths in cases:
        assert isinstance(got, TemporalDictTensor)
        assert_tdt_equal(got, TemporalDictTensor(expected.variables, lengths))
    assert x.get(keys).lengths is x.lengths and x.get(keys, clone=True).lengths is not x.lengths
    assert [u.lengths.tolist() for u in x.unfold()] == [[n] for n in x.lengths.tolist()]
    assert x.specs() == {k: {"size": v.shape[2:], "dtype": v.dtype} for k, v in x.items()}
    on_meta = x.to(META)
    assert on_meta.lengths.device == META and all(v.device == META for v in on_meta.values())
    assert [v.shape for v in on_meta.values()] == [v.shape for v in x.values()]


@PROPERTY
@given(data=st.data())
def test_temporal_copy_matches_a_python_loop(data):
    Ts, T = data.draw(st.integers(0, 3)), data.draw(st.integers(3, 4))
    dst = data.draw(temporal(B=data.draw(st.integers(1, 4)), T=T, keys=["x"]))
    B_src = data.draw(st.integers(1, 4))
    src = TemporalDictTensor(
        {"x": data.draw(tensors((B_src, Ts) + dst["x"].shape[2:], dst["x"].dtype, max_extra_dims=0))},
        torch.tensor(data.draw(st.lists(st.integers(0, Ts), min_size=B_src, max_size=B_src)), dtype=torch.int64),
    )
    n = data.draw(st.integers(0, min(dst.n_elems(), B_src)))
    dst_idx = data.draw(st.permutations(range(dst.n_elems())))[:n]
    src_idx = data.draw(st.lists(st.integers(0, B_src - 1), min_size=n, max_size=n))
    expected, expected_lengths = dst["x"].tolist(), dst.lengths.tolist()
    for i, j in zip(dst_idx, src_idx):
        for t in range(Ts):
            expected[i][t] = src["x"][j, t].tolist()
        expected_lengths[i] = int(src.lengths[j])
    dst.copy_(src, torch.tensor(src_idx, dtype=torch.long), torch.tensor(dst_idx, dtype=torch.long))
    assert dst["x"].tolist() == expected
    assert dst.lengths.tolist() == expected_lengths


# ---------------------------------------------------------------------------------------- masked_tensor
@PROPERTY
@given(data=st.data())
def test_masked_tensor_selects_rows_at_any_rank_and_dtype(data):
    rank = data.draw(st.integers(1, 4))
    B = data.draw(st.integers(0, 4))
    shape = (B, *data.draw(st.lists(st.integers(1, 3), min_size=rank - 1, max_size=rank - 1)))
    dtype = data.draw(st.sampled_from(DTYPES))
    t0 = data.draw(tensors(shape, dtype, max_extra_dims=0))
    t1 = data.draw(tensors(shape, dtype, max_extra_dims=0))
    if dtype == torch.int64:
        t1 = t1 | 1  # odd values near 2**40: exact only without a float round trip
    mask = data.draw(st.lists(st.booleans(), min_size=B, max_size=B))
    mask_t = torch.tensor(mask, dtype=data.draw(st.sampled_from([torch.bool, torch.int64, torch.float32])))
    out = masked_tensor(t0, t1, mask_t)
    assert out.dtype == dtype and out.shape == shape
    for b in range(B):
        assert torch.equal(out[b], t1[b] if mask[b] else t0[b])


@PROPERTY
@given(data=st.data())
def test_masked_tensor_does_not_leak_nan_from_the_unselected_operand(data):
    B = data.draw(st.integers(1, 4))
    shape = (B, *data.draw(st.lists(st.integers(1, 3), max_size=3)))
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    t0 = data.draw(tensors(shape, torch.float32, max_extra_dims=0))
    t1 = data.draw(tensors(shape, torch.float32, max_extra_dims=0))
    poisoned0, poisoned1 = t0.clone(), t1.clone()
    poisoned0[mask] = float("nan")  # rows where t1 is selected
    poisoned1[~mask] = float("inf")  # rows where t0 is selected
    out = masked_tensor(poisoned0, poisoned1, mask)
    assert torch.isfinite(out).all()
    for b in range(B):
        assert torch.equal(out[b], t1[b] if mask[b] else t0[b])


def test_masked_tensor_int64_exact():
    big = torch.tensor([[2**25 + 1, 2**53 + 1]] * 3)
    out = masked_tensor(torch.zeros_like(big), big, torch.tensor([True, False, True]))
    assert out.tolist() == [[2**25 + 1, 2**53 + 1], [0, 0], [2**25 + 1, 2**53 + 1]]


@PROPERTY
@given(d0=dicttensors(B=3, keys=["x", "y"]), data=st.data())
def test_masked_dicttensor_follows_the_first_argument_keys(d0, data):
    d1 = DictTensor(
        {
            "z": data.draw(tensors((3,))),
            "y": data.draw(tensors(tuple(d0["y"].shape), max_extra_dims=0)),  # any dtype: cast to d0's
            "x": data.draw(tensors(tuple(d0["x"].shape), d0["x"].dtype, max_extra_dims=0)),
        }
    )
    m = data.draw(st.lists(st.booleans(), min_size=3, max_size=3))
    out = masked_dicttensor(d0, d1, torch.tensor(m))
    assert list(out.keys()) == ["x", "y"]
    for k in out.keys():
        assert out[k].dtype == d0[k].dtype
        for b in range(3):
            assert torch.equal(out[k][b], d1[k][b].to(d0[k].dtype) if m[b] else d0[k][b])
    assert masked_dicttensor(DictTensor(), d1, torch.tensor(m)).empty()


# ------------------------------------------------------------------------------------------ Trajectories
def make_trajectories(B: int, T: int, first_id: int = 0) -> Trajectories:
    ids = torch.arange(first_id, first_id + B)
    info = DictTensor({"agent_info/id": ids, "agent_state/h": ids.float().unsqueeze(1).repeat(1, 2)})
    steps = TemporalDictTensor(
        {"observation/x": ids.view(B, 1).repeat(1, T) * 100 + torch.arange(T)},
        torch.arange(B) % (T + 1),
    )
    return Trajectories(info, steps)


@PROPERTY
@given(sizes=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=3))
def test_trajectories_cat(sizes):
    parts, first = [], 0
    for B, T in sizes:
        parts.append(make_trajectories(B, T, first))
        first += B
    out = Trajectories.cat(parts)
    assert out.n_elems() == first
    assert out.info["agent_info/id"].tolist() == list(range(first))
    assert_tdt_equal(out.trajectories, TemporalDictTensor.cat([p.trajectories for p in parts]))
    assert_dt_equal(out.info, DictTensor.cat([p.info for p in parts]))


@PROPERTY
@given(B=st.integers(1, 5), T=st.integers(1, 4), time_major=st.booleans())
def test_trajectories_clone_shares_no_memory_and_keeps_strides(B, T, time_major):
    tr = make_trajectories(B, T)
    if time_major:  # what a zero_copy batcher hands out: [B, T] views of [T, B] storage
        x = tr.trajectories["observation/x"]
        tr.trajectories.set("observation/x", x.transpose(0, 1).contiguous().transpose(0, 1))
    c = tr.clone()
    assert_dt_equal(c.info, tr.info)
    assert_tdt_equal(c.trajectories, tr.trajectories)
    assert c.trajectories["observation/x"].stride() == tr.trajectories["observation/x"].stride()
    tr.trajectories["observation/x"].add_(1)
    tr.info["agent_info/id"].add_(1)
    tr.trajectories.lengths.add_(1)
    assert c.trajectories["observation/x"][0, 0] == 0 and c.info["agent_info/id"][0] == 0
    assert c.trajectories.lengths[0] == 0


@PROPERTY
@given(B=st.integers(0, 6), data=st.data())
def test_trajectories_sample_and_index(B, data):
    tr = make_trajectories(B, 3)
    n = data.draw(st.integers(0, B))
    seed = data.draw(st.integers(0, 2**16))
    s = tr.sample(n, generator=torch.Generator().manual_seed(seed))
    ids = s.info["agent_info/id"].tolist()
    assert len(ids) == n == len(set(ids)) and set(ids) <= set(range(B))
    # info and trajectories rows stay paired
    assert (s.trajectories["observation/x"][:, 0] // 100).tolist() == ids
    assert s.trajectories.lengths.tolist() == [i % 4 for i in ids]
    again = tr.sample(n, generator=torch.Generator().manual_seed(seed))
    assert again.info["agent_info/id"].tolist() == ids
    picked = tr.index(torch.tensor(ids, dtype=torch.long))
    assert_dt_equal(picked.info, s.info)
    assert_tdt_equal(picked.trajectories, s.trajectories)
    assert tr.to("cpu") is tr


# ------------------------------------------------------------------------------------------------ errors
def test_error_different_batch_sizes():
    with pytest.raises(BatchSizeError, match=r"'a' has \(2,\), 'b' has \(3,\)"):
        DictTensor({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(BatchSizeError, match=r"mixes the 0-d tensor 'b' with the batched tensor 'a' of shape \(2,\)"):
        DictTensor({"a": torch.zeros(2), "b": torch.tensor(1.0)})
    with pytest.raises(BatchSizeError, match=r"mixes the 0-d tensor 'a' with the batched tensor 'b'.*unsqueeze\(0\)"):
        DictTensor({"a": torch.tensor(1.0), "b": torch.zeros(2)})
    with pytest.raises(BatchSizeError, match=r"'a'\] must have shape \[B, T, \.\.\.\], got a 1-d tensor"):
        TemporalDictTensor({"a": torch.zeros(2)})
    with pytest.raises(BatchSizeError, match=r"batch and time sizes: 'a' has \(2, 3\), 'b' has \(2, 4\)"):
        TemporalDictTensor({"a": torch.zeros(2, 3), "b": torch.zeros(2, 4)})


def test_error_different_devices():
    with pytest.raises(DeviceMismatchError, match=r"'a' is on cpu, 'b' is on meta"):
        DictTensor({"a": torch.zeros(2), "b": torch.zeros(2, device=META)})
    with pytest.raises(DeviceMismatchError, match=r"'a' is on cpu, 'b' is on meta"):
        TemporalDictTensor({"a": torch.zeros(2, 3), "b": torch.zeros(2, 3, device=META)})


def test_error_non_tensor_value_and_key():
    with pytest.raises(TypeError, match=r"DictTensor\['a'\] must be a torch.Tensor, got list"):
        DictTensor({"a": [1, 2]})
    with pytest.raises(TypeError, match="keys must be str, got int"):
        DictTensor({1: torch.zeros(2)})


def test_error_missing_key_lists_available_keys():
    d = DictTensor({"obs/x": torch.zeros(2), "obs/y": torch.zeros(2)})
    with pytest.raises(KeyError, match=re.escape("no key 'obs/z'; available keys: ['obs/x', 'obs/y']")):
        d["obs/z"]
    with pytest.raises(KeyError, match="available keys"):
        d.get(["obs/x", "nope"])
    tdt = TemporalDictTensor({"x": torch.zeros(2, 3)})
    with pytest.raises(KeyError, match=re.escape("no key 'y'; available keys: ['x']")):
        tdt["y"]
    with pytest.raises(KeyError, match=re.escape("no key starts with 'obs/'; available keys: ['x']")):
        tdt.truncate_key("obs/")


def test_error_cat_with_different_keys():
    a = DictTensor({"x": torch.zeros(2), "y": torch.zeros(2)})
    b = DictTensor({"x": torch.zeros(1), "z": torch.zeros(1)})
    with pytest.raises(ValueError, match=re.escape("element 1 lacks ['y'] and has extra ['z']")):
        DictTensor.cat([a, b])
    ta = TemporalDictTensor({"x": torch.zeros(2, 3), "y": torch.zeros(2, 3)})
    tb = TemporalDictTensor({"x": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match=re.escape("element 1 lacks ['y'] and has extra []")):
        TemporalDictTensor.cat([ta, tb])
    tc = TemporalDictTensor({"x": torch.zeros(1, 3), "z": torch.zeros(1, 3)})  # same count, other key
    with pytest.raises(ValueError, match=re.escape("element 2 lacks ['y'] and has extra ['z']")):
        TemporalDictTensor.cat([ta, ta, tc])
    td = TemporalDictTensor({"x": torch.zeros(1, 3), "y": torch.zeros(1, 3), "w": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match=re.escape("element 1 lacks [] and has extra ['w']")):
        TemporalDictTensor.cat([ta, td])
    with pytest.raises(ValueError, match=re.escape("element 1 lacks [] and has extra ['w']")):
        DictTensor.cat([a, DictTensor({"x": torch.zeros(1), "y": torch.zeros(1), "w": torch.zeros(1)})])
    with pytest.raises(ValueError, match="at least one element"):
        TemporalDictTensor.cat([])


def test_error_cat_across_devices_and_shapes():
    a = DictTensor({"x": torch.zeros(2)})
    with pytest.raises(DeviceMismatchError, match=r"key 'x' is on several devices \['cpu', 'meta'\]"):
        DictTensor.cat([a, a.to(META)])
    ta = TemporalDictTensor({"x": torch.zeros(2, 3)})
    with pytest.raises(DeviceMismatchError, match="key 'x' is on several devices"):
        TemporalDictTensor.cat([ta, ta.to(META)])
    with pytest.raises(ValueError, match=r"cannot concatenate key 'x' of shapes \[\(2,\), \(2, 3\)\]"):
        DictTensor.cat([a, DictTensor({"x": torch.zeros(2, 3)})])
    with pytest.raises(ValueError, match=r"cannot concatenate key 'x' of shapes \[\(2, 3\), \(1, 2, 5\)\]"):
        TemporalDictTensor.cat([ta, TemporalDictTensor({"x": torch.zeros(1, 2, 5)})])
    # 'a' differs only in T, which padding absorbs: the message names 'b'
    t1 = TemporalDictTensor({"a": torch.zeros(2, 3), "b": torch.zeros(2, 3, 2)})
    t2 = TemporalDictTensor({"a": torch.zeros(1, 4), "b": torch.zeros(1, 4, 5)})
    with pytest.raises(ValueError, match=r"cannot concatenate key 'b' of shapes \[\(2, 3, 2\), \(1, 4, 5\)\]"):
        TemporalDictTensor.cat([t1, t2])


def test_error_cat_of_different_dtypes_and_of_info_with_and_without_keys():
    # torch.cat would promote int64 and float32 to float32 without a word.
    ints, floats = DictTensor({"x": torch.zeros(2, dtype=torch.int64)}), DictTensor({"x": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"key 'x' is torch.int64 in element 0 and torch.float32 in element 1; "
                                         r"convert one of them \(e.g. .to\(torch.int64\)\)"):
        DictTensor.cat([ints, floats])
    ta = TemporalDictTensor({"x": torch.zeros(2, 3, dtype=torch.int64)})
    tb = TemporalDictTensor({"x": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match=r"TemporalDictTensor.cat needs one dtype per key: key 'x' is torch.int64"):
        TemporalDictTensor.cat([ta, tb])
    with pytest.raises(ValueError, match=re.escape("Trajectories.cat (info) needs the same keys everywhere: element 1 "
                                                   "lacks [] and has extra ['k']")):
        Trajectories.cat([Trajectories(DictTensor({}), ta), Trajectories(DictTensor({"k": torch.zeros(2)}), ta)])


def test_error_get_with_a_str():
    with pytest.raises(TypeError, match=re.escape("got the str 'xy'; use get(['xy'])")):
        DictTensor({"xy": torch.zeros(1)}).get("xy")
    with pytest.raises(TypeError, match="got the str 'x'"):
        TemporalDictTensor({"x": torch.zeros(1, 1)}).get("x")


def test_error_set_wrong_size_device_or_type():
    d = DictTensor({"a": torch.zeros(3)})
    with pytest.raises(BatchSizeError, match=r"value for 'b' has 2 rows, the DictTensor has 3 \(key 'a'\)"):
        d.set("b", torch.zeros(2))
    with pytest.raises(DeviceMismatchError, match=r"value for 'b' is on meta, the DictTensor is on cpu"):
        d.set("b", torch.zeros(3, device=META))
    with pytest.raises(TypeError, match="value for 'b' must be a torch.Tensor, got float"):
        d.set("b", 1.0)
    with pytest.raises(BatchSizeError, match=r"value for 'b' must have shape \[B, \.\.\.\], got shape \(\)"):
        d.set("b", torch.tensor(1.0))
    assert list(d.keys()) == ["a"]
    t = TemporalDictTensor({"a": torch.zeros(2, 3)})
    with pytest.raises(BatchSizeError, match=r"leading shape \(2, 3\), got \(2, 4\)"):
        t.set("b", torch.zeros(2, 4))
    with pytest.raises(DeviceMismatchError, match=r"value for 'b' is on meta, the TemporalDictTensor is on cpu; "
                       r"move it with .to\('cpu'\)"):
        t.set("b", torch.zeros(2, 3, device=META))
    # The lengths pin B and T, so even the only key keeps its leading shape.
    with pytest.raises(BatchSizeError, match=r"leading shape \(2, 3\), got \(2, 5\)"):
        t.set("a", torch.zeros(2, 5))


def test_error_index_arguments():
    d = DictTensor({"a": torch.zeros(3)})
    with pytest.raises(BatchSizeError, match=r"bool mask index must have shape \(3,\), got \(2,\)"):
        d.index(torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"int64 \(or int32\) or bool tensor, got dtype torch.float32"):
        d.index(torch.tensor([0.0]))
    with pytest.raises(TypeError, match="got dtype torch.uint8"):  # torch would read it as a mask
        d.index(torch.tensor([0, 1], dtype=torch.uint8))
    with pytest.raises(IndexError, match="index 3 is out of range for a batch of 3 rows"):
        d.slice(3)
    with pytest.raises(TypeError, match="got bool"):
        d.index(True)


def test_error_temporal_lengths():
    x = {"a": torch.zeros(2, 3)}
    with pytest.raises(BatchSizeError, match=r"lengths must have shape \(2,\) \(one length per row\), got \(3,\)"):
        TemporalDictTensor(x, torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="lengths must be an int64 tensor .B., got dtype torch.float32"):
        TemporalDictTensor(x, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, T=3\], got min 1, max 4"):
        TemporalDictTensor(x, torch.tensor([1, 4]))
    with pytest.raises(ValueError, match=r"got min -1"):
        TemporalDictTensor(x, torch.tensor([-1, 0]))
    with pytest.raises(DeviceMismatchError, match="lengths is on meta but the tensors are on cpu"):
        TemporalDictTensor(x, torch.tensor([1, 2], device=META))
    with pytest.raises(ValueError, match="needs at least one tensor"):
        TemporalDictTensor({})
    assert TemporalDictTensor(x, torch.tensor([1, 2], dtype=torch.int32)).lengths.dtype == torch.int64


def test_error_temporal_slice_negative():
    with pytest.raises(ValueError, match=r"temporal_slice bounds must be >= 0, got \(-1, 2\)"):
        TemporalDictTensor({"a": torch.zeros(2, 3)}).temporal_slice(-1, 2)


def test_error_expand_smaller():
    t = TemporalDictTensor({"a": torch.zeros(3, 2)})
    with pytest.raises(BatchSizeError, match="new_batch_size must be >= the current batch size 3, got 2"):
        t.expand(2)
    assert t.expand(3) is t


def test_error_copy_too_long():
    dst = TemporalDictTensor({"a": torch.zeros(2, 3)})
    src = TemporalDictTensor({"a": torch.ones(2, 4)})
    with pytest.raises(BatchSizeError, match=r"source has T=4 steps, more than this structure's T=3"):
        dst.copy_(src, torch.tensor([0]), torch.tensor([1]))
    assert not dst["a"].any()


def test_error_trajectories_info_mismatch():
    steps = TemporalDictTensor({"x": torch.zeros(3, 2)})
    with pytest.raises(BatchSizeError, match="info has 2 rows but trajectories has 3"):
        Trajectories(DictTensor({"i": torch.zeros(2)}), steps)
    with pytest.raises(DeviceMismatchError, match="info is on meta but trajectories is on cpu"):
        Trajectories(DictTensor({"i": torch.zeros(3, device=META)}), steps)
    assert Trajectories(DictTensor(), steps).n_elems() == 3


def test_error_sample_too_many():
    tr = make_trajectories(3, 2)
    with pytest.raises(ValueError, match=r"n must be in \[0, 3\] \(sampling without replacement\), got 4"):
        tr.sample(4)


def test_error_masked_tensor_shapes():
    with pytest.raises(BatchSizeError, match=r"got \(3,\), \(3, 1\) and mask \(3,\)"):
        masked_tensor(torch.zeros(3), torch.zeros(3, 1), torch.ones(3, dtype=torch.bool))
    with pytest.raises(BatchSizeError, match=r"mask \(2,\)"):
        masked_tensor(torch.zeros(3), torch.zeros(3), torch.ones(2, dtype=torch.bool))
    with pytest.raises(KeyError, match="no key 'y'"):
        masked_dicttensor(DictTensor({"y": torch.zeros(1)}), DictTensor({"x": torch.zeros(1)}), torch.ones(1))


def test_error_add_overlapping_keys():
    a = DictTensor({"x": torch.zeros(2), "y": torch.zeros(2)})
    with pytest.raises(ValueError, match=re.escape("share keys ['y']; rename one side")):
        a + DictTensor({"y": torch.zeros(2), "z": torch.zeros(2)})
    with pytest.raises(BatchSizeError, match="'z' has"):
        a + DictTensor({"z": torch.zeros(3)})
    with pytest.raises(DeviceMismatchError, match="'z' is on meta"):
        a + DictTensor({"z": torch.zeros(2, device=META)})


# ------------------------------------------------------------------------------------------ tensordict
def test_tensordict_missing_raises(monkeypatch):
    real_import = builtins.__import__

    def no_tensordict(name, *args, **kwargs):
        if name == "tensordict" or name.startswith("tensordict."):
            raise ImportError("No module named 'tensordict'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensordict)
    d = DictTensor({"x": torch.zeros(2)})
    with pytest.raises(MissingDependencyError, match="pip install tensordict"):
        d.to_tensordict()
    with pytest.raises(MissingDependencyError, match="to_tensordict/from_tensordict"):
        DictTensor.from_tensordict(object())
    with pytest.raises(ImportError):  # MissingDependencyError is an ImportError
        d.to_tensordict()


def test_tensordict_round_trip():
    tensordict = pytest.importorskip("tensordict")
    d = DictTensor({"obs/x": torch.randn(3, 2), "obs/done": torch.zeros(3, dtype=torch.bool), "a": torch.arange(3)})
    td = d.to_tensordict()
    assert isinstance(td, tensordict.TensorDict)
    assert tuple(td.batch_size) == (3,)
    assert td["obs/x"] is d["obs/x"] or td["obs/x"].data_ptr() == d["obs/x"].data_ptr()  # shared, not copied
    back = DictTensor.from_tensordict(td)
    assert sorted(back.keys()) == sorted(d.keys())
    for k in d.keys():
        assert torch.equal(back[k], d[k]) and back[k].dtype == d[k].dtype
    nested = tensordict.TensorDict({"obs": {"x": torch.zeros(2, 1)}, "r": torch.ones(2)}, batch_size=[2])
    assert sorted(DictTensor.from_tensordict(nested).keys()) == ["obs/x", "r"]


# ---------------------------------------------------------------------------------------------- pytree
def test_pytree_tree_map_over_dicttensor():
    d = DictTensor({"x": torch.ones(2, 3), "y": torch.arange(2)})
    leaves, spec = pytree.tree_flatten(d)
    assert len(leaves) == 2
    doubled = pytree.tree_map(lambda t: t * 2, d)
    assert isinstance(doubled, DictTensor)
    assert list(doubled.keys()) == ["x", "y"]
    assert torch.equal(doubled["x"], torch.full((2, 3), 2.0)) and doubled["y"].tolist() == [0, 2]
    nested = pytree.tree_map(torch.clone, {"state": d, "n": [d]})
    assert isinstance(nested["n"][0], DictTensor) and nested["state"]["x"] is not d["x"]
    paths = [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(d)[0]]
    assert paths == ["['x']", "['y']"]


def test_pytree_tree_map_over_temporal_dicttensor():
    t = TemporalDictTensor({"x": torch.ones(2, 3)}, torch.tensor([1, 3]))
    leaves, _ = pytree.tree_flatten(t)
    assert len(leaves) == 2 and leaves[-1] is t.lengths  # the lengths move with the data
    on_meta = pytree.tree_map(lambda v: v.to(META), t)
    assert isinstance(on_meta, TemporalDictTensor)
    assert on_meta.device() == META and on_meta["x"].device == META
    cloned = pytree.tree_map(torch.clone, t)
    assert_tdt_equal(cloned, t)
    assert cloned.lengths is not t.lengths
    paths = [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(t)[0]]
    assert paths == ["['x']", ".lengths"]


def _step(d: DictTensor) -> DictTensor:
    return DictTensor({"y": d["x"] * 2 + 1, "s": d["x"].sum(1)}) + d.get(["x"]).prepend_key("in/")


def _check_step(out: DictTensor, d: DictTensor) -> None:
    assert isinstance(out, DictTensor)
    assert list(out.keys()) == ["y", "s", "in/x"]
    assert torch.allclose(out["y"], d["x"] * 2 + 1) and torch.allclose(out["s"], d["x"].sum(1))


def _compile_or_skip(fn, **kwargs):
    try:
        return torch.compile(fn, fullgraph=False, **kwargs)
    except RuntimeError as e:  # e.g. a platform without dynamo support
        pytest.skip(f"torch.compile cannot run here: {e}")


# torch's own compile stack imports a module that uses the deprecated torch.jit.script_method.
IGNORE_JIT_DEPRECATION = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@IGNORE_JIT_DEPRECATION
def test_torch_compile_traces_a_dicttensor_function():
    torch._dynamo.reset()
    compiled = _compile_or_skip(_step, backend="aot_eager")
    d = DictTensor({"x": torch.randn(4, 3)})
    _check_step(compiled(d), d)


@pytest.mark.slow
@IGNORE_JIT_DEPRECATION
def test_torch_compile_default_backend_smoke():
    torch._dynamo.reset()
    compiled = _compile_or_skip(_step)
    d = DictTensor({"x": torch.randn(4, 3)})
    try:
        out = compiled(d)
    except Exception as e:  # the default backend needs a working C++ toolchain
        if "compiler" in str(e).lower() or "InductorError" in type(e).__name__:
            pytest.skip(f"inductor cannot compile on this machine: {e}")
        raise
    _check_step(out, d)


# --------------------------------------------------------------------------------------- device variants
@pytest.mark.parametrize("device", device_params())
def test_structures_on_device(device):
    d = DictTensor({"x": torch.arange(6).view(3, 2), "m": torch.tensor([True, False, True])}).to(device)
    assert d.device() == torch.device(device)
    assert d.to(device) is d
    assert d.index(torch.tensor([0, 2])).n_elems() == 2  # a CPU index follows the data
    assert d.index(d["m"]).n_elems() == 2
    assert_dt_equal(DictTensor.cat([d, d]).to("cpu"), DictTensor.cat([d.to("cpu"), d.to("cpu")]))
    t = TemporalDictTensor({"x": torch.zeros(3, 4, device=device)}, torch.tensor([0, 2, 4], device=device))
    assert t.mask().device == torch.device(device)
    assert t.mask().sum().item() == 6
    assert TemporalDictTensor.cat([t, t.temporal_slice(0, 2)]).lengths.tolist() == [0, 2, 4, 0, 2, 2]
    assert t.expand(5).lengths.device == torch.device(device)
    tr = Trajectories(d, t)
    assert tr.sample(2).n_elems() == 2
    assert tr.to("cpu").device() == torch.device("cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("device", ["cuda:0"])
def test_cuda_round_trip_and_mismatch(device):
    d = DictTensor({"x": torch.randn(3, 2)})
    on_gpu = d.to(device)
    assert on_gpu.to("cuda") is on_gpu  # "cuda" is cuda:0
    assert_dt_equal(on_gpu.to("cpu"), d)
    with pytest.raises(DeviceMismatchError, match=r"'x' is on cpu, 'y' is on cuda:0"):
        DictTensor({"x": torch.zeros(2), "y": torch.zeros(2, device=device)})
