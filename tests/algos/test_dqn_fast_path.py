"""DQN on the GPU fast path, on what a CPU can check.

A whole run with every fast-path flag (the captured acquisition and evaluation, the compiled update in graph mode, the
learner's weights shared with the training batcher, the replay buffer's pairs) is driven on the CPU through
:mod:`rlstruct._accel`'s seam and the recording fake of ``tests/fakes_accel.py``: it logs what the eager run logs, row
for row; the learner's work of an iteration (the transitions, the push, the gradient steps, the training episodes'
statistics) reads nothing on the host (:class:`~tests.fakes_accel.HostReads`), and the captured acquisition waits for
the device only while epsilon changes. Then the flags' checks, and the compiled update against the eager one
(``aot_eager``: dynamo and AOTAutograd without a C++ compiler). The ``cuda`` tests train on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlstruct import _accel
from rlstruct.algos import describe_env, dqn, replay
from rlstruct.algos._train import family
from rlstruct.algos._train.session import validate
from rlstruct.algos._train.update import UpdateStep
from rlstruct.algos.dqn import DQNConfig, DQNLearner
from rlstruct.batchers import RL_Batcher
from rlstruct.errors import ConfigError
from tests.fakes_accel import HostReads, RecordingAccelerator
from tests.helpers import bare_run

SPEC = describe_env("CartPole-v1", "torch", None)
CUDA = pytest.mark.cuda
N_ENVS, STEPS, ITERATIONS, EVAL_EVERY, DECAY = 4, 8, 16, 5, 256
#: 16 iterations of 4 envs x 8 steps, learning from the second (3 gradient steps each, a hard target copy every 4),
#: epsilon decaying over the first 8; an evaluation every 5 of 3 episodes of at most 24 steps, 8 an acquisition
#: (so that the evaluation batcher's graph replays too)
SETTINGS = dict(n_envs=N_ENVS, rollout_steps=STEPS, hidden_sizes=(16,), max_env_steps=N_ENVS * STEPS * ITERATIONS,
                eval_every=EVAL_EVERY, n_evaluation_envs=3, evaluation_max_steps=24, evaluation_chunk_steps=8,
                learning_starts=N_ENVS * STEPS * 2, batch_size=16, gradient_steps=3, epsilon_decay_steps=DECAY,
                target_update_interval=4, log_every=4)
GRADIENT_STEPS = 3 * (ITERATIONS - 1)


def _rows(history: list[dict]) -> list[str]:
    """progress.csv's rows, every column but the clock's (repr: nan equals nan)."""
    return [repr({k: v for k, v in r.items() if k not in ("wall_time_s", "eval/blocked_s")}) for r in history]


def _recorded(fn, label: str, reads: list):
    """``fn`` run under :class:`HostReads`, its reads added to ``reads`` with ``label``."""
    def run(*args, **kwargs):
        with HostReads() as seen:
            out = fn(*args, **kwargs)
        reads.extend((label, *r) for r in seen.reads)
        return out

    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The eager run (CPU copies of the weights, no capture, no compilation) and the fast one under the fake, with
    what the fast one's learner read on the host, the fake's syncs at each iteration's start, and the weights sent to
    each batcher (by its number of envs)."""
    tmp = tmp_path_factory.mktemp("dqn-fast-path")
    sent: dict[str, list[int]] = {"eager": [], "fast": []}
    reads, starts = [], []
    fake = RecordingAccelerator()
    with pytest.MonkeyPatch.context() as mp:
        update = RL_Batcher.update
        mode = "eager"

        def counted_update(self, weights):
            sent[mode].append(self.n_elems())
            return update(self, weights)

        mp.setattr(RL_Batcher, "update", counted_update)
        eager = dqn.train(DQNConfig(**bare_run(tmp / "eager", share_weights=False, **SETTINGS)))
        mode = "fast"
        agent_info = DQNLearner.agent_info

        def iteration_start(self, env_steps):
            starts.append(fake.syncs)
            return agent_info(self, env_steps)

        mp.setattr(DQNLearner, "agent_info", _recorded(iteration_start, "agent_info", reads))
        for cls, name in ((DQNLearner, "transitions"), (DQNLearner, "gradient_step"),
                          (replay.ReplayBuffer, "push_steps"), (family.TrainingEpisodes, "add")):
            mp.setattr(cls, name, _recorded(getattr(cls, name), name, reads))
        with _accel.installed("cpu", fake):
            fast = dqn.train(DQNConfig(**bare_run(tmp / "fast", cuda_graph=True, compile_update=True, **SETTINGS)))
    return {"eager": eager, "fast": fast, "fake": fake, "reads": reads, "starts": starts, "sent": sent}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fast_path_logs_what_the_eager_path_logs(runs):
    """Two runs of one seed in a fresh fixture: about 10 CPU s, the fake's replays recording every op."""
    assert len(runs["eager"].history) > ITERATIONS
    assert _rows(runs["eager"].history) == _rows(runs["fast"].history)
    evals = [r for r in runs["fast"].history if "eval/return" in r]
    assert len(evals) >= ITERATIONS // EVAL_EVERY and all(math.isfinite(r["eval/return"]) for r in evals)


@pytest.mark.slow
def test_the_fast_path_captures_both_batchers_compiles_the_update_and_shares_the_weights(runs):
    fake = runs["fake"]
    # The evaluation batcher's graph (the first evaluation, launched before training, captures first) and the
    # training batcher's (its first acquisition eager, every other one a replay), each with a matrix workspace of its
    # own, released with its batcher.
    evaluation, train = fake.graphs
    assert train.replays == ITERATIONS - 1 and evaluation.replays > 2
    assert all(g.released and g.workspaces and all(ws.owner is g for ws in g.workspaces) for g in fake.graphs)
    # The update compiled once in graph mode, every gradient step a new step of its graphs.
    assert fake.compiles == [("reduce-overhead", "inductor")] and fake.step_marks == GRADIENT_STEPS
    # The training batcher (4 envs) never got a CPU copy of the weights on the fast path: its agent reads the
    # learner's; the eager run sent one after every iteration that learned. Evaluations (3 envs) take copies in both.
    assert runs["sent"]["fast"].count(N_ENVS) == 0
    assert runs["sent"]["eager"].count(N_ENVS) == 1 + ITERATIONS - 1
    assert runs["sent"]["fast"].count(3) == runs["sent"]["eager"].count(3) > 0


@pytest.mark.slow
def test_an_iteration_of_the_fast_path_waits_for_the_device_only_where_epsilon_changes(runs):
    """On a GPU, the learner's work of an iteration queues without waiting; the captured acquisition waits (to reload
    the pinned agent_info it reads) at each change of epsilon, and an evaluation where one is launched; after the
    decay an iteration without an evaluation waits for nothing (but the record's conversion, every log_every
    iterations, which the run's own tests count)."""
    assert runs["reads"] == []
    starts = runs["starts"]
    assert len(starts) == ITERATIONS
    waits = {k: after - before for k, (before, after) in enumerate(zip(starts, starts[1:]), 1)}
    decayed = DECAY // (N_ENVS * STEPS) + 1  # the first iteration that acts with epsilon_end
    for k, n in waits.items():
        evaluated = k % EVAL_EVERY == 0
        if k > decayed:
            assert n == evaluated, (k, waits)
        else:
            assert n <= 1 + evaluated, (k, waits)


@pytest.mark.parametrize("settings, match", [
    ({"cuda_graph": True}, "DQN: cuda_graph=True needs a CUDA batcher_device, got batcher_device='cpu'"),
    ({"compile_update": True, "check_devices": True},
     "DQN: compile_update=True does not support check_devices=True"),
])
def test_fast_path_flags_that_cannot_work_are_config_errors_for_dqn(settings, match):
    with pytest.raises(ConfigError, match=match):
        validate(dqn.ALGORITHM, DQNConfig(**settings))


def test_the_command_line_offers_the_fast_path_to_dqn_and_not_to_sac(capsys):
    from rlstruct.algos._train.cli import main

    for algo, has in (("dqn", True), ("sac", False)):
        with pytest.raises(SystemExit):
            main(["train", algo, "--help"])
        out = capsys.readouterr().out
        for flag in ("--cuda-graph", "--compile-update", "--share-weights"):
            assert (flag in out) == has, (algo, flag)


def _filled_buffer(prioritized: bool) -> replay.ReplayBuffer:
    g = torch.Generator().manual_seed(3)
    cls = replay.PrioritizedReplayBuffer if prioritized else replay.ReplayBuffer
    buf = cls(256, 4, "cpu", seed=1)
    n = 200
    buf.push(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g), torch.rand(n, generator=g),
             torch.randn(n, 4, generator=g), torch.where(torch.rand(n, generator=g) < 0.2, 0.0, 0.99))
    return buf


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("double, prioritized", [(True, False), (False, True)])
def test_the_compiled_gradient_step_moves_the_weights_where_the_eager_one_does_aot_eager(double, prioritized):
    """Dynamo and AOTAutograd over DQN's forwards and loss (a hard target copy every 2 steps; prioritized replay's
    weights and TD errors out of the compiled function): the same statistics, priorities and weights within float
    rounding. Slow: a compilation each."""
    config = DQNConfig(hidden_sizes=(32,), batch_size=32, target_update_interval=2, double=double,
                       prioritized_replay=prioritized)
    eager, compiled = (DQNLearner(config, SPEC, None, device=torch.device("cpu"), seed=0, n_rows=1) for _ in range(2))
    step = compiled.update
    compiled.update = UpdateStep(step.loss_fn, step.optimizer, step.groups, max_grad_norm=step.max_grad_norm,
                                 device="cpu", compile=True, backend="aot_eager")
    buffers = _filled_buffer(prioritized), _filled_buffer(prioritized)
    for _ in range(5):
        a, b = eager.gradient_step(buffers[0]), compiled.gradient_step(buffers[1])
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)
    for mine, theirs in ((eager.policy, compiled.policy), (eager.target, compiled.target)):
        for p, q in zip(mine.parameters(), theirs.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    if prioritized:
        torch.testing.assert_close(buffers[1].tree.sum, buffers[0].tree.sum, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------- CUDA
@CUDA
@pytest.mark.timeout(600)
@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
def test_cuda_dqn_fast_path_trains(tmp_path, autocast):
    """Every fast-path flag on the GPU: the captured acquisitions and evaluations, the compiled update (CUDA graphs),
    the shared weights and the buffer's pairs; the losses finite, the greedy policy's returns recorded."""
    cuda = dict(learner_device="cuda", batcher_device="cuda", evaluation_device="cuda")
    settings = {**SETTINGS, "n_envs": 64, "max_env_steps": 64 * STEPS * 40, "learning_starts": 1024}
    result = dqn.train(DQNConfig(**bare_run(tmp_path, cuda_graph=True, compile_update=True, autocast=autocast,
                                            **cuda, **settings)))
    losses = [r["loss/q"] for r in result.history if "loss/q" in r]
    assert losses and all(math.isfinite(x) for x in losses)
    assert [r for r in result.history if "eval/return" in r]


@CUDA
@pytest.mark.timeout(600)
def test_cuda_dqn_fast_path_logs_what_the_eager_cuda_run_logs_but_for_the_compiled_rounding(tmp_path):
    """On one GPU, the captured acquisitions and evaluations and the shared weights change no bit of what the eager
    run on that GPU logs up to the first gradient step; the compiled update's kernels round otherwise, so the first
    loss (one gradient step an iteration: the loss of the first batch, before any update) agrees within float
    rounding, and the runs drift apart after it."""
    cuda = dict(learner_device="cuda", batcher_device="cuda", evaluation_device="cuda")
    settings = {**SETTINGS, "gradient_steps": 1}
    eager = dqn.train(DQNConfig(**bare_run(tmp_path / "eager", share_weights=False, **cuda, **settings)))
    fast = dqn.train(DQNConfig(**bare_run(tmp_path / "fast", cuda_graph=True, compile_update=True, **cuda,
                                          **settings)))
    first = [next(r for r in run.history if "loss/q" in r) for run in (eager, fast)]
    assert first[0]["iteration"] == first[1]["iteration"]
    assert first[1]["loss/q"] == pytest.approx(first[0]["loss/q"], rel=1e-4, abs=1e-6)
    before = [_rows([r for r in run.history if r["iteration"] < first[0]["iteration"]]) for run in (eager, fast)]
    assert before[0] and before[0] == before[1]
