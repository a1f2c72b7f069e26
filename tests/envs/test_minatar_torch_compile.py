"""``MinAtarEnv(compile=True)``: the auto-reset step fused by ``torch.compile``, with the torch step's bits for every
game (frames, rewards, flags, the state) across auto-resets, on every available device, one graph per env; what the
option applies to, through ``make_env`` too; and the CUDA-graph batcher over the fused step.

Inductor generates the code of one game's step here (:data:`INDUCTOR_GAME`, one of the quickest to compile: on a
loaded 2-core machine Seaquest's ran past the test's timeout, 519 s of wall clock): every game's step goes whole
through dynamo and AOT autograd (``backend="aot_eager"``), which is where a graph breaks, recompiles or is
functionalized, and the code inductor writes for the step (the counter-based draws, the auto-reset, a game's rules)
is held to the eager bits on that one game."""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import _jit, make_env
from rlstruct.envs.minatar import GAMES, MinAtarEnv, _env
from tests.conftest import device_params
from tests.envs.minatar_steps import LIMITS, assert_same_bits, biased_actions

NAMES = list(GAMES)
#: the game whose fused step inductor compiles (the others' go through dynamo and AOT autograd only)
INDUCTOR_GAME = "Breakout"


def unique_graphs() -> int:
    """The graphs dynamo has made in this process (imported here, not at collection: importing dynamo takes about
    2 s, which `make quick`, leaving these tests out, would otherwise pay in each worker)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.fixture(autouse=True)
def fresh_compiler():
    # Each game, device and env count compiles a graph of the one auto-reset function, and torch caps the graphs of a
    # function in a process (torch._dynamo.config.recompile_limit): each test starts, and leaves, with none.
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _traced_only(step):
    """``torch.compile`` as ``compile=True`` calls it, but with AOT autograd's eager backend: the same graph capture
    (whole, one per shape) without inductor's code generation."""
    return torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")


@pytest.mark.compiles
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.long(
    reason="inductor's first compile in a process: its start, then the step, 29-37 CPU s on a 2-core machine with "
           "torch's -O3 builds, about 19 with the test session's -O0 (tests/conftest.py's TEST_INDUCTOR_ENV)"))
    if name == INDUCTOR_GAME else name for name in NAMES])
def test_the_compiled_step_is_the_eager_step(name, device, monkeypatch):
    """Bit for bit over 80 steps (past every game's time limit: 32 steps, Breakout's 12, Freeway's 64), episodes
    ending by termination and by truncation, sticky actions one in three (inductor's code for
    :data:`INDUCTOR_GAME`, the graph dynamo captures for every game)."""
    monkeypatch.setenv(_jit.JIT_ENV_VAR, "0")
    if name != INDUCTOR_GAME:
        monkeypatch.setattr(_env, "fused", _traced_only)
    settings = {"n_envs": 8, "seed": 4, "device": device, "autoreset": True, "max_episode_steps": LIMITS.get(name, 32),
                "sticky_action_prob": 0.3}
    compiled, eager = MinAtarEnv(name, compile=True, **settings), MinAtarEnv(name, **settings)
    assert (compiled.kernel, eager.kernel) == ("compiled", "torch")
    assert_same_bits(compiled.reset()[0], eager.reset()[0])
    graphs = unique_graphs()
    seen = torch.zeros(3, dtype=torch.bool)
    for t, a in enumerate(biased_actions(compiled.n_actions, 8, 80)):
        a = a.to(device)
        got, want = compiled.step(DictTensor({"action": a})), eager.step(DictTensor({"action": a}))
        for (x, ids_x), (y, ids_y) in zip(got, want, strict=True):
            assert_same_bits(x, y)
            assert torch.equal(ids_x, ids_y)
        (nxt, _), (run, _) = got
        assert nxt["done"].data_ptr() != run["initial_state"].data_ptr()  # two tensors, as the eager step's
        seen |= torch.stack([nxt["reward"].any(), nxt["terminated"].any(), nxt["truncated"].any()]).cpu()
        if t % 40 == 39:
            assert_same_bits(compiled.get_state(), eager.get_state())
    # Episodes are truncated, and they end by the game's rules or score (Freeway, which ends by its own clock at
    # 2500 steps only, scores: the step's draws are used).
    assert seen[2] and (seen[1] or seen[0]), seen
    # One graph: the state the step returns is the state it was compiled for (no recompilation at the 2nd step).
    assert unique_graphs() == graphs + 1


def test_compile_applies_to_the_auto_reset_step(monkeypatch):
    """What steps with compile=True (nothing here steps, so nothing compiles): an auto-reset env on any device,
    built directly or by make_env; an episodic env steps eagerly; the option comes before numba's CPU step."""
    monkeypatch.setenv(_jit.JIT_AFTER_ENV_VAR, "0")
    env = MinAtarEnv("Breakout", 2, autoreset=True, compile=True)
    assert env.kernel == "compiled" and not env.writes_in_place()
    assert MinAtarEnv("Breakout", 2, autoreset=False, compile=True).kernel == "torch"
    made = make_env("MinAtar/Seaquest-v1", 2, backend="torch", autoreset=True, backend_kwargs={"compile": True})
    assert isinstance(made, MinAtarEnv) and made.kernel == "compiled"


@pytest.mark.cuda
@pytest.mark.compiles
@pytest.mark.long(reason="inductor compiles Breakout's step for the GPU (its Triton kernels) before the capture")
@pytest.mark.timeout(300)
def test_the_cuda_graph_batcher_replays_the_compiled_step():
    """RL_Batcher(cuda_graph=True) captures the compiled step with the agent: the eager batcher's trajectories."""
    from rlstruct import RL_Batcher
    from tests.fakes import CounterAgent
    from tests.helpers import assert_same

    runs = []
    for compile_, cuda_graph in ((False, False), (True, True)):
        env_args = {"name": "MinAtar/Breakout-v1", "n_envs": 32, "backend": "torch", "autoreset": True,
                    "max_episode_steps": 10, "device": "cuda", "backend_kwargs": {"compile": compile_}}
        with RL_Batcher(8, CounterAgent, {"device": "cuda"}, make_env, env_args, 0, 3, agent_seeds=5,
                        device="cuda", cuda_graph=cuda_graph) as b:
            b.reset()
            runs.append([])
            for _ in range(4):  # eager (the compile), captured, replayed twice
                b.execute()
                runs[-1].append(b.get()[0])
    assert bool(runs[0][-1].trajectories["_observation/done"].any())
    for a, b in zip(*runs, strict=True):
        assert_same(a, b)
