"""The concepts pages' whole programs run (those that start worker processes as scripts, in a process started as a
fresh interpreter, so that the workers start as they would for a reader), and what the pages say about worker
processes, weights and threads holds."""

from __future__ import annotations

import importlib
import os
import re
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rlstruct
from rlstruct import DictTensor, RL_Agent
from rlstruct.algos import RunConfig
from tests.helpers import ForkedCommand, torch_threads
from tests.project.forked_runs import forkable

ROOT = Path(__file__).resolve().parents[2]
CONCEPTS = ROOT / "docs" / "concepts"
# The pages whose programs run as scripts (envs.md's run in-process: tests/project/test_readme.py).
SCRIPT_PAGES = ["agents.md", "acquisition.md"]


def _programs(page: str) -> list[str]:
    """The page's python blocks that are whole programs (they start with an import; the others are fragments)."""
    blocks = re.findall(r"```python\n(.*?)```", (CONCEPTS / page).read_text(), flags=re.S)
    return [b for b in blocks if b.startswith(("import ", "from "))]


def _run_script(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python example.py`` (``code``) in ``tmp_path``: its status and output. Run as ``__main__`` in a child forked
    from this process and started as a fresh one (``tests.helpers.ForkedCommand``), the script's folder first on
    ``sys.path``: its workers start as a reader's do (a fork server of its own, or spawned interpreters, each
    importing the script again as ``__mp_main__``), where a fresh interpreter would first import torch and rlstruct
    again (2-3 CPU s). A fresh interpreter where a fork would not start as one (:func:`forkable`)."""
    script = tmp_path / "example.py"
    script.write_text(code)
    if not forkable():
        return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=240)

    def as_a_script() -> int:
        os.chdir(tmp_path)
        sys.argv = [str(script)]
        sys.path.insert(0, str(tmp_path))
        runpy.run_path(str(script), run_name="__main__")
        return 0

    return ForkedCommand([], tmp_path / "example", call=as_a_script).completed([sys.executable, str(script)], 240)


def _starts_workers(code: str) -> bool:
    """Whether a program may start worker processes: it has a ``__main__`` guard, or a batcher without
    ``n_processes=0``."""
    return 'if __name__ == "__main__":' in code or "RL_Batcher(" in code and not re.search(r"n_processes=0\b", code)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", SCRIPT_PAGES)
def test_concepts_programs_run_as_scripts(page, tmp_path, monkeypatch):
    """A program that starts worker processes runs as a script (:func:`_run_script`), as a reader's would; one that
    steps its envs in its own process runs in this one, as ``__main__`` in a namespace of its own (a fresh interpreter
    would spend 2-3 CPU s importing torch to run the same code)."""
    programs = _programs(page)
    assert programs, f"docs/concepts/{page} has no whole program"
    monkeypatch.chdir(tmp_path)
    for code in programs:
        if not _starts_workers(code):
            with torch_threads(torch.get_num_threads()):  # restored, should a program set its own
                exec(compile(code, f"docs/concepts/{page}", "exec"), {"__name__": "__main__"})
            continue
        result = _run_script(code, tmp_path)
        assert result.returncode == 0, f"{page}: a program failed:\n{code}\n{result.stderr[-3000:]}"


def _worker_script() -> str:
    (code,) = [p for p in _programs("agents.md") if 'if __name__ == "__main__":' in p]
    return code


def test_the_worker_example_sends_weights_to_worker_processes_under_the_guard():
    code = _worker_script()
    assert "n_processes=2" in code and "batcher.update(cpu_state_dict(learner))" in code
    assert "def update(self, state_dict)" in code and "torch.set_num_threads(1)" in code


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_the_guard_the_workers_fail_and_the_error_names_the_guard(tmp_path):
    # The agents page's script with its guarded block moved to the top level, as a reader might write it first.
    head, body = _worker_script().split('if __name__ == "__main__":\n', 1)
    result = _run_script(head + textwrap.dedent(body), tmp_path)
    assert result.returncode != 0
    assert "bootstrapping phase" in result.stderr  # what each worker reports, as the page quotes it
    assert "BatcherWorkerError" in result.stderr and "if __name__ == '__main__'" in result.stderr


def test_the_default_update_refuses_weights_naming_the_fix():
    class Random(RL_Agent):
        def __call__(self, state, observation, agent_info, history=None):
            return DictTensor({"action": observation["frame"][:, 0].long()}), state

    with pytest.raises(NotImplementedError, match=r"Random must implement update\(state_dict\)"):
        Random().update({})


def test_the_named_helpers_exist_where_the_pages_say():
    assert rlstruct.cpu_state_dict is rlstruct.devices.cpu_state_dict
    weights = rlstruct.cpu_state_dict(torch.nn.Linear(2, 1))
    assert sorted(weights) == ["bias", "weight"] and all(w.device.type == "cpu" for w in weights.values())
    assert RunConfig().torch_threads == 1  # what rlstruct train sets the learner to, unless --torch-threads
    assert RL_Agent().require_history() is False


@pytest.mark.parametrize("page", ["agents.md", "acquisition.md", "envs.md"])
def test_dotted_names_on_the_pages_resolve(page):
    names = set(re.findall(r"`(rlstruct(?:\.\w+)+)", (CONCEPTS / page).read_text()))
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"{page} names {name}, which does not exist"
                obj = getattr(obj, attr)
            break
