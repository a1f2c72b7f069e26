"""Tutorial 3: writing agents, and finding device bugs with RL_Agent_CheckDevice.

An ``RL_Agent`` is a policy over a batch of ``B`` running environments:

* ``initial_state(agent_info, B)`` is the state of ``B`` fresh episodes (empty when stateless);
* ``agent(state, observation, agent_info)`` returns ``(action, new_state)``: ``action`` is a
  DictTensor holding at least the key ``"action"`` (every key it holds is stored by a batcher
  under ``action/*``), ``new_state`` has the keys of ``initial_state``;
* ``agent_info`` is per-env, on the CPU (e.g. whether to explore); everything else lives on the
  agent's device;
* ``update(state_dict)`` receives weights, ``seed(seed)`` seeds the agent's own randomness.

Run it with ``python tutorials/03_agents_and_check_device.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the number of environments and steps; the
tests run every tutorial with a small value.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from rlstruct import DictTensor, RL_Agent, RL_Agent_CheckDevice, masked_dicttensor
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import CartPole
from rlstruct.errors import BatcherWorkerError, DeviceMismatchError

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))
N_ENVS = max(8, int(256 * SCALE))
N_STEPS = max(30, int(300 * SCALE))

# The agent runs on AGENT_DEVICE (here the CPU, where the envs are). WRONG_DEVICE is where a bug puts
# a tensor: a GPU when there is one; otherwise the "meta" device, which has shapes but no data and is
# enough to show which device a tensor is on.
AGENT_DEVICE = torch.device("cpu")
WRONG_DEVICE = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("meta")


def make_policy(obs_dim: int = 4, n_actions: int = 2, hidden: int = 32) -> nn.Module:
    return nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))


class PolicyAgent(RL_Agent):
    """A feed-forward policy: samples when ``agent_info["stochastic"]`` is true, else acts greedily.

    It owns its model, built on its own ``device``; the learner sends weights through ``update``.
    """

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.model = make_policy().to(self.device)
        self.generator = torch.Generator(device=self.device)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def update(self, state_dict) -> None:
        self.model.load_state_dict(state_dict)

    def __call__(self, state, observation, agent_info, history=None):
        logits = self.model(observation["frame"])
        sampled = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        # agent_info lives on the CPU (it is per-env configuration, not data): move what you use.
        stochastic = agent_info["stochastic"].to(self.device)
        action = torch.where(stochastic, sampled, logits.argmax(-1))
        # Extra keys are kept by the batcher next to the action (action/logits): handy for the loss.
        return DictTensor({"action": action, "logits": logits}), state


class RecurrentAgent(RL_Agent):
    """A GRU policy. Its state is the GRU memory ``h [B, H]`` and ``t [B]``, the steps of the episode so far.

    With auto-reset environments an episode can start at any step, on any row: the agent resets its
    own state on the rows where ``observation["initial_state"]`` is true, with ``masked_dicttensor``
    (batched, no Python branch on values).
    """

    def __init__(self, device: str | torch.device = "cpu", hidden: int = 16):
        self.device = torch.device(device)
        self.hidden = hidden
        self.cell = nn.GRUCell(4, hidden).to(self.device)
        self.head = nn.Linear(hidden, 2).to(self.device)

    def initial_state(self, agent_info, B):
        # device=self.device: forgetting it is the most common device bug (see part 4).
        return DictTensor(
            {
                "h": torch.zeros(B, self.hidden, device=self.device),
                "t": torch.zeros(B, dtype=torch.long, device=self.device),
            }
        )

    def __call__(self, state, observation, agent_info, history=None):
        B = observation.n_elems()
        state = masked_dicttensor(state, self.initial_state(agent_info, B), observation["initial_state"])
        h = self.cell(observation["frame"], state["h"])
        action = self.head(h).argmax(-1)
        return DictTensor({"action": action}), DictTensor({"h": h, "t": state["t"] + 1})


def run_policy_agent() -> None:
    print("== 1. A feed-forward agent, driven by hand")
    agent = PolicyAgent(AGENT_DEVICE)
    agent.seed(0)
    env = CartPole(N_ENVS, seed=0, autoreset=True)
    # Half the envs explore, half act greedily: agent_info is per env, so one batch can mix both.
    stochastic = torch.arange(N_ENVS) % 2 == 0
    agent_info = DictTensor({"stochastic": stochastic})
    obs, ids = env.reset()
    state = agent.initial_state(agent_info, N_ENVS)
    assert state.empty()  # stateless
    with torch.no_grad():  # a batcher also calls the agent without gradients
        for _ in range(N_STEPS):
            action, state = agent(state, obs, agent_info)
            (obs_next, _), (obs, ids) = env.step(action)
            greedy = action["logits"].argmax(-1)
            assert torch.equal(action["action"][~stochastic], greedy[~stochastic])
    print(f"   {N_ENVS} envs x {N_STEPS} steps; greedy rows always took the argmax")

    # update() takes a CPU state dict (what RL_Batcher.update sends): the learner's weights.
    learner = make_policy()
    agent.update({k: v.cpu() for k, v in learner.state_dict().items()})
    x = torch.randn(3, 4)
    assert torch.equal(agent.model(x), learner(x))


def run_recurrent_agent() -> None:
    print("== 2. A recurrent agent resets its own state where episodes start")
    agent = RecurrentAgent(AGENT_DEVICE)
    env = CartPole(N_ENVS, seed=1, autoreset=True)
    agent_info = DictTensor({})
    obs, ids = env.reset()
    state = agent.initial_state(agent_info, N_ENVS)
    n_restarts = 0
    with torch.no_grad():
        for _ in range(N_STEPS):
            # The env's own count of steps in the current episode, taken before acting.
            elapsed = env.get_state()["elapsed_steps"]
            action, state = agent(state, obs, agent_info)
            # The agent's counter restarted with every episode: it always agrees with the env.
            assert torch.equal(state["t"] - 1, elapsed)
            (obs_next, _), (obs, ids) = env.step(action)
            n_restarts += int(obs["initial_state"].sum())
    assert n_restarts > 0
    print(f"   {n_restarts} episodes restarted mid-run; the agent's step counter matched the env's every time")


class LearnerModelAgent(RL_Agent):
    """THE BUG: an agent that acts with the learner's model, wherever that model lives.

    It moves the observation to the model's device, as it must to run the model, and returns the
    action from there. The batcher and the env expect it on the agent's device.
    """

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, state, observation, agent_info, history=None):
        device = next(self.model.parameters()).device
        logits = self.model(observation["frame"].to(device))
        return DictTensor({"action": logits.argmax(-1), "logits": logits}), state


def find_the_device_bug() -> None:
    print(f"== 3. RL_Agent_CheckDevice finds an action on the wrong device ({WRONG_DEVICE} instead of {AGENT_DEVICE})")
    learner_model = make_policy().to(WRONG_DEVICE)  # the learner trains on its own device
    buggy = LearnerModelAgent(learner_model)
    env = CartPole(4, seed=0)
    obs, ids = env.reset()
    agent_info = DictTensor({"stochastic": torch.zeros(4, dtype=torch.bool)})

    # Without the wrapper, the bug surfaces one step later, in the env. The message is accurate but
    # it is about the env's boundary, and it suggests a DeviceEnv, which would hide the bug behind a
    # copy at every step instead of fixing it.
    action, _ = buggy(DictTensor({}), obs, agent_info)
    try:
        env.step(action)
    except DeviceMismatchError as e:
        print("   without the wrapper, the env says:\n     ", e)
    else:
        raise AssertionError("the env must refuse an action on another device")

    # RL_Agent_CheckDevice(agent, device) checks every tensor going in and out of the agent: state,
    # observation, history and outputs on `device`, agent_info on the CPU. The error names the
    # method, the argument, the key, both devices, and the fix.
    checked = RL_Agent_CheckDevice(buggy, AGENT_DEVICE)
    try:
        checked(DictTensor({}), obs, agent_info)
    except DeviceMismatchError as e:
        message = str(e)
        print("   RL_Agent_CheckDevice says:\n     ", message)
    else:
        raise AssertionError("RL_Agent_CheckDevice must catch the action on the wrong device")
    assert message.startswith("__call__: the returned action")
    assert "'action'" in message and str(WRONG_DEVICE) in message

    # In a real run the batcher calls the agent, often in another process. RLSTRUCT_CHECK_DEVICE=1
    # makes every batcher wrap every agent it creates; the worker's error comes back as a
    # BatcherWorkerError that carries the DeviceMismatchError's message. The batcher's first call of
    # the agent (to size its buffer) already catches it, before any acquisition.
    os.environ["RLSTRUCT_CHECK_DEVICE"] = "1"
    try:
        RL_Batcher(8, LearnerModelAgent, {"model": learner_model}, CartPole, {"n_envs": 4}, 0, [0],
                   agent_info=agent_info.slice(0, 1))
    except BatcherWorkerError as e:
        print("   inside a batcher:\n     ", str(e).splitlines()[0])
        assert "DeviceMismatchError" in str(e) and "the returned action" in str(e)
    else:
        raise AssertionError("the batcher must report the device bug")
    finally:
        del os.environ["RLSTRUCT_CHECK_DEVICE"]

    # THE FIX: the agent owns a model on its own device, and the learner's weights reach it through
    # update() as a CPU state dict (RL_Batcher.update sends exactly that to every worker). The learner
    # keeps its model on its device; only weights cross, once per update, not observations every step.
    fixed = RL_Agent_CheckDevice(PolicyAgent(AGENT_DEVICE), AGENT_DEVICE)
    fixed.update({k: v.cpu() for k, v in make_policy().state_dict().items()})
    action, _ = fixed(DictTensor({}), obs, agent_info)
    assert action.device() == AGENT_DEVICE
    env.step(action)
    print("   fixed: the agent builds its model on its own device and receives weights with update()")


class ForgetfulRecurrentAgent(RecurrentAgent):
    """The other classic: the initial state built without ``device=``, so it lands on the CPU."""

    def initial_state(self, agent_info, B):
        return DictTensor({"h": torch.zeros(B, self.hidden), "t": torch.zeros(B, dtype=torch.long)})


def find_the_state_bug() -> None:
    print(f"== 4. The same check on a state created on the CPU for an agent on {WRONG_DEVICE}")
    checked = RL_Agent_CheckDevice(ForgetfulRecurrentAgent(WRONG_DEVICE), WRONG_DEVICE)
    try:
        checked.initial_state(DictTensor({}), 4)
    except DeviceMismatchError as e:
        print("     ", e)
        assert "initial_state" in str(e) and "'h'" in str(e)
    else:
        raise AssertionError("the CPU state of an agent on another device must be caught")
    # The correct agent passes (shapes only on the meta device, real values on a GPU).
    state = RL_Agent_CheckDevice(RecurrentAgent(WRONG_DEVICE), WRONG_DEVICE).initial_state(DictTensor({}), 4)
    assert state.device() == WRONG_DEVICE


def main() -> None:
    torch.manual_seed(0)
    run_policy_agent()
    run_recurrent_agent()
    find_the_device_bug()
    find_the_state_bug()
    print("tutorial 03: all claims hold")


if __name__ == "__main__":
    main()
