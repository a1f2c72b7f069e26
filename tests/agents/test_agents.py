"""RL_Agent, RL_Agent_CheckDevice and replay_agent.

Device checks are exercised without a GPU: ``torch.device("meta")`` plays the wrong device
(and, in the reversed case, the agent's device, with CPU tensors being the wrong ones).
"""

from __future__ import annotations

import pickle

import pytest
import torch

from rlstruct import (
    DictTensor,
    RL_Agent,
    RL_Agent_CheckDevice,
    TemporalDictTensor,
    Trajectories,
    masked_tensor,
    replay_agent,
    replay_agent_stateless,
)
from rlstruct.errors import DeviceMismatchError
from tests.conftest import device_params

META = torch.device("meta")
CPU = torch.device("cpu")
N_IN, N_H, N_ACTIONS = 3, 5, 4


# ------------------------------------------------------------------------------------------------ agents
class RecurrentAgent(RL_Agent):
    """A small RNN policy that resets its state where ``initial_state`` is true and reads ``agent_info``."""

    def __init__(self, device: torch.device = CPU, seed: int = 0):
        torch.manual_seed(seed)
        self.device = device
        self.cell = torch.nn.RNNCell(N_IN, N_H).to(device)
        self.head = torch.nn.Linear(N_H, N_ACTIONS).to(device)
        self.replay_calls: list[tuple[int, int]] = []

    def parameters(self):
        return [*self.cell.parameters(), *self.head.parameters()]

    def initial_state(self, agent_info, B):
        return DictTensor({"h": torch.zeros(B, N_H, device=self.device)})

    def __call__(self, state, observation, agent_info, history=None):
        h = masked_tensor(state["h"], torch.zeros_like(state["h"]), observation["initial_state"])
        scale = agent_info["scale"].to(self.device).unsqueeze(1)
        h = self.cell(observation["frame"] * scale, h)
        logits = self.head(h)
        return DictTensor({"action": logits.argmax(-1), "logits": logits}), DictTensor({"h": h})

    def call_replay(self, trajectories, t, state):
        self.replay_calls.append((t, trajectories.n_elems()))
        return super().call_replay(trajectories, t, state)


def acquire(agent: RecurrentAgent, lengths: list[int], T: int, seed: int = 0) -> Trajectories:
    """Steps ``agent`` by hand, as a batcher would, and lays the result out as batcher output."""
    B = len(lengths)
    g = torch.Generator().manual_seed(seed)
    frames = torch.randn(B, T, N_IN, generator=g)
    initial = torch.rand(B, T, generator=g) < 0.3  # episodes restart mid-acquisition
    agent_info = DictTensor({"scale": torch.rand(B, generator=g) + 0.5})
    state0 = DictTensor({"h": torch.randn(B, N_H, generator=g)})  # a state carried from an earlier acquisition
    state, outputs = state0, []
    with torch.no_grad():
        for t in range(T):
            out, state = agent(state, DictTensor({"frame": frames[:, t], "initial_state": initial[:, t]}), agent_info)
            outputs.append(out)
    info = agent_info.prepend_key("agent_info/") + state0.prepend_key("agent_state/")
    steps = {"observation/frame": frames, "observation/initial_state": initial}
    steps.update({f"action/{k}": torch.stack([o[k] for o in outputs], dim=1) for k in outputs[0].keys()})
    return Trajectories(info, TemporalDictTensor(steps, torch.tensor(lengths, dtype=torch.int64)))


class Recorder(RL_Agent):
    """Returns tensors built on configurable devices and records what it receives."""

    def __init__(self, state_device=CPU, action_device=CPU, new_state_device=CPU):
        self.state_device = state_device
        self.action_device = action_device
        self.new_state_device = new_state_device
        self.last = None
        self.seeded = None
        self.updated = None
        self.closed = False
        self.custom = "forwarded"

    def initial_state(self, agent_info, B):
        return DictTensor({"h": torch.zeros(B, 2, device=self.state_device)})

    def __call__(self, state, observation, agent_info, history=None):
        B = observation.n_elems()
        action = DictTensor({"action": torch.zeros(B, dtype=torch.long, device=self.action_device)})
        new_state = DictTensor({"h": torch.ones(B, 2, device=self.new_state_device)})
        self.last = (action, new_state)
        return action, new_state

    def seed(self, seed):
        self.seeded = seed

    def update(self, state_dict):
        self.updated = state_dict

    def require_history(self):
        return True

    def close(self):
        self.closed = True

    def double(self, x):
        return 2 * x


def inputs(device, B=2, info_device=CPU):
    state = DictTensor({"h": torch.zeros(B, 2, device=device)})
    observation = DictTensor(
        {"frame": torch.zeros(B, 3, device=device), "initial_state": torch.ones(B, dtype=torch.bool, device=device)}
    )
    agent_info = DictTensor({"stochastic": torch.ones(B, dtype=torch.bool, device=info_device)})
    history = TemporalDictTensor({"frame": torch.zeros(B, 4, 3, device=device)})
    return state, observation, agent_info, history


# The agent's device and the wrong one: meta stands in for a GPU in both roles.
ROLES = [pytest.param(CPU, META, id="agent-cpu-wrong-meta"), pytest.param(META, CPU, id="agent-meta-wrong-cpu")]


# ----------------------------------------------------------------------------------- RL_Agent_CheckDevice
@pytest.mark.parametrize("device", device_params() + [META])
def test_check_device_passes_a_correct_agent_through(device):
    device = torch.device(device)
    inner = Recorder(device, device, device)
    agent = RL_Agent_CheckDevice(inner, device)
    state, observation, agent_info, history = inputs(device)
    action, new_state = agent(state, observation, agent_info, history)
    assert action is inner.last[0] and new_state is inner.last[1]
    s = agent.initial_state(agent_info, 2)
    assert s.device() == device and s.n_elems() == 2
    assert agent(DictTensor(), observation, DictTensor())[0] is inner.last[0]  # empty state / agent_info are fine


def test_check_device_forwards_methods_and_attributes():
    inner = Recorder()
    agent = RL_Agent_CheckDevice(inner, "cpu")
    assert isinstance(agent, RL_Agent)
    agent.seed(17)
    assert inner.seeded == 17  # rlstructures' wrapper dropped the seed
    agent.update({"w": 1})
    assert inner.updated == {"w": 1}
    assert agent.require_history() is True
    assert agent.custom == "forwarded" and agent.double(21) == 42
    agent.close()
    assert inner.closed
    assert agent.device == CPU and agent.agent is inner
    with pytest.raises(AttributeError, match="no_such_thing"):
        agent.no_such_thing


def test_check_device_normalises_the_device_and_pickles():
    assert RL_Agent_CheckDevice(Recorder(), "cpu:0").device == CPU
    assert RL_Agent_CheckDevice(Recorder(), torch.device("cpu")).device == CPU
    agent = pickle.loads(pickle.dumps(RL_Agent_CheckDevice(Recorder(), "cpu")))  # spawned workers pickle agents
    assert agent.custom == "forwarded" and agent.device == CPU


@pytest.mark.parametrize("device, wrong", ROLES)
def test_check_device_initial_state(device, wrong):
    agent = RL_Agent_CheckDevice(Recorder(state_device=device), device)
    _, _, on_wrong, _ = inputs(device, info_device=META)
    message = r"initial_state: agent_info must be on cpu, got meta \(key 'stochastic'\); build agent_info on the CPU"
    with pytest.raises(DeviceMismatchError, match=message):
        agent.initial_state(on_wrong, 2)
    bad = RL_Agent_CheckDevice(Recorder(state_device=wrong), device)
    message = rf"initial_state: the returned state must be on {device}, got {wrong} \(key 'h'\)"
    with pytest.raises(DeviceMismatchError, match=message):
        bad.initial_state(DictTensor(), 2)


@pytest.mark.parametrize("device, wrong", ROLES)
@pytest.mark.parametrize("argument, key", [("state", "h"), ("observation", "frame"), ("history", "frame")])
def test_check_device_call_inputs(device, wrong, argument, key):
    agent = RL_Agent_CheckDevice(Recorder(device, device, device), device)
    args = dict(zip(["state", "observation", "agent_info", "history"], inputs(device)))
    args[argument] = inputs(wrong)[["state", "observation", "agent_info", "history"].index(argument)]
    message = rf"__call__: {argument} must be on {device}, got {wrong} \(key '{key}'\); move it with \.to\('{device}'\)"
    with pytest.raises(DeviceMismatchError, match=message):
        agent(args["state"], args["observation"], args["agent_info"], args["history"])


@pytest.mark.parametrize("device, wrong", ROLES)
def test_check_device_call_agent_info_must_be_on_cpu(device, wrong):
    agent = RL_Agent_CheckDevice(Recorder(device, device, device), device)
    state, observation, _, _ = inputs(device)
    _, _, agent_info, _ = inputs(device, info_device=META)
    message = r"__call__: agent_info must be on cpu, got meta \(key 'stochastic'\)"
    with pytest.raises(DeviceMismatchError, match=message):
        agent(state, observation, agent_info)


@pytest.mark.parametrize("device, wrong", ROLES)
def test_check_device_call_outputs(device, wrong):
    state, observation, agent_info, _ = inputs(device)
    bad_action = RL_Agent_CheckDevice(Recorder(device, action_device=wrong, new_state_device=device), device)
    message = rf"__call__: the returned action must be on {device}, got {wrong} \(key 'action'\)"
    with pytest.raises(DeviceMismatchError, match=message):
        bad_action(state, observation, agent_info)
    bad_state = RL_Agent_CheckDevice(Recorder(device, action_device=device, new_state_device=wrong), device)
    message = rf"__call__: the returned new_state must be on {device}, got {wrong} \(key 'h'\)"
    with pytest.raises(DeviceMismatchError, match=message):
        bad_state(state, observation, agent_info)


def test_check_device_call_empty_action():
    class Silent(Recorder):
        def __call__(self, state, observation, agent_info, history=None):
            return DictTensor(), state

    state, observation, agent_info, _ = inputs(CPU)
    with pytest.raises(ValueError, match="__call__: the returned action is empty"):
        RL_Agent_CheckDevice(Silent(), "cpu")(state, observation, agent_info)


@pytest.mark.parametrize("device, wrong", ROLES)
def test_check_device_call_replay(device, wrong):
    trajectories = acquire(RecurrentAgent(), [3, 1], T=3)
    on_wrong = trajectories.to(wrong)
    agent = RL_Agent_CheckDevice(RecurrentAgent(device), device)
    message = (
        rf"call_replay: trajectories\.info must be on {device}, got {wrong} \(key 'agent_info/scale'\); "
        r"call trajectories\.to\(device\) first"
    )
    with pytest.raises(DeviceMismatchError, match=message):
        agent.call_replay(on_wrong, 0, None)
    steps_only = Trajectories(DictTensor(), on_wrong.trajectories)
    message = rf"call_replay: trajectories\.trajectories must be on {device}, got {wrong} \(key 'observation/frame'\)"
    with pytest.raises(DeviceMismatchError, match=message):
        agent.call_replay(steps_only, 0, None)


def test_check_device_call_replay_of_a_correct_agent_matches_the_agent():
    inner = RecurrentAgent()
    trajectories = acquire(inner, [3, 2, 0], T=3)
    wrapped = replay_agent(RL_Agent_CheckDevice(inner, "cpu"), trajectories)
    plain = replay_agent(inner, trajectories)
    for k in plain.keys():
        assert torch.equal(wrapped[k], plain[k])
    bad_state = DictTensor({"h": torch.zeros(3, N_H, device=META)})
    with pytest.raises(DeviceMismatchError, match=r"call_replay: state must be on cpu, got meta \(key 'h'\)"):
        RL_Agent_CheckDevice(inner, "cpu").call_replay(trajectories, 1, bad_state)


@pytest.mark.cuda
def test_check_device_catches_cpu_tensors_for_a_cuda_agent():
    agent = RL_Agent_CheckDevice(Recorder(), "cuda")
    state, observation, agent_info, _ = inputs(CPU)
    with pytest.raises(DeviceMismatchError, match=r"__call__: state must be on cuda:0, got cpu \(key 'h'\)"):
        agent(state, observation, agent_info)


# ---------------------------------------------------------------------------------------------- RL_Agent
def test_rl_agent_defaults():
    agent = RL_Agent()
    assert agent.initial_state(DictTensor(), 3).empty()
    assert agent.require_history() is False
    assert agent.seed(0) is None and agent.close() is None
    with pytest.raises(NotImplementedError, match=r"RL_Agent must implement __call__"):
        agent(DictTensor(), DictTensor(), DictTensor())
    with pytest.raises(NotImplementedError, match=r"RL_Agent must implement update"):
        agent.update({})


def test_default_call_replay_needs_a_state_after_t0():
    agent = RecurrentAgent()
    trajectories = acquire(agent, [2, 2], T=2)
    with pytest.raises(ValueError, match=r"call_replay needs the state of step t-1 when t > 0 \(t=1, state=None\)"):
        RL_Agent.call_replay(agent, trajectories, 1, None)


# ------------------------------------------------------------------------------------------ replay_agent
@pytest.mark.parametrize("lengths, T", [([4, 2, 0, 3], 4), ([1], 1), ([5, 5, 1], 6)])
def test_replay_reproduces_the_acquisition(lengths, T):
    agent = RecurrentAgent()
    trajectories = acquire(agent, lengths, T)
    agent.replay_calls.clear()
    out = replay_agent(agent, trajectories)
    assert isinstance(out, TemporalDictTensor)
    assert out.lengths.tolist() == lengths and out.lengths is not trajectories.trajectories.lengths
    B = len(lengths)
    assert out["logits"].shape == (B, T, N_ACTIONS) and out["action"].shape == (B, T)
    assert torch.equal(out["action"], trajectories.trajectories["action/action"])
    assert torch.allclose(out["logits"], trajectories.trajectories["action/logits"], atol=1e-6)
    # batched over B: one call per step, each with all B trajectories
    assert agent.replay_calls == [(t, B) for t in range(T)]


def test_replay_uses_the_carried_state_and_agent_info():
    agent = RecurrentAgent()
    trajectories = acquire(agent, [3, 3], T=3)
    info = trajectories.info
    changed = Trajectories(
        DictTensor({"agent_info/scale": info["agent_info/scale"] * 2, "agent_state/h": info["agent_state/h"]}),
        trajectories.trajectories,
    )
    assert not torch.allclose(replay_agent(agent, changed)["logits"], trajectories.trajectories["action/logits"])


def test_replay_gradients_reach_the_parameters():
    agent = RecurrentAgent()
    trajectories = acquire(agent, [3, 1, 2], T=3)
    out = replay_agent(agent, trajectories)
    assert out["logits"].requires_grad
    mask = out.mask()
    loss = (out["logits"].logsumexp(-1) * mask).sum() / mask.sum()
    loss.backward()
    for p in agent.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_replay_with_a_custom_method_name():
    class Critic(RecurrentAgent):
        def call_value(self, trajectories, t, state):
            out, new_state = self.call_replay(trajectories, t, state)
            return DictTensor({"value": out["logits"].sum(-1)}), new_state

    agent = Critic()
    trajectories = acquire(agent, [2, 1], T=2)
    out = replay_agent(agent, trajectories, replay_method_name="call_value")
    assert list(out.keys()) == ["value"]
    assert torch.allclose(out["value"], trajectories.trajectories["action/logits"].sum(-1), atol=1e-6)


def test_replay_of_zero_steps_raises():
    agent = RecurrentAgent()
    trajectories = acquire(agent, [0, 0], T=1).trajectories.temporal_slice(0, 0)
    with pytest.raises(ValueError, match=r"no step to replay \(T=0\)"):
        replay_agent(agent, Trajectories(DictTensor(), trajectories))


def test_replay_agent_stateless_calls_the_named_method():
    class WholeSequence(RL_Agent):
        def __init__(self):
            self.received = []

        def over_time(self, trajectories):
            self.received.append(trajectories)
            x = trajectories.trajectories["observation/frame"]
            return TemporalDictTensor({"y": x.sum(-1)}, trajectories.trajectories.lengths)

    agent = WholeSequence()
    trajectories = acquire(RecurrentAgent(), [2, 3], T=3)
    out = replay_agent_stateless(agent, trajectories, "over_time")
    assert agent.received == [trajectories]
    assert torch.equal(out["y"], trajectories.trajectories["observation/frame"].sum(-1))
    with pytest.raises(AttributeError, match="no_method"):
        replay_agent_stateless(agent, trajectories, "no_method")
