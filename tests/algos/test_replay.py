"""The replay buffer of the off-policy algorithms (rlstruct.algos.replay).

The oracle of the buffer that stores each observation once is :class:`ReferenceBuffer`, the buffer as it was with an
``obs`` and a ``next_obs`` per transition: for the same pushes and the same seed, every sample is bit for bit the same.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstruct.algos._train.env_spec import EnvSpec, create_env, describe_env
from rlstruct.algos.dqn import create_q_agent
from rlstruct.algos.replay import NStepWindow, ReplayBuffer, one_step_steps, one_step_transitions, steps_to_transitions
from rlstruct.batchers import RL_Batcher
from rlstruct.structures import DictTensor, TemporalDictTensor


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
    buf = ReplayBuffer(8, (4, 6, 6), "cpu", obs_dtype=torch.uint8, seed=0, frame_capacity=16)
    frames = torch.randint(0, 256, (3, 4, 6, 6), dtype=torch.uint8)
    buf.push(frames, torch.tensor([0, 1, 2]), torch.zeros(3), frames.flip(0), torch.ones(3))
    assert buf.frames.dtype == torch.uint8
    # 16 frames, two int64 frame numbers, an int64 action and two float32 per transition
    assert buf.frames.element_size() == 1 and buf.nbytes() == 16 * 144 + 3 * 8 * 8 + 2 * 8 * 4
    torch.testing.assert_close(buf.frames[:3], frames, rtol=0, atol=0)
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
    buf = ReplayBuffer.for_spec(spec, 32, "cpu")
    assert buf.frames.shape == (32 + 1 + 64, 4, 84, 84) and buf.frames.dtype == torch.uint8
    buf = ReplayBuffer.for_spec(spec, 4, "cpu")
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
    with pytest.raises(ValueError, match="frame_capacity must be >= 1 frame or None, got 0"):
        ReplayBuffer(4, 3, "cpu", frame_capacity=0)
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
    steps = one_step_steps(TemporalDictTensor(_streams(2, 6, 0.3, 0, torch.float32)), 0.9)
    once, twice = ReplayBuffer(8, (2, 3), "cuda", seed=0), ReplayBuffer(8, (2, 3), "cuda", seed=0)
    once.push_steps(**steps)
    twice.push(**steps_to_transitions(steps))
    a, b = once.sample(16), twice.sample(16)
    assert all(a[k].device.type == "cuda" and torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- each observation once
class ReferenceBuffer:
    """The oracle: the replay buffer with an ``obs`` and a ``next_obs`` per transition (what ``push`` stored before
    observations were stored once), the same ring and the same sampling."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], *, seed: int, obs_dtype: torch.dtype):
        self.capacity, self.pos, self.size = capacity, 0, 0
        self.obs = torch.zeros(capacity, *obs_shape, dtype=obs_dtype)
        self.next_obs = torch.zeros(capacity, *obs_shape, dtype=obs_dtype)
        self.action = torch.zeros(capacity, dtype=torch.int64)
        self.ret = torch.zeros(capacity)
        self.discount = torch.zeros(capacity)
        self.generator = torch.Generator().manual_seed(seed)

    def push(self, obs, action, ret, next_obs, discount) -> None:
        n = obs.shape[0]
        if n > self.capacity:
            keep = slice(n - self.capacity, None)
            obs, action, ret, next_obs, discount = obs[keep], action[keep], ret[keep], next_obs[keep], discount[keep]
            n = self.capacity
        idx = (torch.arange(n) + self.pos) % self.capacity
        self.obs[idx] = obs.to(self.obs.dtype)
        self.action[idx] = action
        self.ret[idx] = ret.float()
        self.next_obs[idx] = next_obs.to(self.obs.dtype)
        self.discount[idx] = discount.float()
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        idx = torch.randint(self.size, (batch_size,), generator=self.generator)
        return {"obs": self.obs[idx].float(), "action": self.action[idx], "ret": self.ret[idx],
                "next_obs": self.next_obs[idx].float(), "discount": self.discount[idx]}


def _streams(B: int, steps: int, p_end: float, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``steps`` steps of ``B`` auto-reset envs as a batcher records them: every observation a distinct frame
    (``uint8 [2, 3]`` or ``float32 [2, 3]``), ``_observation/frame[t]`` the next step's observation where the episode
    goes on and a terminal frame of its own where it ends (terminated or truncated)."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(B, steps, generator=g) < p_end
    terminated = done & (torch.rand(B, steps, generator=g) < 0.5)
    values = torch.randperm(B * (2 * steps + 1), generator=g).view(B, 2 * steps + 1) + 1  # < 255 for uint8 tests
    seen = values[:, : steps + 1]  # the observations of steps 0..steps
    terminal = values[:, steps + 1 :]
    nxt = torch.where(done, terminal, seen[:, 1:])

    def frames(v: torch.Tensor) -> torch.Tensor:
        return (v[..., None, None] * torch.tensor([[1, 1, 1], [0, 1, 0]]) + 1).to(dtype)

    return {
        "observation/frame": frames(seen[:, :steps]),
        "action/action": torch.randint(0, 4, (B, steps), generator=g),
        "_observation/reward": torch.randn(B, steps, generator=g),
        "_observation/done": done,
        "_observation/terminated": terminated,
        "_observation/frame": frames(nxt),
    }


def _check_same_samples(new: ReplayBuffer, ref: ReferenceBuffer, batch_size: int = 24) -> None:
    assert len(new) == ref.size
    a, b = new.sample(batch_size), ref.sample(batch_size)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@settings(max_examples=150, deadline=None)
@given(
    B=st.integers(1, 3), T=st.integers(1, 5), n=st.integers(1, 3), k=st.integers(1, 7),
    capacity=st.integers(1, 40), frame_capacity=st.one_of(st.none(), st.integers(1, 30)),
    p_end=st.sampled_from([0.0, 0.2, 0.6, 1.0]), seed=st.integers(0, 2**16), uint8=st.booleans(),
)
def test_push_steps_samples_what_one_obs_and_next_obs_per_transition_gave(B, T, n, k, capacity, frame_capacity,
                                                                           p_end, seed, uint8):
    n = min(n, T)  # NStepWindow's first window must hold one n-step return
    dtype = torch.uint8 if uint8 else torch.float32
    data = _streams(B, k * T, p_end, seed, dtype)
    new = ReplayBuffer(capacity, (2, 3), "cpu", obs_dtype=dtype, seed=seed, frame_capacity=frame_capacity)
    ref = ReferenceBuffer(capacity, (2, 3), seed=seed, obs_dtype=dtype)
    windows = (NStepWindow(0.9, n), NStepWindow(0.9, n))
    for i in range(k):
        tt = TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})
        new.push_steps(**windows[0].steps(tt))
        ref.push(**windows[1](tt))
        _check_same_samples(new, ref)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 6), k=st.integers(1, 6), capacity=st.integers(1, 30),
       p_end=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
def test_push_steps_of_sac_and_push_of_whole_transitions_sample_what_the_oracle_does(B, T, k, capacity, p_end, seed):
    data = _streams(B, k * T, p_end, seed, torch.float32)
    steps = ReplayBuffer(capacity, (2, 3), "cpu", seed=seed)
    whole = ReplayBuffer(capacity, (2, 3), "cpu", seed=seed)
    ref = ReferenceBuffer(capacity, (2, 3), seed=seed, obs_dtype=torch.float32)
    for i in range(k):
        tt = TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})
        steps.push_steps(**one_step_steps(tt, 0.9))
        whole.push(**one_step_transitions(tt, 0.9))
        ref.push(**one_step_transitions(tt, 0.9))
        a, b, c = steps.sample(16), whole.sample(16), ref.sample(16)
        assert all(torch.equal(a[key], c[key]) and torch.equal(b[key], c[key]) for key in c)


@settings(max_examples=300, deadline=None)
@given(B=st.integers(1, 3), plan=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4), st.integers(0, 9),
                                                   st.booleans()), min_size=1, max_size=8),
       capacity=st.integers(1, 30), frame_capacity=st.one_of(st.none(), st.integers(1, 20)),
       p_end=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
def test_windows_that_carry_any_number_of_steps_among_plain_pushes_sample_what_the_oracle_does(
    B, plan, capacity, frame_capacity, p_end, seed
):
    """Windows of T new steps after ``carried`` steps of the previous one (any number, up to all of them), with
    transitions over any prefix of the window and of any length up to 3 steps cut at episode ends; plain pushes of
    whole transitions in between."""
    g = torch.Generator().manual_seed(seed)
    data = _streams(B, sum(t for _, t, _, _ in plan), p_end, seed, torch.float32)
    new = ReplayBuffer(capacity, (2, 3), "cpu", seed=seed, frame_capacity=frame_capacity)
    ref = ReferenceBuffer(capacity, (2, 3), seed=seed, obs_dtype=torch.float32)
    end, previous = 0, 0
    for carried, T, m_draw, plain in plan:
        carried = 0 if end == 0 else min(carried, previous)
        begin, end = end - carried, end + T
        L = end - begin
        window = {k: v[:, begin:end] for k, v in data.items()}
        M = 1 + m_draw % L
        done = window["_observation/done"]
        last = torch.zeros(B, M, dtype=torch.int64)
        for b in range(B):
            for t in range(M):
                stop = min(t + int(torch.randint(0, 3, (), generator=g)), L - 1)
                ends = [u for u in range(t, stop + 1) if done[b, u]]
                last[b, t] = ends[0] if ends else stop
        steps = {"obs": window["observation/frame"], "next_obs": window["_observation/frame"], "done": done,
                 "action": window["action/action"][:, :M], "ret": window["_observation/reward"][:, :M],
                 "last": last, "discount": torch.rand(B, M, generator=g)}
        new.push_steps(**steps, carried=carried)
        ref.push(**steps_to_transitions(steps))
        _check_same_samples(new, ref)
        if plain:
            extra = steps_to_transitions(steps)
            new.push(**extra)
            ref.push(**extra)
            _check_same_samples(new, ref)
        previous = L


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_a_batchers_acquisitions_sample_what_the_oracle_does(backend):
    """The batcher's own steps (its auto-reset, time limits and terminations): ``observation/frame[t + 1]`` is
    ``_observation/frame[t]`` where the episode goes on, which is what storing each observation once relies on."""
    spec = describe_env("CartPole-v1", backend, 12)
    new = ReplayBuffer(40, 4, "cpu", seed=5, frame_capacity=44)
    ref = ReferenceBuffer(40, (4,), seed=5, obs_dtype=torch.float32)
    windows = (NStepWindow(0.9, 3), NStepWindow(0.9, 3))
    with RL_Batcher(5, create_q_agent, {"spec": spec, "hidden_sizes": (8,)}, create_env,
                    {"name": "CartPole-v1", "n_envs": 3, "backend": backend, "autoreset": True,
                     "max_episode_steps": 12}, 0, [0], agent_info=DictTensor({"epsilon": torch.tensor([1.0])})) as b:
        b.reset()
        ends = 0
        for _ in range(8):
            b.execute()
            tt = b.get()[0].trajectories
            ends += int(tt["_observation/done"].sum())
            new.push_steps(**windows[0].steps(tt))
            ref.push(**windows[1](tt))
            _check_same_samples(new, ref)
    assert ends > 3


def test_each_observation_is_stored_once():
    B, T, k = 4, 16, 8
    data = _streams(B, k * T, 0.0, 0, torch.float32)
    data["_observation/done"][:, 37] = True  # one episode end per env
    data["_observation/frame"][:, 37] = -1.0
    buf = ReplayBuffer(B * k * T, (2, 3), "cpu", frame_capacity=B * k * T + 2 * B)
    window = NStepWindow(0.9, 3)
    for i in range(k):
        buf.push_steps(**window.steps(TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})))
    # every step's observation, the observation after the last step, and one terminal observation per env
    assert buf._n_frames == B * (k * T + 1) + B
    assert len(buf) == B * (k * T - 2)


def test_a_frame_ring_too_small_grows_and_says_so(caplog):
    data = _streams(2, 12, 0.5, 1, torch.float32)
    buf = ReplayBuffer(20, (2, 3), "cpu", frame_capacity=4)
    ref = ReferenceBuffer(20, (2, 3), seed=0, obs_dtype=torch.float32)
    with caplog.at_level(logging.INFO, logger="rlstruct.algos.replay"):
        for i in range(4):
            tt = TemporalDictTensor({key: v[:, i * 3:(i + 1) * 3] for key, v in data.items()})
            buf.push_steps(**one_step_steps(tt, 0.9))
            ref.push(**one_step_transitions(tt, 0.9))
            _check_same_samples(buf, ref)
    assert "frame ring grows from 4 to" in caplog.text and buf.frames.shape[0] > 4


def test_push_steps_errors_name_the_argument():
    buf = ReplayBuffer(10, 3, "cpu")
    tt = TemporalDictTensor({k: v[:, :, :1, :].flatten(2) if k.endswith("frame") else v
                             for k, v in _streams(2, 4, 0.2, 0, torch.float32).items()})
    args = one_step_steps(tt, 0.9)
    with pytest.raises(ValueError, match=r"obs must have shape \[2, 4, 3\].*got \[2, 4, 2\]"):
        buf.push_steps(**{**args, "obs": args["obs"][..., :2]})
    with pytest.raises(ValueError, match=r"done must be bool \[B, L\].*got shape \[8\]"):
        buf.push_steps(**{**args, "done": args["done"].flatten()})
    with pytest.raises(ValueError, match="carried must be 0 in the first window"):
        buf.push_steps(**args, carried=1)
    buf.push_steps(**args)
    with pytest.raises(ValueError, match=r"carried must be in \[0, 4\].*got carried=5"):
        buf.push_steps(**args, carried=5)
    with pytest.raises(ValueError, match="1 <= M <= L=4"):
        buf.push_steps(**{**args, "action": args["action"][:, :0], "ret": args["ret"][:, :0],
                          "last": args["last"][:, :0], "discount": args["discount"][:, :0]})


def test_steps_to_transitions_is_what_push_stores():
    tt = TemporalDictTensor(_streams(2, 5, 0.4, 3, torch.float32))
    steps = one_step_steps(tt, 0.5)
    flat = steps_to_transitions(steps)
    assert flat["obs"].shape == (10, 2, 3) and torch.equal(flat["next_obs"], tt["_observation/frame"].flatten(0, 1))


def test_bytes_per_transition_of_atari_frames():
    """One 4x84x84 uint8 frame per transition (and two frame numbers) instead of two frames: 1M transitions take
    29.1 GB instead of 56.5 GB."""
    frame = 4 * 84 * 84
    before = 2 * frame + 8 + 4 + 4  # obs, next_obs, an int64 action, float32 ret and discount
    per_transition = frame + 8 + 8 + 8 + 4 + 4  # the frame, obs_id, next_id, action, ret, discount
    buf = ReplayBuffer(1024, (4, 84, 84), "cpu", obs_dtype=torch.uint8)
    assert buf.nbytes() == (1024 + 1024 // 32 + 64) * frame + 1024 * (per_transition - frame)
    capacity = 1_000_000  # its frame ring's margin: 1/32 of the transitions and 64 frames
    after = ((capacity + capacity // 32 + 64) * frame + capacity * (per_transition - frame)) / capacity
    assert (before, per_transition) == (56_464, 28_256) and round(after) == 29_140
