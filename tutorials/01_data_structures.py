"""Tutorial 1: the data structures — DictTensor, TemporalDictTensor, Trajectories.

Everything rlstruct moves between environments, agents, batchers and learners is one of three
containers of named tensors:

* ``DictTensor``: a batch of ``B`` rows, ``{key: Tensor[B, ...]}``, all on one device;
* ``TemporalDictTensor``: ``B`` sequences of up to ``T`` steps, ``{key: Tensor[B, T, ...]}``, plus
  ``lengths: int64 [B]`` (row ``b`` holds ``lengths[b]`` valid steps, the rest is padding);
* ``Trajectories``: per-trajectory ``info`` (a DictTensor) and the steps (a TemporalDictTensor).

Run it with ``python tutorials/01_data_structures.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the batch of the last section; the tests
run every tutorial with a small value.
"""

from __future__ import annotations

import os
import time

import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor, masked_tensor
from rlstruct.errors import BatchSizeError, DeviceMismatchError

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


def dicttensor_basics() -> None:
    print("== 1. DictTensor: a batch of named tensors")
    # The first dimension of every tensor is the batch dimension; the rest is free per key.
    d = DictTensor({"x": torch.randn(3, 5), "y": torch.randn(3, 8)})
    print(d)
    assert d.n_elems() == 3
    assert list(d.keys()) == ["x", "y"]
    assert d["x"].shape == (3, 5)
    # specs() is the per-row shape and dtype: what a batcher needs to preallocate a buffer.
    assert d.specs()["y"] == {"size": torch.Size([8]), "dtype": torch.float32}

    # An empty DictTensor (no key) is not the same as a DictTensor of zero rows.
    empty = DictTensor({})
    assert empty.empty() and empty.n_elems() == 0 and empty.device() is None
    zero_rows = DictTensor({"x": torch.zeros(0, 5)})
    assert not zero_rows.empty() and zero_rows.n_elems() == 0

    # set() adds a key in place; on an empty DictTensor the first key fixes B.
    grown = DictTensor({})
    grown.set("a", torch.arange(4))
    grown.set("b", torch.ones(4, 2))
    assert grown.n_elems() == 4
    # The invariant (one B, one device) is checked, and the error says which key broke it.
    try:
        grown.set("c", torch.zeros(5))
    except BatchSizeError as e:
        print("   set() of a wrong-sized tensor:", e)
    else:
        raise AssertionError("a tensor of 5 rows must not join a DictTensor of 4")

    # Keys form a hierarchy by prefix: the batcher stores "observation/frame", "action/action", ...
    # prepend_key adds a prefix; truncate_key keeps only the keys under a prefix and strips it;
    # + joins DictTensors with disjoint keys. None of them copies a tensor.
    obs = DictTensor({"frame": torch.randn(3, 4), "reward": torch.zeros(3)})
    act = DictTensor({"action": torch.tensor([0, 1, 1])})
    both = obs.prepend_key("observation/") + act.prepend_key("action/")
    assert sorted(both.keys()) == ["action/action", "observation/frame", "observation/reward"]
    back = both.truncate_key("observation/")
    assert list(back.keys()) == ["frame", "reward"]
    assert back["frame"] is obs["frame"]

    # A DictTensor of 0-d tensors is a record: named scalars without a batch dimension, which is how
    # rlstructures programs return their losses. Reading, moving and detaching work; a batch
    # operation says there are no rows, and 0-d and batched tensors never share one DictTensor.
    w = torch.ones(2, requires_grad=True)
    losses = DictTensor({"loss": (w * 3).sum(), "entropy": w.mean()})
    (losses["loss"] - 0.01 * losses["entropy"]).backward()
    logged = {k: v.item() for k, v in losses.detach().items()}
    assert losses.is_record() and logged == {"loss": 6.0, "entropy": 1.0}
    try:
        losses.n_elems()
    except BatchSizeError as e:
        print("   a record has no rows:", e)
    else:
        raise AssertionError("a record of 0-d tensors has no batch size")


def slicing_and_indexing() -> None:
    print("== 2. Slicing and indexing keep the batch dimension")
    d = DictTensor({"x": torch.arange(10).view(5, 2), "id": torch.arange(5)})
    # The single-index convention: slice(i) and index(i) return ONE ROW, still a batch ([1, ...]).
    # rlstructures dropped the batch dim in DictTensor.slice(i) but not in TemporalDictTensor.slice(i);
    # here every structure keeps it, so a row can always be fed back to an agent or concatenated.
    row = d.slice(2)
    assert row.n_elems() == 1 and row["x"].shape == (1, 2)
    assert row["id"].tolist() == [2]
    assert d.index(-1)["id"].tolist() == [4]
    # slice(a, b) is a range of rows; slices are views that share memory with the original.
    part = d.slice(1, 3)
    assert part["id"].tolist() == [1, 2]
    assert part["x"].data_ptr() == d["x"][1:3].data_ptr()
    # index() also takes a LongTensor of row ids (a gather: copies) or a bool mask of B rows.
    assert d.index(torch.tensor([4, 0]))["id"].tolist() == [4, 0]
    keep = d["id"] % 2 == 0
    assert d.index(keep)["id"].tolist() == [0, 2, 4]
    # unfold() is the list of rows, and DictTensor.cat puts rows back together.
    rows = d.unfold()
    assert len(rows) == 5
    assert torch.equal(DictTensor.cat(rows)["x"], d["x"])


def masking() -> None:
    print("== 3. Masking: pick rows from one of two batches")
    # masked_tensor(a, b, mask) takes row b where mask is true, else row a. Agents use it to reset
    # their recurrent state where an episode starts (observation["initial_state"]), batched, with no
    # Python branch. It selects (torch.where), so a NaN in the unselected rows does not leak.
    a = torch.zeros(4, 3)
    b = torch.full((4, 3), float("nan"))
    b[1] = 7.0
    mask = torch.tensor([False, True, False, False])
    out = masked_tensor(a, b, mask)
    assert out[1].tolist() == [7.0, 7.0, 7.0]
    assert not out.isnan().any()
    # masked_dicttensor does it key by key.
    state = DictTensor({"h": torch.randn(4, 8), "t": torch.tensor([5, 3, 9, 1])})
    fresh = DictTensor({"h": torch.zeros(4, 8), "t": torch.zeros(4, dtype=torch.long)})
    reset = masked_dicttensor(state, fresh, torch.tensor([True, False, False, True]))
    assert reset["t"].tolist() == [0, 3, 9, 0]
    assert torch.equal(reset["h"][1], state["h"][1])


def temporal_dicttensor() -> TemporalDictTensor:
    print("== 4. TemporalDictTensor: variable-length sequences")
    # B=3 sequences padded to T=10 steps; only the first lengths[b] steps of row b are meaningful.
    td = TemporalDictTensor(
        {"x": torch.randn(3, 10, 5), "y": torch.randn(3, 10, 8)},
        lengths=torch.tensor([6, 10, 3]),
    )
    print(td)
    assert td.n_elems() == 3 and td.temporal_size() == 10
    # mask() is float32 [B, T]: 1 on valid steps, 0 on padding. Multiply losses by it.
    m = td.mask()
    assert m.sum(1).tolist() == [6.0, 10.0, 3.0]
    assert m[2].tolist() == [1.0] * 3 + [0.0] * 7
    # temporal_slice(a, b) cuts steps [a, b) of every row and clamps the lengths.
    first4 = td.temporal_slice(0, 4)
    assert first4.lengths.tolist() == [4, 4, 3]
    assert td.temporal_slice(5, 10).lengths.tolist() == [1, 5, 0]
    # temporal_index(t) is step t of every row (a DictTensor [B, ...], padding included);
    # masked_temporal_index(t) keeps only the rows still running at t, and says which.
    step5, rows = td.masked_temporal_index(5)
    assert rows.tolist() == [0, 1] and step5.n_elems() == 2
    assert td.temporal_index(5).n_elems() == 3
    # The single-index convention holds here too: one row, batch dimension kept.
    assert td.slice(1)["x"].shape == (1, 10, 5)
    assert td.slice(1).lengths.tolist() == [10]
    # cat() joins batches of different T by zero-padding in time (dtypes kept).
    short = TemporalDictTensor({"x": torch.ones(2, 4, 5), "y": torch.ones(2, 4, 8)})
    joined = TemporalDictTensor.cat([td, short])
    assert joined.temporal_size() == 10
    assert joined.lengths.tolist() == [6, 10, 3, 4, 4]
    # shorten() drops the time steps that no row uses.
    assert td.temporal_slice(0, 4).shorten().temporal_size() == 4
    assert TemporalDictTensor({"x": torch.zeros(2, 9)}, torch.tensor([2, 5])).shorten().temporal_size() == 5
    return td


def trajectories(td: TemporalDictTensor) -> Trajectories:
    print("== 5. Trajectories: per-trajectory info + steps")
    # A batcher returns Trajectories: info holds one row per trajectory (the agent_info it ran with,
    # the env_info, the agent state when the acquisition started); trajectories holds the steps.
    info = DictTensor({"agent_info/epsilon": torch.tensor([0.1, 0.2, 0.3])})
    traj = Trajectories(info, td)
    assert traj.n_elems() == 3
    # Both parts are indexed together, so a trajectory never loses its info row.
    sub = traj.index(torch.tensor([2, 0]))
    assert torch.equal(sub.info["agent_info/epsilon"], torch.tensor([0.3, 0.1]))
    assert sub.trajectories.lengths.tolist() == [3, 6]
    # sample(n) draws n trajectories without replacement (e.g. from a replay of episodes).
    g = torch.Generator().manual_seed(0)
    assert traj.sample(2, generator=g).n_elems() == 2
    # The info batch must match the steps' batch: one info row per trajectory.
    try:
        Trajectories(DictTensor({"agent_info/epsilon": torch.zeros(2)}), td)
    except BatchSizeError as e:
        print("   mismatched info:", e)
    else:
        raise AssertionError("an info of 2 rows must not describe 3 trajectories")
    return traj


def devices(traj: Trajectories) -> None:
    print("== 6. Devices: to() moves, and returns self when already there")
    # A second device to move to: the GPU when there is one; otherwise the "meta" device, which
    # has shapes and dtypes but no data. It is enough to show which device a tensor is on.
    other = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("meta")
    print(f"   the other device here is {other}")

    # to() on the device a structure is already on returns the structure itself: no copy, no cost.
    # That is why a learner can always write trajectories.to(learner_device) without thinking.
    assert traj.to("cpu") is traj
    assert traj.info.to(torch.device("cpu")) is traj.info
    assert traj.trajectories.to("cpu:0") is traj.trajectories  # devices compare by type and index
    # clone() is the way to get a copy.
    copy = traj.info.clone()
    assert copy is not traj.info and torch.equal(copy["agent_info/epsilon"], traj.info["agent_info/epsilon"])

    # to(other) moves every tensor, and the lengths, together.
    moved = traj.to(other)
    assert moved.device() == other and moved.info.device() == other
    assert moved.trajectories.lengths.device == other
    assert moved.trajectories["x"].shape == (3, 10, 5)
    # A container lives on one device: mixing is refused, and the message names the keys.
    try:
        DictTensor({"a": torch.zeros(2), "b": torch.zeros(2, device=other)})
    except DeviceMismatchError as e:
        print("   mixed devices:", e)
    else:
        raise AssertionError("a DictTensor must not mix devices")


def large_batch() -> None:
    print("== 7. The containers cost little more than a dict of tensors")
    # Views and no-op moves are what keep the containers cheap at scale: slicing a million-row batch
    # touches no data. RLSTRUCT_TUTORIAL_SCALE sets the size here.
    B = max(1000, int(1_000_000 * SCALE))
    d = DictTensor({"frame": torch.randn(B, 4), "done": torch.zeros(B, dtype=torch.bool)})
    t0 = time.perf_counter()
    for _ in range(1000):
        half = d.slice(0, B // 2)
        same = half.to("cpu")
    dt = (time.perf_counter() - t0) / 1000
    assert same is half and half["frame"].data_ptr() == d["frame"].data_ptr()
    print(f"   slice + to('cpu') of {B} rows: {dt * 1e6:.1f} us (no data copied)")


def main() -> None:
    torch.manual_seed(0)
    dicttensor_basics()
    slicing_and_indexing()
    masking()
    td = temporal_dicttensor()
    traj = trajectories(td)
    devices(traj)
    large_batch()
    print("tutorial 01: all claims hold")


if __name__ == "__main__":
    main()
