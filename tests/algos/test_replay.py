"""The replay buffer of the off-policy algorithms (rlstruct.algos.replay).

The oracle of the buffer that stores each observation once is :class:`ReferenceBuffer`, the buffer as it was with an
``obs`` and a ``next_obs`` per transition: for the same pushes and the same seed, every sample is bit for bit the same.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstruct import _accel
from rlstruct.algos import EnvSpec, create_env, describe_env
from rlstruct.algos._replay_storage import StackedFrames, WholeObservations, default_obs_rows
from rlstruct.algos._replay_transitions import one_step_steps, one_step_transitions, steps_to_transitions
from rlstruct.algos.dqn import create_q_agent
from rlstruct.algos.replay import NStepWindow, ReplayBuffer, window_transitions
from rlstruct.batchers import RL_Batcher
from rlstruct.structures import DictTensor, TemporalDictTensor
from tests.fakes_accel import HostReads, RecordingAccelerator


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


def test_uint8_observations_stay_uint8_in_the_buffer_and_in_samples():
    buf = ReplayBuffer(8, (4, 6, 6), "cpu", obs_dtype=torch.uint8, seed=0, obs_capacity=16)
    frames = torch.randint(0, 256, (3, 4, 6, 6), dtype=torch.uint8)
    buf.push(frames, torch.tensor([0, 1, 2]), torch.zeros(3), frames.flip(0), torch.ones(3))
    assert buf.store.obs.dtype == torch.uint8
    # 16 observations, two int64 observation numbers, an int64 action and two float32 per transition
    assert buf.store.obs.element_size() == 1 and buf.nbytes() == 16 * 144 + 3 * 8 * 8 + 2 * 8 * 4
    torch.testing.assert_close(buf.store.obs[0:6:2], frames, rtol=0, atol=0)  # obs, next_obs, obs, ...
    batch = buf.sample(10)
    assert batch["obs"].dtype == batch["next_obs"].dtype == torch.uint8  # float only in the network's forward
    assert batch["obs"].shape == (10, 4, 6, 6)
    torch.testing.assert_close(batch["obs"], frames[batch["action"]], rtol=0, atol=0)
    torch.testing.assert_close(batch["next_obs"], frames.flip(0)[batch["action"]], rtol=0, atol=0)


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
    rows = 32 + 1 + 64  # observations: one frame each, and 1/8 more and two stacks for the starts of episodes
    assert buf.store.table.shape == (rows, 4) and buf.store.frames.shape == (rows + rows // 8 + 8, 84, 84)
    assert buf.store.frames.dtype == torch.uint8
    assert isinstance(ReplayBuffer.for_spec(EnvSpec((10, 10, 4), "bool", 6, 1000), 32, "cpu").store,
                      WholeObservations)  # MinAtar's planes are no stack of frames
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
    with pytest.raises(ValueError, match="obs_capacity must be >= 1 observation or None, got 0"):
        ReplayBuffer(4, 3, "cpu", obs_capacity=0)
    with pytest.raises(ValueError, match="the replay buffer is empty"):
        ReplayBuffer(4, 3, "cpu").sample(2)


def test_a_uniform_buffer_answers_the_prioritized_calls_without_changing_its_draws():
    plain, asked = ReplayBuffer(8, 1, "cpu", seed=1), ReplayBuffer(8, 1, "cpu", seed=1)
    for buf in (plain, asked):
        _push_ids(buf, torch.arange(8))
    asked.update_priorities(torch.arange(4), torch.tensor([100.0, 0.0, 0.0, 0.0]))
    asked.update_priorities(None, None)  # a uniform batch's: no rows, no TD errors
    asked.anneal(0.5)
    assert torch.equal(plain.sample(32)["action"], asked.sample(32)["action"])


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
        return {"obs": self.obs[idx], "action": self.action[idx], "ret": self.ret[idx],
                "next_obs": self.next_obs[idx], "discount": self.discount[idx]}


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


@pytest.mark.slow  # 1.6 CPU s on the reference CPU: slow is 1.5 s or more
@settings(max_examples=150, deadline=None)
@given(
    B=st.integers(1, 3), T=st.integers(1, 5), n=st.integers(1, 3), k=st.integers(1, 7),
    capacity=st.integers(1, 40), obs_capacity=st.one_of(st.none(), st.integers(1, 30)),
    p_end=st.sampled_from([0.0, 0.2, 0.6, 1.0]), seed=st.integers(0, 2**16), uint8=st.booleans(),
)
def test_push_steps_samples_what_one_obs_and_next_obs_per_transition_gave(B, T, n, k, capacity, obs_capacity,
                                                                           p_end, seed, uint8):
    n = min(n, T)  # NStepWindow's first window must hold one n-step return
    dtype = torch.uint8 if uint8 else torch.float32
    data = _streams(B, k * T, p_end, seed, dtype)
    new = ReplayBuffer(capacity, (2, 3), "cpu", obs_dtype=dtype, seed=seed, obs_capacity=obs_capacity)
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


@pytest.mark.slow  # 3.9 CPU s on the reference CPU: slow is 1.5 s or more
@settings(max_examples=300, deadline=None)
@given(B=st.integers(1, 3), plan=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4), st.integers(0, 9),
                                                   st.booleans()), min_size=1, max_size=8),
       capacity=st.integers(1, 30), obs_capacity=st.one_of(st.none(), st.integers(1, 20)),
       p_end=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
def test_windows_that_carry_any_number_of_steps_among_plain_pushes_sample_what_the_oracle_does(
    B, plan, capacity, obs_capacity, p_end, seed
):
    """Windows of T new steps after ``carried`` steps of the previous one (any number, up to all of them), with
    transitions over any prefix of the window and of any length up to 3 steps cut at episode ends; plain pushes of
    whole transitions in between."""
    g = torch.Generator().manual_seed(seed)
    data = _streams(B, sum(t for _, t, _, _ in plan), p_end, seed, torch.float32)
    new = ReplayBuffer(capacity, (2, 3), "cpu", seed=seed, obs_capacity=obs_capacity)
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
    new = ReplayBuffer(40, 4, "cpu", seed=5, obs_capacity=44)
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


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 5), n=st.integers(1, 3), k=st.integers(1, 7),
       capacity=st.integers(1, 40), p_end=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
def test_a_buffer_of_pairs_samples_what_the_oracle_does_and_pushes_steps_without_a_host_read(B, T, n, k, capacity,
                                                                                            p_end, seed):
    """Two observations per transition (what a run's buffer keeps on an accelerator): the same samples as the oracle,
    and no read on the host while pushing a window, in a ring that holds the transitions kept without growing."""
    n = min(n, T)
    data = _streams(B, k * T, p_end, seed, torch.float32)
    new = ReplayBuffer(capacity, (2, 3), "cpu", seed=seed, pairs=True)
    ref = ReferenceBuffer(capacity, (2, 3), seed=seed, obs_dtype=torch.float32)
    windows = (NStepWindow(0.9, n), NStepWindow(0.9, n))
    for i in range(k):
        tt = TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})
        steps = windows[0].steps(tt)
        with HostReads() as seen:
            new.push_steps(**steps)
        assert seen.reads == []
        ref.push(**windows[1](tt))
        _check_same_samples(new, ref)
    assert new.store.rows == default_obs_rows(capacity, pairs=True)


def test_push_steps_reads_its_count_of_new_observations_on_the_host_unless_the_buffer_keeps_pairs():
    tt = TemporalDictTensor(_streams(3, 6, 0.3, 2, torch.float32))
    for pairs, expected in ((False, ["aten.nonzero.default"]), (True, [])):
        buf = ReplayBuffer(32, (2, 3), "cpu", pairs=pairs)
        steps = NStepWindow(0.9, 2).steps(tt)
        with HostReads() as seen:
            buf.push_steps(**steps)
        assert [what for what, _ in seen.reads] == expected, pairs


def test_a_runs_buffer_keeps_pairs_in_memory_on_an_accelerator_of_whole_observations():
    from rlstruct.algos._train.config import OffPolicyConfig
    from rlstruct.algos._train.replay_setup import make_replay_buffer, stores_pairs

    config, cuda, cpu = OffPolicyConfig(buffer_size=100), torch.device("cuda"), torch.device("cpu")
    cartpole, atari = describe_env("CartPole-v1", "torch", None), EnvSpec((4, 84, 84), "uint8", 6, 1000)
    assert stores_pairs(config, cartpole, cuda) and not stores_pairs(config, cartpole, cpu)
    assert not stores_pairs(config, atari, cuda)  # stacked frames: a frame per step, several times less memory
    assert not stores_pairs(OffPolicyConfig(replay_storage="disk"), cartpole, cuda)
    with _accel.installed("cpu", RecordingAccelerator()):  # a test's fake stands for the accelerator
        assert stores_pairs(config, cartpole, cpu)
        buf = make_replay_buffer(config, cartpole, cpu, seed=0, folder=Path("unused"))
    assert buf.pairs and buf.nbytes() == ReplayBuffer.planned_nbytes(cartpole, 100, pairs=True)
    assert ReplayBuffer.planned_nbytes(cartpole, 100, pairs=True) > ReplayBuffer.planned_nbytes(cartpole, 100)


def test_each_observation_is_stored_once():
    B, T, k = 4, 16, 8
    data = _streams(B, k * T, 0.0, 0, torch.float32)
    data["_observation/done"][:, 37] = True  # one episode end per env
    data["_observation/frame"][:, 37] = -1.0
    buf = ReplayBuffer(B * k * T, (2, 3), "cpu", obs_capacity=B * k * T + 2 * B)
    window = NStepWindow(0.9, 3)
    for i in range(k):
        buf.push_steps(**window.steps(TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})))
    # every step's observation, the observation after the last step, and one terminal observation per env
    assert buf._n_obs == B * (k * T + 1) + B
    assert len(buf) == B * (k * T - 2)


def test_an_observation_ring_too_small_grows_and_says_so(caplog):
    data = _streams(2, 12, 0.5, 1, torch.float32)
    buf = ReplayBuffer(20, (2, 3), "cpu", obs_capacity=4)
    ref = ReferenceBuffer(20, (2, 3), seed=0, obs_dtype=torch.float32)
    with caplog.at_level(logging.INFO, logger="rlstruct.algos.replay"):
        for i in range(4):
            tt = TemporalDictTensor({key: v[:, i * 3:(i + 1) * 3] for key, v in data.items()})
            buf.push_steps(**one_step_steps(tt, 0.9))
            ref.push(**one_step_transitions(tt, 0.9))
            _check_same_samples(buf, ref)
    assert "observation ring grows from 4 to" in caplog.text and buf.store.obs.shape[0] > 4


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
    """One 84x84 uint8 frame per transition (its stack is four frame numbers) instead of a whole 4x84x84 stack:
    1M transitions take 8.3 GB instead of 29.1 GB."""
    frame, stack = 84 * 84, 4
    before = 4 * frame + 8 + 8 + 8 + 4 + 4  # a whole stack, obs_id, next_id, action, ret, discount
    buf = ReplayBuffer(1024, (stack, 84, 84), "cpu", obs_dtype=torch.uint8)

    def nbytes(capacity: int) -> int:
        rows = capacity + capacity // 32 + 64  # observations, and frames: 1/8 more and two stacks for episode starts
        return (rows + rows // 8 + 2 * stack) * frame + rows * stack * 8 + capacity * (8 + 8 + 8 + 4 + 4)

    assert buf.nbytes() == nbytes(1024)
    assert before == 28_256 and round(nbytes(1_000_000) / 1e9, 1) == 8.3


# --------------------------------------------------------------------------- stacked frames, each frame once
def _stacked_streams(B: int, steps: int, S: int, p_end: float, seed: int, reset: str) -> dict[str, torch.Tensor]:
    """``steps`` steps of ``B`` auto-reset envs whose observations are stacks of the ``S`` last frames (``uint8
    [S, 3, 3]``, random frames), stacked at a reset as ``reset`` says: ``"zeros"`` (ale-py's: zero frames before the
    first), ``"repeat"`` (the first frame ``S`` times) or ``"carry"`` (the stack goes on, as after a lost life)."""
    g = torch.Generator().manual_seed(seed)

    def frame() -> torch.Tensor:
        return torch.randint(0, 256, (3, 3), generator=g, dtype=torch.uint8)

    def fresh(previous: torch.Tensor | None) -> torch.Tensor:
        first = frame()
        if reset == "zeros":
            return torch.cat([torch.zeros(S - 1, 3, 3, dtype=torch.uint8), first[None]])
        if reset == "repeat":
            return first.expand(S, 3, 3).clone()
        return torch.cat([previous[1:], first[None]]) if previous is not None else first.expand(S, 3, 3).clone()

    obs = torch.zeros(B, steps, S, 3, 3, dtype=torch.uint8)
    nxt = torch.zeros_like(obs)
    done = torch.rand(B, steps, generator=g) < p_end
    for b in range(B):
        stack = fresh(None)
        for t in range(steps):
            obs[b, t] = stack
            nxt[b, t] = torch.cat([stack[1:], frame()[None]])
            stack = fresh(nxt[b, t]) if done[b, t] else nxt[b, t]
    return {"observation/frame": obs, "action/action": torch.randint(0, 4, (B, steps), generator=g),
            "_observation/reward": torch.randn(B, steps, generator=g), "_observation/done": done,
            "_observation/terminated": done & (torch.rand(B, steps, generator=g) < 0.5), "_observation/frame": nxt}


@settings(max_examples=120, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 5), n=st.integers(1, 3), k=st.integers(1, 6), S=st.integers(1, 4),
       capacity=st.integers(1, 40), obs_capacity=st.one_of(st.none(), st.integers(1, 30)),
       p_end=st.sampled_from([0.0, 0.2, 0.6, 1.0]), reset=st.sampled_from(["zeros", "repeat", "carry"]),
       seed=st.integers(0, 2**16), plain=st.booleans())
def test_stacked_frames_stored_once_sample_the_observations_the_env_gave(B, T, n, k, S, capacity, obs_capacity,
                                                                         p_end, reset, seed, plain):
    """Any stack, episode lengths, n-step windows and reset stacking: the samples are bit for bit those of the
    buffer with whole observations, and no frame of an earlier episode enters a stack the env did not give."""
    n = min(n, T)
    data = _stacked_streams(B, k * T, S, p_end, seed, reset)
    new = ReplayBuffer(capacity, (S, 3, 3), "cpu", obs_dtype=torch.uint8, seed=seed, obs_capacity=obs_capacity,
                       frame_stack=True)
    ref = ReferenceBuffer(capacity, (S, 3, 3), seed=seed, obs_dtype=torch.uint8)
    windows = (NStepWindow(0.9, n), NStepWindow(0.9, n))
    for i in range(k):
        tt = TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})
        new.push_steps(**windows[0].steps(tt))
        ref.push(**windows[1](tt))
        _check_same_samples(new, ref)
        if plain:
            extra = window_transitions({key: v[:, i * T:(i + 1) * T] for key, v in data.items()}, 0.9, 1)
            new.push(**extra)
            ref.push(**extra)
            _check_same_samples(new, ref)


def test_a_stack_that_goes_on_writes_one_frame_per_step():
    B, T, k, S = 3, 8, 4, 4
    data = _stacked_streams(B, k * T, S, 0.0, 0, "zeros")
    data["_observation/done"][:, 9] = True  # one episode end per env, its next stack zeros and one frame
    data = _stacked_streams_after_reset(data, 9)
    buf = ReplayBuffer(B * k * T, (S, 3, 3), "cpu", obs_dtype=torch.uint8, frame_stack=True)
    window = NStepWindow(0.9, 1)
    for i in range(k):
        buf.push_steps(**window.steps(TemporalDictTensor({key: v[:, i * T:(i + 1) * T] for key, v in data.items()})))
    # every env: a first stack (S frames), one frame a step and a terminal one, a fresh stack after its episode end
    assert buf.store.n_frames == B * (S + k * T + 1 + (S - 1))


def _stacked_streams_after_reset(data: dict[str, torch.Tensor], t: int) -> dict[str, torch.Tensor]:
    """``data`` with the stacks after step ``t`` rebuilt as ale-py stacks them at a reset (zeros before the first
    frame), the frames that follow shifted in."""
    obs, nxt = data["observation/frame"], data["_observation/frame"]
    stack = torch.zeros_like(obs[:, t + 1])
    stack[:, -1] = obs[:, t + 1, -1]
    for u in range(t + 1, obs.shape[1]):
        obs[:, u] = stack
        nxt[:, u] = torch.cat([stack[:, 1:], nxt[:, u, -1:]], 1)
        stack = nxt[:, u]
    return data


def test_atari_frames_stored_once_sample_the_observations_the_env_gave():
    """ale-py's own stacks (zeros at a reset, episodes cut by a short time limit) and its auto-reset."""
    pytest.importorskip("ale_py")
    spec = describe_env("ALE/Breakout-v5", "ale", 15)
    assert spec.obs_shape == (4, 84, 84)
    new = ReplayBuffer(60, spec.obs_shape, "cpu", obs_dtype=torch.uint8, seed=5)
    ref = ReferenceBuffer(60, spec.obs_shape, seed=5, obs_dtype=torch.uint8)
    assert isinstance(new.store, StackedFrames)
    windows = (NStepWindow(0.9, 3), NStepWindow(0.9, 3))
    env = create_env("ALE/Breakout-v5", n_envs=2, backend="ale", autoreset=True, max_episode_steps=15, seed=0)
    obs, _ = env.reset()
    ends = 0
    for _ in range(10):
        steps = {k: [] for k in ("observation/frame", "action/action", "_observation/reward", "_observation/done",
                                 "_observation/terminated", "_observation/frame")}
        for _ in range(4):
            action = torch.randint(0, 4, (2,))
            steps["observation/frame"].append(obs["frame"])
            steps["action/action"].append(action)
            (after, _), (running, _) = env.step(DictTensor({"action": action}))
            steps["_observation/reward"].append(after["reward"])
            steps["_observation/done"].append(after["done"])
            steps["_observation/terminated"].append(after["terminated"])
            steps["_observation/frame"].append(after["frame"])
            obs = running
        tt = TemporalDictTensor({k: torch.stack(v, 1) for k, v in steps.items()})
        ends += int(tt["_observation/done"].sum())
        new.push_steps(**windows[0].steps(tt))
        ref.push(**windows[1](tt))
        _check_same_samples(new, ref)
    env.close()
    assert ends >= 2 and new.store.n_frames < 2 * 2 * 40


# --------------------------------------------------------------------------- storage, and what a buffer needs
def test_disk_storage_maps_files_that_close_removes(tmp_path):
    spec = EnvSpec((4, 84, 84), "uint8", 4, 1000)
    buf = ReplayBuffer.for_spec(spec, 64, "cpu", storage="disk", folder=tmp_path / "replay")
    files = sorted(p.name for p in (tmp_path / "replay").iterdir())
    assert files == ["frame-numbers-0.bin", "frames-1.bin", "owner.json"]
    assert buf.store.frames.untyped_storage().filename == str(tmp_path / "replay" / "frames-1.bin")
    data = _stacked_streams(2, 40, 4, 0.1, 0, "zeros")
    data = {k: v.repeat_interleave(28, -1).repeat_interleave(28, -2) if k.endswith("frame") else v
            for k, v in data.items()}  # 3x3 frames made 84x84
    memory = ReplayBuffer.for_spec(spec, 64, "cpu")
    windows = (NStepWindow(0.9, 3), NStepWindow(0.9, 3))
    for i in range(4):
        tt = TemporalDictTensor({key: v[:, i * 10:(i + 1) * 10] for key, v in data.items()})
        buf.push_steps(**windows[0].steps(tt))
        memory.push_steps(**windows[1].steps(tt))
        a, b = buf.sample(16), memory.sample(16)
        assert all(torch.equal(a[k], b[k]) for k in a)
    buf.close()
    buf.close()
    assert not any((tmp_path / "replay").iterdir())
    with pytest.raises(ValueError, match="storage must be one of"):
        ReplayBuffer(4, 3, "cpu", storage="tape")


def test_a_buffer_that_cannot_fit_is_refused_in_one_line_before_any_allocation(tmp_path):
    from rlstruct.algos.dqn import DQNConfig, train
    from rlstruct.errors import ConfigError

    config = DQNConfig(env="CartPole-v1", buffer_size=10**13, logdir=str(tmp_path), progress=False,
                       tensorboard=False)
    with pytest.raises(ConfigError, match=r"^--buffer-size 10000000000000 needs [0-9.]+ GB for the replay buffer "
                                          r"\(\d+ bytes per transition x 10000000000000 transitions\), this machine "
                                          r"has [0-9.]+ GB available; pass a smaller --buffer-size \(at most \d+ "
                                          r"fits\) or --replay-storage disk$"):
        train(config)
