"""Algorithms: REINFORCE, A2C and DQN on top of the batchers."""

__all__: list[str] = []
