"""Agents: the RL_Agent API, the device-checking wrapper, and replay over trajectories."""

from rlstruct.agents.agent import RL_Agent, replay_agent, replay_agent_stateless
from rlstruct.agents.check_device import RL_Agent_CheckDevice

__all__ = ["RL_Agent", "RL_Agent_CheckDevice", "replay_agent", "replay_agent_stateless"]
