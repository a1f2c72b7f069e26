"""A MinAtar game's rules are one text: the games written for both steps have one rules module in their folder, the
torch step runs its functions as they are and the compiled CPU step compiles those functions' own code (with the
scalar operations bound in their globals), and an edit of that text names a new compiled loop (numba's disk cache
never serves a loop compiled from the old text). The two steps' bitwise equality is test_minatar_kernels.py's and
test_minatar_compiled.py's."""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest

from rlstruct.envs.minatar import GAMES, _batched

pytest.importorskip("numba", reason="numba is not installed (rlstruct[fast])")

#: The games whose rules are written once, for both steps: all five.
ONE_TEXT = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def _rules(name: str) -> types.ModuleType:
    return importlib.import_module(f"rlstruct.envs.minatar._{name}.rules")


def test_every_game_is_written_once():
    assert {minatar for minatar, _ in GAMES.values()} == set(ONE_TEXT)
    assert all(hasattr(_rules(name), "STATE_KEYS") for name in ONE_TEXT)


def test_no_game_folder_holds_a_kernel_module():
    folders = Path(_rules("breakout").__file__).parent.parent
    assert sorted(p.parent.name for p in folders.glob("_*/kernel.py")) == []


@pytest.mark.parametrize("name", ONE_TEXT)
def test_the_game_folder_holds_one_rules_source(name):
    folder = Path(_rules(name).__file__).parent
    assert sorted(p.name for p in folder.glob("*.py")) == ["__init__.py", "rules.py"]


@pytest.mark.parametrize("name", ONE_TEXT)
def test_both_steps_run_the_rules_functions_code(name):
    from rlstruct.envs.minatar import _scalar

    rules = _rules(name)
    assert isinstance(rules.GAME, _batched.RulesGame)
    assert (rules.GAME._reset, rules.GAME._step, rules.GAME._observe) == (rules.reset, rules.step, rules.observe)
    compiled = _scalar.kernels(rules)
    own = {k: v for k, v in vars(rules).items() if isinstance(v, types.FunctionType) and v.__module__ == rules.__name__}
    assert {"reset", "step", "observe"} <= set(own) and set(compiled.functions) == set(own)
    for fn_name, fn in own.items():
        copy = compiled.functions[fn_name].py_func
        assert copy.__code__ is fn.__code__, fn_name
        assert copy.__globals__["where"] is _scalar.where and fn.__globals__["where"] is _batched.where


@pytest.mark.parametrize("name", ONE_TEXT)
def test_the_compiled_loop_is_named_by_the_rules_text(name, monkeypatch):
    from rlstruct.envs.minatar import _jit_driver, _scalar

    rules = _rules(name)
    assert Path(rules.__file__) in _scalar.kernels(rules).sources
    monkeypatch.setattr(_jit_driver, "_LOOPS", {})
    monkeypatch.setattr(_jit_driver, "_jit", lambda fn: fn)  # the loop's name only: nothing compiled
    before = _jit_driver.autoreset(name).__qualname__
    text = Path(rules.__file__).read_bytes()
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",
                        lambda p: text + b"\n# edited\n" if p == Path(rules.__file__) else real_read(p))
    monkeypatch.setattr(_jit_driver, "_LOOPS", {})
    after = _jit_driver.autoreset(name).__qualname__
    assert before.startswith(f"autoreset_{name}_") and after != before
