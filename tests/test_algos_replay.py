"""The replay buffer of the off-policy algorithms (rlstruct.algos.replay)."""

from __future__ import annotations

import pytest
import torch

from rlstruct.algos.replay import ReplayBuffer
from rlstruct.algos.run import EnvSpec


def _push_ids(buf: ReplayBuffer, ids: torch.Tensor) -> None:
    """Pushes transitions whose every field encodes its id (obs = id, next_obs = id + 0.5)."""
    obs = ids.float().unsqueeze(1)
    buf.push(obs, ids, ids.float(), obs + 0.5, torch.ones(len(ids)))


def test_replay_buffer_is_circular_and_samples_what_it_holds():
    buf = ReplayBuffer(5, 1, "cpu", seed=0)
    for start in (0, 3, 6):
        _push_ids(buf, torch.arange(start, start + 3))
    assert len(buf) == 5 and buf.pos == 4
    assert buf.action.tolist() == [5, 6, 7, 8, 4]  # 9 transitions in 5 slots: slots 0-3 hold 5-8
    batch = buf.sample(200)
    assert set(batch["action"].tolist()) == {4, 5, 6, 7, 8}
    torch.testing.assert_close(batch["obs"].squeeze(1), batch["action"].float())
    torch.testing.assert_close(batch["next_obs"].squeeze(1), batch["action"].float() + 0.5)
    torch.testing.assert_close(batch["ret"], batch["action"].float())
    _push_ids(buf, torch.arange(12))  # more than the capacity: only the newest 5 are kept
    assert sorted(buf.action.tolist()) == [7, 8, 9, 10, 11] and len(buf) == 5


def test_sampling_before_the_buffer_is_full_only_draws_what_was_pushed():
    buf = ReplayBuffer(100, 1, "cpu", seed=0)
    _push_ids(buf, torch.arange(3))
    assert set(buf.sample(300)["action"].tolist()) == {0, 1, 2}


def test_sampling_is_reproducible_by_seed():
    def draws(seed: int) -> list[int]:
        buf = ReplayBuffer(50, 1, "cpu", seed=seed)
        _push_ids(buf, torch.arange(50))
        return [buf.sample(16)["action"].tolist() for _ in range(3)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_uint8_frames_stay_uint8_in_the_buffer_and_sample_as_float():
    buf = ReplayBuffer(8, (4, 6, 6), "cpu", obs_dtype=torch.uint8, seed=0)
    frames = torch.randint(0, 256, (3, 4, 6, 6), dtype=torch.uint8)
    buf.push(frames, torch.tensor([0, 1, 2]), torch.zeros(3), frames.flip(0), torch.ones(3))
    assert buf.obs.dtype == buf.next_obs.dtype == torch.uint8
    assert buf.obs.element_size() == 1 and buf.nbytes() == 2 * 8 * 144 + 8 * 8 + 2 * 8 * 4
    torch.testing.assert_close(buf.obs[:3], frames, rtol=0, atol=0)
    batch = buf.sample(10)
    assert batch["obs"].dtype == batch["next_obs"].dtype == torch.float32
    assert batch["obs"].shape == (10, 4, 6, 6)
    torch.testing.assert_close(batch["obs"], frames[batch["action"]].float())
    torch.testing.assert_close(batch["next_obs"], frames.flip(0)[batch["action"]].float())
    assert batch["obs"].max() > 1  # not rescaled: the network divides by 255


def test_continuous_actions_keep_their_shape_and_dtype():
    spec = EnvSpec((3,), "float32", None, 200, action_shape=(2,), action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    buf = ReplayBuffer.for_spec(spec, 10, "cpu", seed=1)
    actions = torch.tensor([[0.25, -0.5], [1.0, 0.0]])
    buf.push(torch.zeros(2, 3), actions, torch.tensor([1.0, 2.0]), torch.ones(2, 3), torch.tensor([0.99, 0.0]))
    assert buf.action.dtype == torch.float32 and buf.action.shape == (10, 2)
    batch = buf.sample(64)
    assert batch["action"].shape == (64, 2) and batch["obs"].shape == (64, 3)
    first = batch["ret"] == 1.0
    torch.testing.assert_close(batch["action"][first], actions[0].expand(int(first.sum()), 2))
    torch.testing.assert_close(batch["discount"], torch.where(first, 0.99, 0.0))


def test_for_spec_of_a_discrete_image_env():
    spec = EnvSpec((4, 84, 84), "uint8", 6, 1000)
    buf = ReplayBuffer.for_spec(spec, 4, "cpu")
    assert buf.obs.shape == (4, 4, 84, 84) and buf.obs.dtype == torch.uint8
    assert buf.action.shape == (4,) and buf.action.dtype == torch.int64


def test_push_of_a_wrong_shape_names_the_field():
    buf = ReplayBuffer(10, 3, "cpu")
    with pytest.raises(ValueError, match=r"next_obs must have shape \[2, 3\].*got \[2, 4\]"):
        buf.push(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2, 4), torch.ones(2))
    with pytest.raises(ValueError, match=r"discount must have shape \[2\]"):
        buf.push(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2, 3), torch.ones(3))


def test_empty_buffer_and_bad_capacity_are_errors():
    with pytest.raises(ValueError, match="capacity must be >= 1 transition, got 0"):
        ReplayBuffer(0, 3, "cpu")
    with pytest.raises(ValueError, match="the replay buffer is empty"):
        ReplayBuffer(4, 3, "cpu").sample(2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_buffer_lives_on_its_device():
    buf = ReplayBuffer(8, 2, "cuda", seed=0)
    _ = torch.zeros(1, device="cuda")
    buf.push(torch.zeros(3, 2), torch.arange(3), torch.zeros(3), torch.zeros(3, 2), torch.ones(3))
    batch = buf.sample(4)
    assert all(v.device.type == "cuda" for v in batch.values())
