"""``cuda_graph=True``: the whole step loop replayed as one CUDA graph gives the eager loop's trajectories, bit for
bit, across weight updates, resets and agent_info changes; what cannot be captured is refused with a typed error."""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.batchers import RL_Batcher, WorkerPlacement
from rlstruct.batchers._graph import load_env_state, load_into
from rlstruct.envs import CartPole, make_env
from rlstruct.errors import BatcherWorkerError, GraphCaptureError
from tests.fakes import CountingEnv, GeneratorAgent, GraphStateEnv, HistorySamplingAgent, SamplingAgent, SyncingAgent
from tests.helpers import acquire_around_changes, assert_same

pytestmark = pytest.mark.timeout(180)

N, T = 64, 16


def cartpole(n_envs: int, seed: int, device: str = "cpu", autoreset: bool = True):
    return make_env("CartPole-v1", n_envs, device=device, seed=seed, autoreset=autoreset)


def temperature(value: float) -> DictTensor:
    return DictTensor({"temperature": torch.full((N,), value)})


def run_schedule(cuda_graph: bool, n_processes: int = 0) -> list:
    """Acquisitions around every change a graph must see: new weights, a reset, new agent_info."""
    torch.manual_seed(0)
    with RL_Batcher(T, SamplingAgent, {"device": "cuda"}, cartpole, {"n_envs": N, "device": "cuda"}, n_processes,
                    [5], agent_info=temperature(1.0), agent_seeds=[7] if n_processes else None, device="cuda",
                    cuda_graph=cuda_graph) as b:
        out = acquire_around_changes(
            b, lambda: {k: v.cpu() + 0.25 for k, v in SamplingAgent().model.state_dict().items()}, temperature
        )
        if cuda_graph:
            assert b.timings()["graph_replay"] > 0
    return out


def replay_logits(traj, weights: dict, temp: float) -> torch.Tensor:
    """The logits :class:`SamplingAgent` computes along ``traj`` with ``weights`` and ``temperature=temp``."""
    agent = SamplingAgent("cuda")
    agent.update({k: v.cuda() for k, v in weights.items()})
    h, frames, logits = traj.info["agent_state/h"], traj.trajectories["observation/frame"], []
    with torch.no_grad():
        for t in range(frames.shape[1]):
            h = 0.9 * h + frames[:, t]
            logits.append(agent.model(h) / temp)
    return torch.stack(logits, dim=1)


@pytest.mark.cuda
@pytest.mark.parametrize("n_processes", [0, 1], ids=["in_process", "gpu_worker"])
def test_graph_replays_the_eager_loop_bit_for_bit(n_processes):
    eager, graphed = run_schedule(False, n_processes), run_schedule(True, n_processes)
    assert len(eager) == len(graphed) == 10
    for i, (a, b) in enumerate(zip(eager, graphed)):
        try:
            assert_same(a, b)
        except AssertionError as e:
            raise AssertionError(f"acquisition {i} differs: {e}") from None
    # The graph saw each change: its logits are the new weights' (acquisition 4) and temperature's (8).
    new_weights = {k: v + 0.25 for k, v in SamplingAgent().model.state_dict().items()}
    for k, weights, temp in ((4, new_weights, 1.0), (8, new_weights, 2.0)):
        expected = replay_logits(graphed[k], weights, temp)
        assert torch.allclose(graphed[k].trajectories["action/logits"], expected, atol=1e-5)
    # The agent state carries over between acquisitions and starts again from zero after the reset.
    assert eager[1].info["agent_state/h"].abs().sum() > 0
    assert torch.equal(eager[6].info["agent_state/h"], torch.zeros_like(eager[6].info["agent_state/h"]))


def run_generator_agent(cuda_graph: bool, n_processes: int) -> list:
    stochastic = DictTensor({"stochastic": torch.arange(N) % 2 == 0})
    with RL_Batcher(T, GeneratorAgent, {"device": "cuda"}, cartpole, {"n_envs": N, "device": "cuda"}, n_processes,
                    [1], agent_info=stochastic, agent_seeds=[3], device="cuda", cuda_graph=cuda_graph) as b:
        b.reset(agent_info=stochastic)  # the constructor's example only sets the keys (and reset's default row)
        out = []
        for _ in range(4):
            b.execute()
            out.append(b.get()[0])
        b.reset(agent_info=DictTensor({"stochastic": torch.ones(N, dtype=torch.bool)}))
        for _ in range(2):
            b.execute()
            out.append(b.get()[0])
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("n_processes", [0, 1], ids=["in_process", "gpu_worker"])
def test_an_agent_with_its_own_cuda_generator_replays_bit_for_bit(n_processes):
    eager, graphed = run_generator_agent(False, n_processes), run_generator_agent(True, n_processes)
    for a, b in zip(eager, graphed):
        assert_same(a, b)
    # The greedy rows took the argmax; the sampling rows did not always.
    traj = graphed[2].trajectories
    greedy = traj["action/logits"].argmax(-1)
    assert torch.equal(traj["action/action"][1::2], greedy[1::2])
    assert not torch.equal(traj["action/action"][0::2], greedy[0::2])


@pytest.mark.cuda
def test_an_agent_reading_the_history_replays_bit_for_bit():
    runs = []
    for cuda_graph in (False, True):
        torch.manual_seed(0)
        with RL_Batcher(T, HistorySamplingAgent, {"device": "cuda"}, cartpole, {"n_envs": N, "device": "cuda"}, 0,
                        [2], device="cuda", cuda_graph=cuda_graph) as b:
            b.reset()
            out = []
            for _ in range(3):  # eager, captured, replayed
                b.execute()
                out.append(b.get()[0])
            runs.append(out)
    for a, b in zip(*runs):
        assert_same(a, b)
    # At step t the history holds the t earlier steps of this acquisition.
    frames = runs[1][2].trajectories["observation/frame"]
    expected = torch.cumsum(frames.sum(-1), 1) - frames.sum(-1) + torch.arange(T, device="cuda")
    assert torch.allclose(runs[1][2].trajectories["action/past"], expected, atol=1e-4)


@pytest.mark.cuda
def test_an_agent_that_syncs_is_refused_at_capture():
    with RL_Batcher(T, SyncingAgent, {"device": "cuda"}, cartpole, {"n_envs": N, "device": "cuda"}, 1, [0],
                    device="cuda", cuda_graph=True, timeout=60) as b:
        b.reset()
        b.execute()
        b.get()  # eager
        b.execute()
        cause = r"capturing the step loop in a CUDA graph failed \(\w+: CUDA error: operation not permitted when stream"
        message = rf"(?s)GraphCaptureError: {cause}.*must not synchronize with the host"
        with pytest.raises(BatcherWorkerError, match=message):
            b.get()


@pytest.mark.cuda
def test_an_episodic_env_is_refused_with_the_fix():
    with pytest.raises(BatcherWorkerError, match=r"graph_state.*autoreset=True.*or pass cuda_graph=False"):
        RL_Batcher(T, SamplingAgent, {"device": "cuda"}, cartpole, {"n_envs": N, "device": "cuda", "autoreset": False},
                   0, [0], device="cuda", cuda_graph=True)


@pytest.mark.cuda
def test_only_autoreset_gpu_simulators_offer_graph_state():
    env = CartPole(4, device="cuda", seed=0, autoreset=True)
    env.reset()
    state = env.graph_state()
    assert state and all(isinstance(v, torch.Tensor) and v.is_cuda for v in state.values())
    statics = {k: v.clone() for k, v in state.items()}
    env.set_graph_state(statics)
    assert all(env.graph_state()[k] is v for k, v in statics.items())  # the env's own tensors, no copies
    assert CartPole(4, device="cuda", autoreset=False).graph_state() is None


def test_graph_state_is_none_for_envs_that_cannot_be_captured():
    assert CartPole(4, device="cpu", autoreset=False).graph_state() is None  # episodic: the running set shrinks
    assert CountingEnv(3, autoreset=True).graph_state() is None  # the VecEnv default


def test_cuda_graph_needs_every_worker_on_a_gpu():
    with pytest.raises(ValueError, match=r"needs every worker on a CUDA device, but worker 0 runs on cpu"):
        RL_Batcher(T, SamplingAgent, {}, cartpole, {"n_envs": 4}, 0, [0], cuda_graph=True)
    with pytest.raises(ValueError, match=r"but worker 1 runs on cpu"):
        RL_Batcher(T, SamplingAgent, {}, cartpole, {"n_envs": 4}, 2, [0, 1], device="cuda", cuda_graph=True,
                   worker_placements=[WorkerPlacement("cuda:0"), WorkerPlacement("cpu")])


def test_graph_inputs_are_loaded_in_place_and_checked():
    static = DictTensor({"h": torch.zeros(3, 2), "n": torch.zeros(3, dtype=torch.long)})
    h, n = static["h"], static["n"]
    load_into(static, DictTensor({"h": torch.ones(3, 2), "n": torch.arange(3)}), "the agent state")
    assert static["h"] is h and static["n"] is n  # the same tensors, which a captured graph reads
    assert torch.equal(h, torch.ones(3, 2)) and torch.equal(n, torch.arange(3))
    load_into(static, static, "the agent state")  # itself: nothing to do
    with pytest.raises(GraphCaptureError, match=r"the agent state must keep its keys at every step: \['h', 'n'\]"):
        load_into(static, DictTensor({"h": torch.ones(3, 2)}), "the agent state")
    bad = DictTensor({"h": torch.ones(3, 5), "n": torch.arange(3)})
    keep_shape = r"the agent state key 'h' must keep its shape.*\[3, 2\].*now .*\[3, 5\]"
    with pytest.raises(GraphCaptureError, match=keep_shape):
        load_into(static, bad, "the agent state")


def test_the_env_state_is_loaded_into_the_statics_and_handed_back():
    env = GraphStateEnv(3)
    env.reset()
    statics = {k: torch.zeros_like(v) for k, v in env.graph_state().items()}
    env.step_into(None, None, None)  # the env rebinds its state to new tensors, as a functional step does
    load_env_state(env, statics)
    assert env.graph_state()["t"] is statics["t"] and torch.equal(statics["t"], torch.ones(3, dtype=torch.long))
    env.step_into(None, None, None)
    load_env_state(env, statics)  # the env's tensors are the statics again: copied from its new ones
    assert torch.equal(statics["t"], torch.full((3,), 2)) and env.graph_state()["t"] is statics["t"]
    env.t = torch.zeros(4, dtype=torch.long)
    with pytest.raises(GraphCaptureError, match=r"the env state \(graph_state\(\)\) key 't' must keep its shape"):
        load_env_state(env, statics)
