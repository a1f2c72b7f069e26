"""A pool of ale-py vector envs that tests building many short-lived Atari envs lend from (``make_atari_env``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import pytest

from rlstruct.envs import VecEnv, make_env


class AtariPool:
    """ale-py's vector envs, each lent to one test at a time and taken back after it unless the test closed it.

    ale-py builds an env in 0.15 CPU s (its emulator loads the ROM and starts), as long as a reset takes, and a
    vector env reset with a seed plays what a fresh one of that seed plays, so a test lending them reuses the vector
    envs of earlier tests under a fresh ``make_env`` adapter (the first reset of which seeds every env).
    """

    def __init__(self):
        self.free: dict[tuple, list] = {}
        self.lent: list[tuple[tuple, object]] = []
        self.active = False

    def vector_env(self, build: Callable, game: str, n_envs: int, **kwargs):
        """``build(game, n_envs, **kwargs)`` (ale-py's ``AtariVectorEnv``), or a free one built so before."""
        if not self.active:
            return build(game, n_envs, **kwargs)
        key = (game, n_envs, tuple(sorted(kwargs.items())))
        free = self.free.setdefault(key, [])
        vec = free.pop() if free else build(game, n_envs, **kwargs)
        self.lent.append((key, vec))
        return vec

    @contextlib.contextmanager
    def lending(self, active: bool = True):
        """Within: ``make_atari_env`` lends (``active``) or builds afresh; after: the lent envs not closed are free."""
        self.active = active
        try:
            yield
        finally:
            self.active = False
            for key, vec in self.lent:
                if not vec.closed:
                    self.free[key].append(vec)
            self.lent.clear()


ATARI_POOL = AtariPool()


def make_atari_env(*args, **kwargs) -> VecEnv:
    """``make_env`` with ale-py's vector envs from ``ATARI_POOL``."""
    from ale_py import vector_env

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vector_env, "AtariVectorEnv", functools.partial(ATARI_POOL.vector_env, vector_env.AtariVectorEnv))
        return make_env(*args, **kwargs)
