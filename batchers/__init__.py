"""Batchers: collect trajectories from an agent and a vectorized environment."""

__all__: list[str] = []
