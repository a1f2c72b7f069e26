"""Programs written the way rlstructures v0.2's examples are, importing rlstruct through rlstructures' module paths.

Each file is what a user of rlstructures would have after renaming ``rlstructures`` to ``rlstruct`` (and ``gym`` to
``gymnasium``): REINFORCE, REINFORCE on devices, A2C with GAE, DQN, PPO and DIAYN, each with module-level
``create_env``/``create_agent`` (the batcher's worker processes unpickle them), an ``Experiment`` whose ``run``
trains, and a ``__main__`` block with rlstructures' own settings.
``tests/project/test_rlstructures_compat.py`` runs them at a tiny size. What the examples took from their own package
(``rlalgos``), ``Logger``, ``TFLogger`` and ``weight_init``, they import from the paths rlstructures gave them.
"""
