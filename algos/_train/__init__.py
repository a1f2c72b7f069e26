"""What runs a training job, beneath the algorithm modules: the run's config and flags, the two loops, the session
(checks, batchers, signals, logs, evaluation, videos, checkpoints), presets and data-parallel ranks.

Nothing here is imported by ``import rlstruct.algos``; an algorithm module imports the pieces it uses.
"""
