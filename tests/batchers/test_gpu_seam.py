"""The GPU logic on the CPU, through :mod:`rlstruct._accel`'s seam and the recording fake of ``tests/fakes_accel.py``:
the pipeline's stream and event ordering, the captured acquisition's replay, the compiled update's graph outputs.
The same code runs on CUDA in ``test_cuda_graph.py``, ``test_fast_path.py`` and ``test_device_placement.py``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlstruct import DictTensor, _accel
from rlstruct.algos._train.update import UpdateStep, clip_groups, reads
from rlstruct.batchers import Pipeline, RL_Batcher, WeightSync
from rlstruct.batchers import _graph as graph_module
from rlstruct.envs import make_env
from tests.fakes import SamplingAgent
from tests.fakes_accel import HostReads, RecordingAccelerator
from tests.helpers import acquire_around_changes, assert_same

pytestmark = pytest.mark.timeout(120)

N, T = 8, 6


def cartpole(n_envs: int, seed: int):
    return make_env("CartPole-v1", n_envs, device="cpu", seed=seed, autoreset=True)


def temperature(value: float) -> DictTensor:
    return DictTensor({"temperature": torch.full((N,), value)})


def test_the_accelerator_is_chosen_by_device_type_and_a_fake_is_installed_for_a_while():
    assert _accel.accelerator_for("cpu") is None
    assert _accel.accelerator_for(torch.device("cuda", 1)) is _accel.CUDA
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        assert _accel.accelerator_for("cpu") is fake
        with _accel.installed("cpu", None):
            assert _accel.accelerator_for("cpu") is None
        assert _accel.accelerator_for("cpu") is fake
    assert _accel.accelerator_for("cpu") is None


def test_torch_checks_a_graphs_inputs_where_the_environment_asks(monkeypatch, caplog):
    monkeypatch.delenv(_accel.CHECK_GRAPH_INPUTS_ENV, raising=False)
    assert _accel.capture_options() == {}
    monkeypatch.setenv(_accel.CHECK_GRAPH_INPUTS_ENV, "0")
    assert _accel.capture_options() == {}
    monkeypatch.setenv(_accel.CHECK_GRAPH_INPUTS_ENV, "1")

    class Newer:
        def __init__(self, cuda_graph, pool=None, stream=None, check_input_liveness=False):
            pass

    class Older:
        def __init__(self, cuda_graph, pool=None, stream=None):
            pass

    monkeypatch.setattr(torch.cuda, "graph", Newer)
    assert _accel.capture_options() == {"check_input_liveness": True}
    monkeypatch.setattr(torch.cuda, "graph", Older)
    assert _accel.capture_options() == {}
    assert "cannot check a CUDA graph's inputs (torch 2.13 can)" in caplog.text


def test_a_failed_cuda_capture_gives_the_thread_its_stream_back(monkeypatch):
    """torch.cuda.graph's exit raises on a failed capture before it restores the stream it made current."""
    current = ["learner"]

    class FailingCapture:
        def __init__(self, cuda_graph, **kwargs):
            pass

        def __enter__(self):
            current[0] = "capture stream"

        def __exit__(self, *exc):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", FailingCapture)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: current.__setitem__(0, stream))
    with pytest.raises(RuntimeError, match="operation not permitted"):
        _accel.CUDA.capture(object(), lambda: None)
    assert current == ["learner"]


def test_cuda_clears_the_cublas_workspaces_as_the_graph_trees_do(monkeypatch):
    calls = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append(1), raising=False)
    _accel.CUDA.clear_blas_workspaces()
    assert calls == [1]


def test_with_the_fake_the_cpu_takes_the_accelerators_paths_with_the_same_draws():
    """What a CUDA graph captures, the fake replays: the torch simulators' torch kernels and the counter-based draws
    counted on a tensor, with the CPU's own paths' results (the fake's trajectories are compared with eager ones)."""
    from rlstruct.algos._noise import CounterNoise

    host_env, host_noise = cartpole(N, 3), CounterNoise(7, 2, torch.device("cpu"))
    with _accel.installed("cpu", RecordingAccelerator()):
        env, noise = cartpole(N, 3), CounterNoise(7, 2, torch.device("cpu"))
    assert host_env.kernel != "torch" and env.kernel == "torch"
    assert isinstance(noise.get_state(), torch.Tensor) and noise._step.dim() == 0
    host_obs, obs = host_env.reset()[0], env.reset()[0]
    for t in range(20):
        assert torch.equal(host_noise.uniform((N, 2)), noise.uniform((N, 2))), t
        action = DictTensor({"action": (noise.uniform((N, 2))[:, 0] < 0.5).long()})
        host_noise.advance()
        noise.advance()
        (host_obs, _), _ = host_env.step(action)
        (obs, _), _ = env.step(action)
        assert all(torch.equal(host_obs[k], obs[k]) for k in host_obs.keys()), t


# --------------------------------------------------------------------------- the captured acquisition


def run_schedule(cuda_graph: bool) -> list:
    """Acquisitions around every change a captured loop must see: new weights, a reset, new agent_info."""
    torch.manual_seed(0)
    with RL_Batcher(T, SamplingAgent, {}, cartpole, {"n_envs": N}, 0, [5], agent_info=temperature(1.0),
                    cuda_graph=cuda_graph) as b:
        return acquire_around_changes(
            b, lambda: {k: v + 0.25 for k, v in SamplingAgent().model.state_dict().items()}, temperature
        )


@pytest.mark.slow  # 1.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(60)
def test_replaying_the_captured_acquisition_gives_the_eager_trajectories():
    eager = run_schedule(cuda_graph=False)
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        captured = run_schedule(cuda_graph=True)
    assert len(captured) == len(eager) == 10
    for a, b in zip(eager, captured):
        assert_same(a, b)
    # One graph, captured once; the first acquisition ran eagerly (the warm-up), the nine others are replays.
    (graph,) = fake.graphs
    assert graph.replays == 9
    # The warm-up ran on a side stream ordered after the learner's work, and the learner after it.
    assert ("side1", "learner") in fake.waits and ("learner", "side1") in fake.waits
    # The host waits only where the pinned agent_info changes under the graph (the reset's and execute's).
    assert fake.syncs == 2


@pytest.mark.slow  # 1.7 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(60)
def test_a_replay_that_does_not_load_the_statics_is_caught(monkeypatch):
    """The comparison above can fail: replays that skip loading the agent state into the statics diverge."""
    eager = run_schedule(cuda_graph=False)
    monkeypatch.setattr(graph_module, "load_into", lambda static, d, what: None)
    with _accel.installed("cpu", RecordingAccelerator()):
        captured = run_schedule(cuda_graph=True)
    with pytest.raises(AssertionError):
        for a, b in zip(eager, captured):
            assert_same(a, b)


# --------------------------------------------------------------------------- the pipeline's ordering


class Recorded:
    """A pipeline over a CPU batcher whose calls are recorded as operations on the fake's current stream."""

    def __init__(self, fake: RecordingAccelerator, b: RL_Batcher, sync: WeightSync):
        self.fake = fake
        self.n_acquire = self.n_get = self.n_push = 0
        execute, get, push = b.execute, b.get, sync.push

        def recorded_execute(*args, **kwargs):
            fake.op(f"acquire {self.n_acquire}")  # writes batch n into the buffer
            self.n_acquire += 1
            return execute(*args, **kwargs)

        def recorded_get():
            fake.op(f"get {self.n_get}")  # reads (copies out of, or views) the buffer of batch n
            self.n_get += 1
            return get()

        def recorded_push():
            fake.op(f"push {self.n_push}")  # reads the learner's weights
            self.n_push += 1
            return push()

        b.execute, b.get, sync.push = recorded_execute, recorded_get, recorded_push


def run_pipeline(*, overlap: bool, zero_copy: bool, fake: RecordingAccelerator | None, n: int = 5):
    """``n`` iterations of next / learn / updated; the learner's update ``k`` is recorded as ``learn k`` (it reads
    batch ``k`` and writes the weights). Returns the batches and, with ``fake``, the recorder."""
    torch.manual_seed(0)
    model = SamplingAgent().model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out, rec = [], None
    with RL_Batcher(T, SamplingAgent, {}, cartpole, {"n_envs": N}, 0, [5], agent_info=temperature(1.0),
                    zero_copy=zero_copy) as b:
        sync = WeightSync(b, model, "cpu", mode="copy")
        pipe = Pipeline(b, sync, overlap=overlap)
        if fake is not None:
            rec = Recorded(fake, b, sync)
        pipe.start()
        for k in range(n):
            traj = pipe.next()
            out.append(traj.trajectories["action/logits"].clone())
            if fake is not None:
                fake.op(f"learn {k}")
            loss = model(traj.trajectories["observation/frame"]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            pipe.updated()
        pipe.close()
    return out, rec


@pytest.mark.parametrize("zero_copy", [True, False], ids=["double-buffer", "copy-out"])
def test_overlapped_acquisitions_are_ordered_by_events_not_by_the_host(zero_copy):
    plain, _ = run_pipeline(overlap=True, zero_copy=zero_copy, fake=None)
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        seen, rec = run_pipeline(overlap=True, zero_copy=zero_copy, fake=fake)
    for a, b in zip(plain, seen):
        assert torch.equal(a, b)  # the seam does not change what is computed
    op = fake.find
    n = 5
    assert fake.syncs == 0
    # Push 0 is start()'s; acquisition j >= 1 pushes first (push j), on its own stream. Acquisition k + 2, the
    # first launched after update k (with overlap the data is one update stale), reads update k's weights: its
    # push is ordered after the update on the device ...
    for k in range(n - 1):
        push = op(f"push {k + 2}")
        assert push.stream != "learner"
        assert op(f"learn {k}").before(push), f"push {k + 2} may read the weights before update {k} wrote them"
        assert push.before(op(f"acquire {k + 2}"))
    # ... and update k does not write the weights before the push launched just before it has read them.
    for k in range(n):
        assert op(f"push {k + 1}").before(op(f"learn {k}"))
    # The learner reads batch k (get, then the update) only after the acquisition wrote it ...
    for k in range(n):
        assert op(f"acquire {k}").before(op(f"get {k}"))
        assert op(f"acquire {k}").before(op(f"learn {k}"))
    # ... and no acquisition writes a buffer the learner may still be reading: with two buffers acquisition
    # k + 2 reuses batch k's, with one buffer acquisition k + 1 overwrites what get k copied out.
    reuse = 2 if zero_copy else 1
    for k in range(n + 1 - reuse):
        last_read = op(f"learn {k}") if zero_copy else op(f"get {k}")
        assert last_read.before(op(f"acquire {k + reuse}"))
    # The overlap is real: acquisition k + 1 and update k are not ordered either way.
    for k in range(n - 1):
        a, u = op(f"acquire {k + 1}"), op(f"learn {k}")
        assert not a.before(u) and not u.before(a)
    assert rec.n_acquire == n + 1 and rec.n_get == n + 1  # close() collected the last one


def test_a_sequential_pipeline_uses_no_stream():
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        _, rec = run_pipeline(overlap=False, zero_copy=False, fake=fake, n=3)
    assert fake.streams == [fake.default] and fake.waits == [] and fake.syncs == 0
    # Sequential: acquisition k + 1 runs after update k's weights were pushed.
    for k in range(2):
        assert fake.find(f"learn {k}").before(fake.find(f"push {k + 1}"))
        assert fake.find(f"push {k + 1}").before(fake.find(f"acquire {k + 1}"))


# --------------------------------------------------------------------------- the compiled update


def make_update(compile: bool):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    @reads("x")
    def loss_fn(batch):
        y = model(batch["x"])
        loss = y.pow(2).mean()
        return loss, {"loss": loss.detach(), "mean": y.mean().detach()}

    return model, UpdateStep(loss_fn, opt, clip_groups(model), max_grad_norm=0.5, device="cpu", compile=compile)


def test_the_compiled_update_in_graph_mode_marks_each_step_and_keeps_its_statistics():
    fake = RecordingAccelerator()
    x = torch.randn(3, 16, 3, generator=torch.Generator().manual_seed(1))
    model_e, eager = make_update(compile=False)
    with _accel.installed("cpu", fake):
        model_g, graphed = make_update(compile=True)
    assert fake.compiles == [("reduce-overhead", "inductor")]
    first = graphed({"x": x[0]})
    first_values = {k: v.clone() for k, v in first.items()}
    stats_e = [eager({"x": x[i]}) for i in (0, 1, 2)]
    stats_g = [first] + [graphed({"x": x[i]}) for i in (1, 2)]
    assert fake.step_marks == 3
    assert fake.blas_clears == 2  # the trees' warm-up and recording clear torch's cache of cuBLAS workspaces
    # The statistics were cloned out of the graphs' memory: the later replays did not overwrite them.
    assert all(torch.equal(first[k], first_values[k]) for k in first)
    for se, sg in zip(stats_e, stats_g):
        assert sorted(se) == sorted(sg) and all(torch.equal(se[k], sg[k]) for k in se)
    for pe, pg in zip(model_e.parameters(), model_g.parameters()):
        assert torch.equal(pe, pg)


def test_the_fake_refuses_a_graph_replay_without_a_step_mark():
    """What the test above relies on: a replay without ``mark_step_begin`` is an error, as in CUDA graph trees."""
    fake = RecordingAccelerator()
    f = fake.compile(lambda x: (x.sum(), {"s": x.sum()}), mode="reduce-overhead", dynamic=None, backend="inductor")
    fake.mark_step_begin()
    f(torch.ones(2))
    with pytest.raises(AssertionError, match="mark_step_begin"):
        f(torch.ones(2))


def test_the_uncompiled_and_cpu_updates_do_not_touch_the_accelerator():
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        make_update(compile=False)[1]({"x": torch.ones(4, 3)})
    assert fake.compiles == [] and fake.step_marks == 0


# --------------------------------------------------------------------------- the fake's lifetime checks


def test_the_fake_catches_a_replay_through_a_tensor_freed_since_its_capture():
    """A step that rebinds its counter (``self.t = self.t + 1``) works eagerly, but a CUDA graph keeps reading the
    tensor it captured, freed once rebound: the fake's next replay names the op that captured it."""
    fake = RecordingAccelerator()

    class Counter:
        def __init__(self):
            self.t = torch.zeros(())

    counter, out = Counter(), torch.zeros(())

    def step():
        out.copy_(counter.t * 2)
        counter.t = counter.t + 1

    graph = fake.new_graph()
    fake.capture(graph, step)
    graph.replay()  # stands for the capture
    with pytest.raises(AssertionError, match=r"replay 2: the capture's aten\.mul\.Tensor at .*test_gpu_seam\.py:\d+ "
                                             r"\(step\) touched a float32 \[\] tensor that has been freed since"):
        graph.replay()


def test_the_fake_catches_a_replay_that_touches_a_tensor_its_capture_did_not():
    """Rebound while the old tensor lives on (a reference elsewhere): the CPU replay would follow the new tensor,
    a CUDA graph the old one."""
    fake = RecordingAccelerator()
    source, out = {"x": torch.ones(3)}, torch.zeros(3)
    graph = fake.new_graph()
    fake.capture(graph, lambda: out.copy_(source["x"] * 2))
    graph.replay()
    old = source["x"]
    source["x"] = torch.full((3,), 5.0)
    with pytest.raises(AssertionError, match=r"aten\.mul\.Tensor at .* touches a float32 \[3\] tensor that the "
                                             r"capture did not"):
        graph.replay()
    assert old.tolist() == [1.0, 1.0, 1.0]


def test_the_fake_catches_a_captured_storage_that_moved():
    fake = RecordingAccelerator()
    x, out = torch.ones(3), torch.zeros(3)
    graph = fake.new_graph()
    fake.capture(graph, lambda: out.copy_(x[:3] + 1))
    graph.replay()
    x.resize_(1 << 16)  # a new allocation behind the same storage
    with pytest.raises(AssertionError, match=r"storage has moved since \(0x[0-9a-f]+ -> 0x[0-9a-f]+"):
        graph.replay()


def test_the_fake_replays_in_place_updates_of_what_it_captured():
    """What the checks above ask for: new values copied into the captured tensors; tensors the step makes (in a
    CUDA graph, its private pool's) may be made anew at every replay."""
    fake = RecordingAccelerator()
    x, out = torch.ones(3), torch.zeros(3)
    graph = fake.new_graph()
    fake.capture(graph, lambda: out.copy_(torch.arange(3.0) + x))
    for k in range(3):
        x.copy_(torch.full((3,), float(k)))
        graph.replay()
        assert out.tolist() == [k, k + 1.0, k + 2.0]
    assert set(graph.touched) == {x.untyped_storage()._cdata, out.untyped_storage()._cdata}


def test_host_reads_records_what_would_wait_for_an_accelerator_and_where():
    x = torch.arange(6.0)
    with HostReads() as seen:
        x.sum().item()
        x[x > 2]
        torch.nonzero(x)
        x.tolist()
        torch.tensor([1.0], device=x.device)
        # none of these waits: a fill, a number written into a slice, a tensor kept on the host, a device computation
        torch.full((2,), 0.5, device=x.device)
        x[0::2] = -1.0
        torch.tensor([1.0])
        torch.where(x > 0, x, 0.0).cumsum(0)
    assert [what for what, _ in seen.reads] == [
        "aten._local_scalar_dense.default", "aten.index.Tensor", "aten.nonzero.default", "Tensor.tolist",
        "torch.tensor(..., device=...)"]
    assert all("test_gpu_seam.py:" in where for _, where in seen.reads)


def test_the_fake_catches_a_graph_that_bakes_in_another_graphs_matrix_workspace():
    """torch keeps one cuBLAS workspace per stream: a graph captured on the stream after another bakes in the
    workspace made in the other's memory pool, freed memory once the other is released and the cache cleared."""
    fake = RecordingAccelerator()
    w, x = torch.randn(4, 4), torch.randn(2, 4)
    out_a, out_b = torch.zeros(2, 4), torch.zeros(2, 4)
    a, b = fake.new_graph(), fake.new_graph()
    fake.capture(a, lambda: out_a.copy_(x @ w))
    a.replay()
    fake.capture(b, lambda: out_b.copy_(x @ w))
    b.replay()
    a.reset()
    fake.clear_blas_workspaces()  # what the compiled update's CUDA graph trees do at their warm-up and recording
    with pytest.raises(AssertionError, match=r"replay 2: the capture's aten\.mm\.default at .*test_gpu_seam\.py:\d+ "
                                             r"\(<lambda>\) baked in the matrix library's workspace of stream "
                                             r"'capture', made by an earlier graph's capture .* released"):
        b.replay()


def acquire_captured(b: RL_Batcher, n: int) -> None:
    for _ in range(n):
        b.execute()
        b.get()


def test_each_captured_acquisition_owns_its_matrix_workspace():
    """Two captured batchers one after the other in a process (an evaluation's, then a training run's; or two runs),
    the first closed, then the compiled update's graph trees clearing torch's cache of workspaces: the second's
    replays write a workspace of their own, never one in the first's released pool."""
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake):
        batchers = []
        for _ in range(2):
            b = RL_Batcher(T, SamplingAgent, {}, cartpole, {"n_envs": N}, 0, [5], agent_info=temperature(1.0),
                           cuda_graph=True)
            batchers.append(b)
            b.reset()
            acquire_captured(b, 3)  # the warm-up, the capture, a replay
        batchers[0].close()
        fake.clear_blas_workspaces()
        acquire_captured(batchers[1], 2)
        batchers[1].close()
    first, second = fake.graphs
    assert first.released and second.released  # close() releases the graph
    for g in (first, second):
        assert g.workspaces and all(ws.owner is g for ws in g.workspaces)
