"""Whole training runs on the GPU fast path (captured acquisition and evaluation, overlap where the algorithm has it,
the compiled update in graph mode), driven on the CPU through :mod:`rlstruct._accel`'s seam and the recording fake of
``tests/fakes_accel.py``, whose graphs check at every replay that each tensor their capture touched is still alive
at its address and writes a matrix workspace of its own: two runs in one process, the sequence after which a GPU
replay once touched freed memory."""

from __future__ import annotations

import pytest

from rlstruct import _accel
from rlstruct.algos import dqn, pqn
from tests.fakes_accel import RecordingAccelerator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # two training runs a test: 4-5 s


def fast_config(cls, tmp_path, name: str, **kw):
    """Every fast-path flag, on the CPU (the fake stands for the GPU), at a tiny budget: 8 iterations, the
    training batcher captured at the first; one acquisition per evaluation (every 3 iterations), so that the
    evaluation batcher is captured at the second evaluation, after the compiled update's first calls (as in a
    throughput run, whose few evaluation envs end their episodes within one chunk)."""
    return cls(**{"progress": False, "tensorboard": False, "logdir": str(tmp_path / name), "time_limit": 300.0,
                  "stop_at_reward_threshold": False, "preset": "none", "n_envs": 8, "n_steps": 4, "hidden_sizes": (16,),
                  "max_env_steps": 8 * 4 * 8, "eval_every": 3, "n_evaluation_envs": 4, "evaluation_max_steps": 4,
                  "evaluation_chunk_steps": 4, "learner_device": "cpu", "batcher_device": "cpu",
                  "evaluation_device": "cpu", "cuda_graph": True, "compile_update": True, "overlap": True, **kw})


@pytest.mark.parametrize("module, cls", [(pqn, pqn.PQNConfig)], ids=["pqn"])
def test_two_captured_runs_in_one_process_replay_only_live_tensors(tmp_path, module, cls):
    """A2C's and PPO's two captured runs in one process are ``test_deterministic.py``'s fast-path runs (the same
    config, deterministic mode on), which make these checks too."""
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        for run in ("first", "second"):
            result = module.train(fast_config(cls, tmp_path, run))
            assert result.history, run
    # Per run, the training batcher's graph and the evaluation batcher's, each replayed more than once (every
    # replay after the first checked), each with a matrix workspace of its own, released at the end of its run; the
    # update compiled in graph mode, one step mark per update.
    assert len(fake.graphs) == 4
    assert all(g.replays > 2 for g in fake.graphs), [g.replays for g in fake.graphs]
    assert all(g.released and g.workspaces and all(ws.owner is g for ws in g.workspaces) for g in fake.graphs)
    assert fake.compiles == [("reduce-overhead", "inductor")] * 2 and fake.step_marks > 0


def test_two_captured_dqn_runs_in_one_process_replay_only_live_tensors(tmp_path):
    """DQN's fast path (no overlap: its acquisitions and gradient steps alternate): 6 iterations of 4 envs x 8 steps,
    learning from the first with two gradient steps each, the training batcher captured at the second acquisition
    and the evaluation batcher (one evaluation every 3 iterations, of two acquisitions) at the first evaluation's
    second; each graph is then replayed 5 to 7 times, every replay checking the tensors it touches (each check scans
    the process's objects, so the iterations are what this test costs)."""
    fake = RecordingAccelerator()
    settings = {"progress": False, "tensorboard": False, "time_limit": 300.0, "stop_at_reward_threshold": False,
                "preset": "none", "n_envs": 4, "rollout_steps": 8, "hidden_sizes": (16,), "max_env_steps": 4 * 8 * 6,
                "learning_starts": 32, "batch_size": 16, "gradient_steps": 2, "eval_every": 3,
                "n_evaluation_envs": 4, "evaluation_max_steps": 8, "evaluation_chunk_steps": 4,
                "learner_device": "cpu", "batcher_device": "cpu", "evaluation_device": "cpu", "cuda_graph": True,
                "compile_update": True}
    with _accel.installed("cpu", fake):
        for run in ("first", "second"):
            result = dqn.train(dqn.DQNConfig(logdir=str(tmp_path / run), **settings))
            assert result.history, run
    assert len(fake.graphs) == 4
    assert all(g.replays > 2 for g in fake.graphs), [g.replays for g in fake.graphs]
    assert all(g.released and g.workspaces and all(ws.owner is g for ws in g.workspaces) for g in fake.graphs)
    assert fake.compiles == [("reduce-overhead", "inductor")] * 2 and fake.step_marks == 2 * 2 * 6
