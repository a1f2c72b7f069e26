"""The compiled CPU step of the torch MinAtar games (numba): the torch step's bits (frames, rewards, flags, the state),
the move to it after ``RLSTRUCT_JIT_AFTER`` env steps, ``step_into`` and ``RLSTRUCT_JIT=0``.

The env's compiled step is one loop, written once, that binds a game's rules (``_jit_driver.game_module``); numba
compiles it per game cold in 5-35 CPU s. Here it runs for one game, :data:`COMPILED`'s first (the one every test of
this module compiles): each game's rules, the rest of what a game's loop runs, are held to the torch game row by row,
bit for bit, by tests/envs/test_minatar_kernels.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import _jit
from rlstruct.envs.minatar import GAMES, MinAtarEnv
from rlstruct.envs.minatar._env import has_kernels
from tests.envs.minatar_steps import LIMITS, assert_same_bits, biased_actions

needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba is not installed (pip install rlstruct[fast]): no compiled step")
COMPILED = [name for name, (minatar_name, _) in GAMES.items() if has_kernels(minatar_name)]
# One xdist worker runs the module: its tests step the same game's loop, which numba compiles once and caches on disk
# for the next process (9 CPU s cold); two workers drawing its tests at once each compiled it (8.9 + 8.2 CPU s on a
# fresh clone).
pytestmark = pytest.mark.xdist_group("minatar_compiled")


@pytest.fixture(autouse=True)
def compiled_from_the_first_step(monkeypatch):
    monkeypatch.setenv(_jit.JIT_AFTER_ENV_VAR, "0")
    monkeypatch.delenv(_jit.JIT_ENV_VAR, raising=False)


def _pair(name: str, monkeypatch, **kwargs) -> tuple[MinAtarEnv, MinAtarEnv]:
    """A compiled env and a torch one, same settings."""
    compiled = MinAtarEnv(name, autoreset=True, **kwargs)
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "0")
    eager = MinAtarEnv(name, autoreset=True, **kwargs)
    monkeypatch.delenv(_jit.JIT_ENV_VAR)
    return compiled, eager


@needs_numba
@pytest.mark.parametrize("name", COMPILED[:1])
@pytest.mark.compiles  # numba compiles Asterix's loop cold here (13 CPU s), for the module's other tests too
def test_the_compiled_step_is_the_torch_step(name, monkeypatch):
    """Bit for bit, over episodes that end by termination and by truncation, with sticky actions (one in three)."""
    compiled, eager = _pair(name, monkeypatch, n_envs=12, seed=4, max_episode_steps=LIMITS.get(name, 32),
                              sticky_action_prob=0.3)
    assert (compiled.kernel, eager.kernel) == ("jit", "torch")
    assert_same_bits(compiled.reset()[0], eager.reset()[0])
    seen = torch.zeros(3, dtype=torch.bool)
    for t, a in enumerate(biased_actions(compiled.n_actions, 12, 150)):
        got, want = compiled.step(DictTensor({"action": a})), eager.step(DictTensor({"action": a}))
        for (x, ids_x), (y, ids_y) in zip(got, want, strict=True):
            assert_same_bits(x, y)
            assert torch.equal(ids_x, ids_y)
        nxt = want[0][0]
        seen |= torch.stack([nxt["reward"].any(), nxt["terminated"].any(), nxt["truncated"].any()])
        if t % 50 == 49:
            assert_same_bits(compiled.get_state(), eager.get_state())
    # Episodes are truncated, and they end by the game's rules or score (Freeway, which ends by its own clock at
    # 2500 steps only, scores: the step's draws are used).
    assert seen[2] and (seen[1] or seen[0]), seen


@pytest.mark.compiles
@needs_numba
@pytest.mark.parametrize("name", COMPILED[:1])
def test_the_move_after_jit_after_env_steps_continues_the_trajectory(name, monkeypatch):
    monkeypatch.setenv(_jit.JIT_AFTER_ENV_VAR, "40")
    compiled, eager = _pair(name, monkeypatch, n_envs=8, seed=1, max_episode_steps=7)
    compiled.reset(), eager.reset()
    kinds = []
    for a in biased_actions(compiled.n_actions, 8, 12):
        for (x, _), (y, _) in zip(compiled.step(DictTensor({"action": a})), eager.step(DictTensor({"action": a})),
                                  strict=True):
            assert_same_bits(x, y)
        kinds.append(compiled.kernel)
    assert kinds == ["torch"] * 4 + ["jit"] * 8  # 8 env steps a step: the 5th reaches 40
    assert_same_bits(compiled.get_state(), eager.get_state())


@pytest.mark.compiles  # 9 CPU s on a fresh clone (numba's cache is cold), 0.1 after
@needs_numba
@pytest.mark.parametrize("name", COMPILED[:1])
def test_step_into_writes_the_step_and_graph_state_tensors_stay(name, monkeypatch):
    compiled, eager = _pair(name, monkeypatch, n_envs=6, seed=2, max_episode_steps=5)
    assert compiled.writes_in_place() and not eager.writes_in_place()
    compiled.reset(), eager.reset()
    held = compiled.graph_state()
    before = {k: v.clone() for k, v in held.items()}
    for a in biased_actions(compiled.n_actions, 6, 8):
        (nxt, _), (run, _) = eager.step(DictTensor({"action": a}))
        into = [DictTensor({k: torch.empty_like(d[k]) for k in d.keys()}) for d in (nxt, run)]
        compiled.step_into(DictTensor({"action": a}), *into)
        assert_same_bits(into[0], nxt)
        assert_same_bits(into[1], run)
    assert all(torch.equal(v, before[k]) for k, v in held.items())  # a step rebinds the env, it never writes there
    assert_same_bits(compiled.get_state(), eager.get_state())


@needs_numba
def test_rlstruct_jit_0_or_an_episodic_env_keeps_the_torch_step(monkeypatch):
    name = COMPILED[0] if COMPILED else pytest.skip("no game has a compiled step")
    assert MinAtarEnv(name, 2, autoreset=True).kernel == "jit"
    assert MinAtarEnv(name, 2, autoreset=False).kernel == "torch"
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "0")
    assert MinAtarEnv(name, 2, autoreset=True).kernel == "torch"


@pytest.mark.compiles
@needs_numba
def test_the_batcher_collects_the_same_trajectories_through_the_compiled_step(monkeypatch):
    """RL_Batcher calls step_into, which the compiled step writes into the batcher's buffer."""
    from rlstruct import RL_Batcher
    from rlstruct.envs import make_env
    from tests.fakes import CounterAgent
    from tests.helpers import assert_same

    name = COMPILED[0] if COMPILED else pytest.skip("no game has a compiled step")
    env_args = {"name": f"MinAtar/{name}-v1", "n_envs": 4, "backend": "torch", "autoreset": True,
                "max_episode_steps": 6}
    runs = []
    for jit in ("1", "0"):
        monkeypatch.setenv(_jit.JIT_ENV_VAR, jit)
        with RL_Batcher(5, CounterAgent, {}, make_env, env_args, 0, 3, agent_seeds=5) as b:
            b.reset()
            runs.append([])
            for _ in range(3):
                b.execute()
                runs[-1].append(b.get()[0])
    assert bool(runs[0][-1].trajectories["_observation/done"].any())
    for a, b in zip(*runs, strict=True):
        assert_same(a, b)


def test_without_numba_the_torch_step_runs(monkeypatch):
    monkeypatch.setattr(_jit, "_loaded", {})
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    env = MinAtarEnv("Breakout", 3, autoreset=True)
    env.reset()
    env.step(DictTensor({"action": torch.zeros(3, dtype=torch.int64)}))
    assert env.kernel == "torch" and not env.writes_in_place()
