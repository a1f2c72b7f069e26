"""The agents' counter-based draws: pinned to fixed values for fixed seeds, rows and steps (runs, golden runs and the
learning tests depend on every bit), the same on the CPU's numpy hash and on the int64 tensor hash of the other
devices, and independent of the other rows a process draws for."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from rlstruct.algos._noise import CounterNoise

CPU = torch.device("cpu")

# (seed, env_index) -> at steps 0 and 5: uniform((3, 2)) * 2**23 - 1/2 (the 23 hashed bits), normal((2, 2), stream=4),
# integers(5, (4,), stream=1)
PINNED = {
    (0, 0): [
        ([[6705983, 5642912], [5434234, 5709723], [4253055, 1630155]],
         [[1.8236769437789917, 0.32828813791275024], [-1.2641894817352295, 1.6757371425628662]], [2, 1, 2, 2]),
        ([[2925384, 6735176], [3211093, 1160501], [1402506, 7006404]],
         [[-0.5699285864830017, -1.987492322921753], [0.057140860706567764, 0.8818614482879639]], [0, 1, 4, 1]),
    ],
    (7, 3): [
        ([[6661775, 1967729], [1315240, 1444207], [7735909, 8262624]],
         [[0.8712859153747559, -1.9906352758407593], [-0.7491582036018372, 1.040716290473938]], [4, 4, 0, 4]),
        ([[8300165, 1355820], [3039821, 4185659], [7484465, 7009856]],
         [[2.2854220867156982, -1.0126594305038452], [-0.8906854391098022, -2.0081520080566406]], [2, 0, 1, 4]),
    ],
    (2**40 + 5, 1000): [
        ([[7689364, 1657441], [6421151, 2899830], [914521, 5904388]],
         [[0.2178514301776886, 1.489581823348999], [2.5967941284179688, 0.5766242742538452]], [1, 3, 3, 1]),
        ([[1260998, 958060], [8253509, 6932656], [5699262, 4006768]],
         [[1.119941234588623, 1.2792606353759766], [-0.703060507774353, -1.1570707559585571]], [1, 4, 4, 3]),
    ],
}


def tensor_hash(noise: CounterNoise) -> CounterNoise:
    """``noise`` hashing in int64 tensors, as it does off the CPU."""
    noise._numpy = False
    noise._step = torch.zeros((), dtype=torch.int64)
    return noise


@pytest.mark.parametrize("path", ["numpy", "tensor"])
@pytest.mark.parametrize(("seed", "env_index"), sorted(PINNED))
def test_draws_are_pinned(seed, env_index, path):
    noise = CounterNoise(seed, env_index, CPU)
    if path == "tensor":
        noise = tensor_hash(noise)
    got = []
    for t in range(6):
        if t in (0, 5):
            u, z, i = noise.uniform((3, 2)), noise.normal((2, 2), stream=4), noise.integers(5, (4,), stream=1)
            assert u.dtype == z.dtype == torch.float32 and i.dtype == torch.int64
            bits = u.double() * 2**23 - 0.5
            assert torch.equal(bits, bits.round())
            got.append((bits.to(torch.int64).tolist(), z, i.tolist()))
        noise.advance()
    for (bits, z, i), (want_bits, want_z, want_i) in zip(got, PINNED[seed, env_index]):
        assert bits == want_bits and i == want_i
        # Box-Muller's log and cos round as the CPU's vectorised kernels do: equal here, within a float32 ulp on any CPU
        torch.testing.assert_close(z, torch.tensor(want_z), rtol=2e-7, atol=0.0)


def test_normal_is_box_muller_of_two_uniform_streams_bit_for_bit():
    noise = CounterNoise(3, 2, CPU)
    for _ in range(3):
        for shape, stream in (((5, 3), 0), ((64, 1), 2), ((17,), 1)):
            u1, u2 = noise.uniform(shape, stream | 1 << 10), noise.uniform(shape, stream | 2 << 10)
            want = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
            assert torch.equal(noise.normal(shape, stream), want)
        noise.advance()


def test_many_draws_are_pinned():
    """40 steps of three kinds of draws over several row counts in one step (an episodic batcher's running set
    shrinks): one digest of every bit."""
    h = hashlib.sha256()
    noise = CounterNoise(11, 5, CPU)
    for _ in range(40):
        for B in (1, 17, 64, 3):
            h.update(noise.uniform((B, 2)).numpy().tobytes())
            h.update(noise.integers(6, (B,), stream=1).numpy().tobytes())
            h.update(noise.uniform((B,), stream=3).numpy().tobytes())
        noise.advance()
    assert h.hexdigest() == "2a748e26c2a129c17fa87d1539fabd268ce669473ca01648d384b422f343befb"


def test_rows_are_the_envs_and_repeat_within_a_step():
    """Row ``j`` is env ``env_index + j`` whatever the other rows; the same call at the same step draws the same."""
    whole, part = CounterNoise(5, 0, CPU), CounterNoise(5, 6, CPU)
    for _ in range(4):
        assert torch.equal(whole.uniform((10, 3))[6:], part.uniform((4, 3)))
        assert torch.equal(whole.integers(7, (10,), stream=1)[6:9], part.integers(7, (3,), stream=1))
        assert torch.equal(whole.normal((8, 2))[6:], part.normal((2, 2)))
        assert torch.equal(whole.uniform([10, 3]), whole.uniform((10, 3)))  # a list or a tuple of sizes
        whole.advance()
        part.advance()


def test_draws_served_from_blocks_are_each_steps_own():
    """On the CPU a draw asked for at consecutive steps comes from blocks of steps: whatever steps it is asked at
    (runs of steps, gaps, a new row count, a draw too large for a block), it is that step's draw, as the per-step
    tensor hash computes it."""
    asked = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, *range(40, 150)}
    kinds = [("uniform", (6, 2), 0), ("normal", (6, 1), 3), ("integers", (6,), 1), ("uniform", (5,), 0)]
    served, alone = CounterNoise(4, 1, CPU), tensor_hash(CounterNoise(4, 1, CPU))
    for t in range(150):
        if t in asked:
            for kind, shape, stream in kinds[: 3 if t % 7 else 4]:
                if kind == "integers":
                    want, got = alone.integers(9, shape, stream), served.integers(9, shape, stream)
                else:
                    want, got = getattr(alone, kind)(shape, stream), getattr(served, kind)(shape, stream)
                assert torch.equal(got, want), (t, kind)
        if t in (0, 41, 100):
            assert torch.equal(served.uniform((70_000,), 5), alone.uniform((70_000,), 5))
        served.advance()
        alone.advance()
