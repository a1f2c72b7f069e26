"""What runs a training job: flags, loops, session, logs, evaluation, videos, checkpoints, presets, sweeps,
data-parallel ranks, the ``rlstruct`` command and the saved run's :class:`~rlstruct.algos.Policy`.

Private: an algorithm imports what it is written against from :mod:`rlstruct.algos.harness`, the public face of
this package; the modules here import each other directly.
"""
