"""Importable fakes for the batcher tests (``spawn`` workers must be able to import them)."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import torch

from rlstruct import DictTensor, RL_Agent, masked_dicttensor
from rlstruct.envs import VecEnv


class CountingEnv(VecEnv):
    """Env ``i`` of seed ``s`` has episodes of ``episode_lengths[i % len]`` steps; its frame is
    ``[s * 1000 + i, step]`` and its reward is the step reached.

    Args:
        n_envs: number of envs.
        episode_lengths: episode length per env (cycled).
        seed: the seed (only shows in the frame, to tell workers apart).
        autoreset: auto-reset finished envs.
        device: where observations live.
        fail_at_step: raise RuntimeError at this global step count (``None``: never).
        fail_seed: only fail when ``seed == fail_seed`` (``None``: any seed).
        hang_at_step: sleep forever at this step (to test timeouts).
    """

    def __init__(self, n_envs=3, episode_lengths=(2, 4, 7), seed=0, autoreset=False, device="cpu",
                 fail_at_step=None, fail_seed=None, hang_at_step=None):
        self._n = n_envs
        self.seed = seed
        self.autoreset = autoreset
        self.device = torch.device(device)
        self.lengths = torch.tensor([episode_lengths[i % len(episode_lengths)] for i in range(n_envs)],
                                    device=self.device)
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.fail_at_step = fail_at_step if fail_seed is None or fail_seed == seed else None
        self.hang_at_step = hang_at_step if fail_seed is None or fail_seed == seed else None
        self.n_steps = 0
        self.closed = False

    def n_envs(self):
        return self._n

    def _obs(self, ids, reward, done, initial, last_action):
        frame = torch.stack([self.seed * 1000.0 + ids.float(), self.t[ids].float()], dim=1)
        return DictTensor({
            "frame": frame, "reward": reward, "done": done, "terminated": done, "truncated": torch.zeros_like(done),
            "initial_state": initial, "last_action": last_action,
        })

    def reset(self, env_info=None):
        n = self._n
        self.t = torch.zeros(n, dtype=torch.long, device=self.device)
        self.ids = torch.arange(n, device=self.device)
        z = torch.zeros(n, dtype=torch.bool, device=self.device)
        no_action = torch.zeros(n, dtype=torch.long, device=self.device)
        obs = self._obs(self.ids, torch.zeros(n, device=self.device), z, ~z, no_action)
        return obs, self.ids

    def step(self, action):
        self.n_steps += 1
        if self.fail_at_step is not None and self.n_steps >= self.fail_at_step:
            raise RuntimeError(f"CountingEnv failure injected at step {self.n_steps}")
        if self.hang_at_step is not None and self.n_steps >= self.hang_at_step:
            time.sleep(3600)
        ids = self.ids
        a = action["action"]
        self.t[ids] += 1
        done = self.t[ids] >= self.lengths[ids]
        obs_next = self._obs(ids, self.t[ids].float(), done, torch.zeros_like(done), a)
        if self.autoreset:
            self.t[ids] = torch.where(done, torch.zeros_like(self.t[ids]), self.t[ids])
            z = torch.zeros_like(done)
            last_action = torch.where(done, torch.zeros_like(a), a)
            fresh = self._obs(ids, torch.zeros(len(ids), device=self.device), z, done, last_action)
            running = masked_dicttensor(obs_next, fresh, done)
            return (obs_next, ids), (running, ids)
        keep = ~done
        self.ids = ids[keep]
        return (obs_next, ids), (obs_next.index(keep), self.ids)

    def close(self):
        self.closed = True


class ConstantAgent(RL_Agent):
    """Always action 0; stateless."""

    def __call__(self, state, observation, agent_info, history=None):
        B = observation.n_elems()
        return DictTensor({"action": torch.zeros(B, dtype=torch.long, device=observation.device())}), state

    def update(self, state_dict):
        pass


class CounterAgent(RL_Agent):
    """Recurrent: its state counts steps since the episode started; outputs a seeded random action,
    the count, and ``scale * count`` (``scale`` set by ``update``).

    Args:
        device: where its state and outputs live.
        fail_at_call: raise RuntimeError at this call (``None``: never).
    """

    def __init__(self, device="cpu", fail_at_call=None):
        self.device = torch.device(device)
        self.scale = torch.ones(1, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self.fail_at_call = fail_at_call
        self.calls = 0

    def seed(self, seed):
        self.generator.manual_seed(seed)

    def initial_state(self, agent_info, B):
        return DictTensor({"count": torch.zeros(B, dtype=torch.long, device=self.device)})

    def __call__(self, state, observation, agent_info, history=None):
        self.calls += 1
        if self.fail_at_call is not None and self.calls >= self.fail_at_call:
            raise ValueError(f"CounterAgent failure injected at call {self.calls}")
        B = observation.n_elems()
        state = masked_dicttensor(state, self.initial_state(agent_info, B), observation["initial_state"])
        count = state["count"] + 1
        action = torch.randint(0, 2, (B,), generator=self.generator, device=self.device)
        out = {"action": action, "count": count, "scaled": count.float() * self.scale}
        if "bonus" in agent_info:
            out["bonus"] = agent_info["bonus"].to(self.device)
        return DictTensor(out), DictTensor({"count": count})

    def update(self, state_dict):
        self.scale = state_dict["scale"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class MetaStateAgent(CounterAgent):
    """A device bug on purpose: its initial state lands on the ``meta`` device."""

    def initial_state(self, agent_info, B):
        return super().initial_state(agent_info, B).to("meta")


class SamplingAgent(RL_Agent):
    """A small MLP that samples actions (``torch.multinomial``, the device RNG) from a recurrent state ``h`` (a
    decaying sum of frames); ``agent_info["temperature"]``, when given, divides the logits. Every step is device
    work only, so it can be captured in a CUDA graph."""

    def __init__(self, device="cpu", obs_dim=4, n_actions=2):
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, 16), torch.nn.Tanh(), torch.nn.Linear(16, n_actions)
        ).to(self.device)

    def initial_state(self, agent_info, B):
        return DictTensor({"h": torch.zeros(B, self.model[0].in_features, device=self.device)})

    def _logits(self, state, observation):
        """``(h, logits)``: the new recurrent state and the MLP's logits on it."""
        h = 0.9 * state["h"] + observation["frame"]
        return h, self.model(h)

    def __call__(self, state, observation, agent_info, history=None):
        h, logits = self._logits(state, observation)
        if "temperature" in agent_info.keys():
            logits = logits / agent_info["temperature"].to(self.device, non_blocking=True).unsqueeze(1)
        action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        return DictTensor({"action": action, "logits": logits}), DictTensor({"h": h})

    def update(self, state_dict):
        self.model.load_state_dict(state_dict)


class SyncingAgent(SamplingAgent):
    """A :class:`SamplingAgent` that reads a value back to the host at every step (``.item()``): not capturable."""

    def __call__(self, state, observation, agent_info, history=None):
        action, new_state = super().__call__(state, observation, agent_info, history)
        if action["logits"].abs().max().item() < 0:  # never true; the read-back is the point
            raise AssertionError
        return action, new_state


class GeneratorAgent(SamplingAgent):
    """A :class:`SamplingAgent` drawing from its own ``torch.Generator`` (seeded by ``agent.seed``), and reading
    ``agent_info["stochastic"]`` to choose between sampling and the greedy action."""

    def __init__(self, device="cpu"):
        super().__init__(device)
        self.generator = torch.Generator(device=self.device)

    def seed(self, seed):
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info, history=None):
        h, logits = self._logits(state, observation)
        sampled = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        stochastic = agent_info["stochastic"].to(self.device, non_blocking=True)
        action = torch.where(stochastic, sampled, logits.argmax(-1))
        return DictTensor({"action": action, "logits": logits}), DictTensor({"h": h})


class HistorySamplingAgent(SamplingAgent):
    """A :class:`SamplingAgent` whose logits also depend on the acquisition so far (``history``): its step count
    and the sum of its frames. Device work only, so it can be captured."""

    def require_history(self):
        return True

    def __call__(self, state, observation, agent_info, history=None):
        h, logits = self._logits(state, observation)
        past = history["observation/frame"].sum(dim=(1, 2)) + history.lengths.to(torch.float32)
        logits = logits + 0.01 * past.unsqueeze(1)
        action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        return DictTensor({"action": action, "logits": logits, "past": past}), DictTensor({"h": h})


class GraphStateEnv(CountingEnv):
    """A CountingEnv whose state is one tensor ``t`` handed out through the graph-capture contract
    (``graph_state``/``set_graph_state``); ``step_into`` only advances it, rebinding ``t`` to a new tensor."""

    def graph_state(self):
        return {"t": self.t}

    def set_graph_state(self, state):
        self.t = state["t"]

    def step_into(self, action, observation_next, observation_running):
        self.t = self.t + 1


# --------------------------------------------------------------------------- fault injection (test_batcher_faults)
class CloseRaisingEnv(CountingEnv):
    """A CountingEnv whose ``close`` raises (a simulator failing to shut down)."""

    def close(self):
        raise RuntimeError("close failure injected")


class MarkerCloseEnv(CountingEnv):
    """A CountingEnv that appends ``closed <pid>`` to the file ``marker`` when closed (standing for a resource to
    release: a simulator, a server, a file); with ``hang_in_close``, its ``close`` sleeps forever after that."""

    def __init__(self, marker, hang_in_close=False, **kw):
        super().__init__(**kw)
        self.marker = marker
        self.hang_in_close = hang_in_close

    def close(self):
        with open(self.marker, "a") as f:
            f.write(f"closed {os.getpid()}\n")
        if self.hang_in_close:
            time.sleep(3600)


class DriftEnv(CountingEnv):
    """A CountingEnv whose step observations leave the layout of its reset ones: ``"shape"`` returns ``frame`` as
    ``[B, 1]`` (reset: ``[B, 2]``), ``"dtype"`` as float64 (reset: float32)."""

    def __init__(self, drift="shape", **kw):
        super().__init__(**kw)
        self.drift = drift

    def _obs(self, ids, reward, done, initial, last_action):
        obs = super()._obs(ids, reward, done, initial, last_action)
        if self.n_steps == 0:  # reset's observations keep the layout
            return obs
        frame = obs["frame"][:, :1] if self.drift == "shape" else obs["frame"].double()
        return DictTensor({**dict(obs.items()), "frame": frame})


class DriftAgent(RL_Agent):
    """Leaves the layout of its first (probe) call from call ``at`` on: ``"extra"`` adds an output key, ``"drop"``
    drops one, ``"column"`` returns actions ``[B, 1]``, ``"float"`` float actions, ``"rows"`` one action row too
    many, ``"state"`` a wider recurrent state."""

    def __init__(self, kind, at=2):
        self.kind, self.at, self.calls = kind, at, 0

    def initial_state(self, agent_info, B):
        return DictTensor({"h": torch.zeros(B, 3)})

    def __call__(self, state, observation, agent_info, history=None):
        self.calls += 1
        B = observation.n_elems()
        out = {"action": torch.zeros(B, dtype=torch.long), "value": torch.zeros(B)}
        h = torch.zeros(B, 3)
        if self.calls >= self.at:
            if self.kind == "extra":
                out["extra"] = torch.ones(B)
            elif self.kind == "drop":
                del out["value"]
            elif self.kind == "column":
                out["action"] = torch.zeros(B, 1, dtype=torch.long)
            elif self.kind == "float":
                out["action"] = torch.full((B,), 0.7)
            elif self.kind == "rows":
                out = {k: torch.cat([v, v[:1]]) for k, v in out.items()}
            elif self.kind == "state":
                h = torch.zeros(B, 4)
        return DictTensor(out), DictTensor({"h": h})


class InterruptingAgent(RL_Agent):
    """Raises ``KeyboardInterrupt`` (a Ctrl-C landing in the forward) or ``SystemExit`` at call ``at``, once."""

    def __init__(self, at=5, exc="KeyboardInterrupt"):
        self.at, self.calls, self.exc = at, 0, exc

    def __call__(self, state, observation, agent_info, history=None):
        self.calls += 1
        if self.calls == self.at:
            raise {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[self.exc]()
        return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.long)}), state


class SlowAgent(ConstantAgent):
    """A ConstantAgent that sleeps ``delay`` seconds per call (a long, healthy acquisition)."""

    def __init__(self, delay=0.2):
        self.delay = delay

    def __call__(self, state, observation, agent_info, history=None):
        time.sleep(self.delay)
        return super().__call__(state, observation, agent_info, history)


class HangingAgent(ConstantAgent):
    """A ConstantAgent whose ``hang_at_call``-th call (1: the probe, at the batcher's start; 2: the first step of
    the first acquisition) sleeps an hour."""

    def __init__(self, hang_at_call=2):
        self.hang_at_call = hang_at_call
        self.calls = 0

    def __call__(self, state, observation, agent_info, history=None):
        self.calls += 1
        if self.calls == self.hang_at_call:
            time.sleep(3600)
        return super().__call__(state, observation, agent_info, history)


class UniformBoxAgent(RL_Agent):
    """Stateless; float32 actions ``[B, action_dim]`` drawn uniformly in ``[-1, 1)`` from its own seeded generator
    (a Box action space of Brax's convention)."""

    def __init__(self, action_dim=1):
        self.action_dim = action_dim
        self.generator = torch.Generator()

    def seed(self, seed):
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info, history=None):
        B = observation.n_elems()
        action = torch.rand(B, self.action_dim, generator=self.generator) * 2 - 1
        return DictTensor({"action": action.to(observation.device())}), state

    def update(self, state_dict):
        pass


class FaultEnv(CountingEnv):
    """A CountingEnv that fails at its ``at_step``-th step when its seed is ``fault_seed`` (``None``: any seed), as
    ``fault`` says: ``"raise"`` a RuntimeError, ``"exit"`` the process at once (``os._exit(3)``, no reply),
    ``"segfault"`` (reads address 0: SIGSEGV), or ``"hang"`` (sleeps an hour). A worker restarted with another seed
    does not fail again (unless ``fault_seed`` is ``None``)."""

    def __init__(self, fault="raise", at_step=6, fault_seed=None, **kwargs):
        super().__init__(**kwargs)
        self.fault = fault
        self.at_step = at_step if fault_seed is None or fault_seed == self.seed else None

    def step(self, action):
        if self.at_step is not None and self.n_steps + 1 >= self.at_step:
            if self.fault == "raise":
                raise RuntimeError(f"FaultEnv failure injected at step {self.n_steps + 1}")
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "segfault":
                import ctypes

                ctypes.string_at(0)
            if self.fault == "hang":
                time.sleep(3600)
        return super().step(action)


class FirstSeedsOnlyEnv(FaultEnv):
    """A FaultEnv that cannot be built with a seed of ``max_seed`` or more (a restarted worker's seed, drawn from
    ``[0, 2**31)``, almost surely is): a worker whose replacement fails while starting."""

    def __init__(self, max_seed=100, **kwargs):
        if kwargs.get("seed", 0) >= max_seed:
            raise RuntimeError(f"FirstSeedsOnlyEnv cannot be built with seed {kwargs.get('seed')}")
        super().__init__(**kwargs)


class SlowWrapper(RL_Agent):
    """The agent ``create(**args)``, sleeping ``delay`` seconds before each step: an acquisition long enough to be
    killed in the middle of, whose steps are the wrapped agent's. With ``raise_at_call`` (``raise_at_update``), its
    call (update) of that number (1: the probe, the first update) raises RuntimeError, once in the process
    (``SlowWrapper.raised`` says whether it did): a fault that the exact replacement of an in-process worker does not
    meet again."""

    raised = False

    def __init__(self, create, args, delay=0.05, raise_at_call=None, raise_at_update=None):
        self.agent = create(**args)
        self.delay = delay
        self.raise_at_call = raise_at_call
        self.raise_at_update = raise_at_update
        self.calls = 0
        self.updates = 0

    def initial_state(self, agent_info, B):
        return self.agent.initial_state(agent_info, B)

    def __call__(self, state, observation, agent_info, history=None):
        self.calls += 1
        if self.calls == self.raise_at_call and not SlowWrapper.raised:
            SlowWrapper.raised = True
            raise RuntimeError("SlowWrapper failure injected")
        time.sleep(self.delay)
        return self.agent(state, observation, agent_info, history)

    def update(self, state_dict):
        self.updates += 1
        if self.updates == self.raise_at_update and not SlowWrapper.raised:
            SlowWrapper.raised = True
            raise RuntimeError("SlowWrapper failure injected")
        self.agent.update(state_dict)

    def seed(self, seed):
        self.agent.seed(seed)

    def seed_envs(self, seed, env_index):
        self.agent.seed_envs(seed, env_index)

    def noise_state(self):
        return self.agent.noise_state()

    def set_noise_state(self, state):
        self.agent.set_noise_state(state)

    def close(self):
        self.agent.close()


class StartKillEnv(CountingEnv):
    """A CountingEnv whose building SIGKILLs its own process (a worker killed while the batcher starts) when its
    seed is ``kill_seed`` (``None``: any seed): on the first build only, or on every build with ``every_start``.
    Each kill first appends a line to the file ``marker``, whose existence tells a later build that the first kill
    happened. Only for worker processes."""

    def __init__(self, marker, kill_seed=None, every_start=False, **kwargs):
        super().__init__(**kwargs)
        if kill_seed is not None and kill_seed != self.seed:
            return
        if every_start or not os.path.exists(marker):
            with open(marker, "a") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)


class RaiseOnceEnv(CountingEnv):
    """A CountingEnv whose first build in the process raises RuntimeError (``RaiseOnceEnv.raised`` says whether it
    did): an in-process worker that fails while the batcher starts, once."""

    raised = False

    def __init__(self, **kwargs):
        if not RaiseOnceEnv.raised:
            RaiseOnceEnv.raised = True
            raise RuntimeError("RaiseOnceEnv failure injected")
        super().__init__(**kwargs)
