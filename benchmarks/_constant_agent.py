"""An agent that always plays action 0: what a benchmark of collection machinery (not of a policy) gives its workers,
in a module of its own so that a worker imports it without importing the benchmark's script's peers."""

from __future__ import annotations

import torch

from rlstruct import DictTensor
from rlstruct.agents import RL_Agent


class ConstantAgent(RL_Agent):
    """Action 0 for every env, no state."""

    def __call__(self, state, observation, agent_info, history=None):
        return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.long)}), state
