"""MinAtar's games as batched torch simulators."""
