"""Algorithms from outside the package: ``rlstruct train MODULE:ATTRIBUTE``, the ``rlstruct.algorithms`` entry-point
group, the source a run records, and the commands that rebuild a run in another process (eval, export, load, resume,
compare, sweep), each refusing in one line what cannot be had."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlstruct.algos._train.registry import ENTRY_POINT_GROUP, algorithm, algorithm_source, entry_point_algorithms
from rlstruct.errors import AlgorithmSourceError
from tests.helpers import ForkedCommand, rlstruct_in_process

ROOT = Path(__file__).resolve().parents[2]
RLSTRUCT = Path(sys.executable).parent / "rlstruct"  # the console script: its sys.path lacks the folder it runs from
#: four iterations of 32 env steps, an evaluation of two short episodes after each
TINY = ["--max-env-steps", "128", "--n-envs", "4", "--n-steps", "8", "--eval-every", "1", "--n-evaluation-envs", "2",
        "--evaluation-max-steps", "20", "--no-progress", "--no-tensorboard", "--time-limit", "120", "--preset", "none"]


def write_myalgo(folder: Path, name: str = "myalgo") -> Path:
    """``folder/mylab/myalgo.py``: a copy of the built-in A2C module whose description is named ``name`` and whose
    ``__main__`` passes its own description; returns ``folder``."""
    package = folder / "mylab"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    source = (ROOT / "algos" / "a2c.py").read_text()
    assert 'name="a2c"' in source and 'main("a2c")' in source
    (package / "myalgo.py").write_text(source.replace('name="a2c"', f'name="{name}"').replace('main("a2c")',
                                                                                            "main(ALGORITHM)"))
    return folder


@pytest.fixture
def mylab(tmp_path, monkeypatch):
    """A folder holding ``mylab.myalgo``, on ``sys.path``; any ``mylab`` imported before (the tutorials' own, by the
    documented-commands test in the same worker) is forgotten first, and this one afterwards."""
    forget_mylab()
    monkeypatch.syspath_prepend(str(write_myalgo(tmp_path / "lab")))
    yield tmp_path / "lab"
    forget_mylab()


def forget_mylab() -> None:
    for name in [name for name in sys.modules if name == "mylab" or name.startswith("mylab.")]:
        del sys.modules[name]


def test_module_attribute_names_an_algorithm_and_a_run_records_it_by_that_source(mylab):
    found = algorithm("mylab.myalgo:ALGORITHM")
    assert found.name == "myalgo" and found.title == "A2C"
    assert algorithm_source(found) == "mylab.myalgo:ALGORITHM"
    assert algorithm_source(algorithm("a2c")) == "a2c"
    assert algorithm("rlstruct.algos.a2c:ALGORITHM") is algorithm("a2c")  # a built-in's own module is no clash


def test_an_algorithm_defined_in_main_trains_with_a_warning_that_no_other_process_can_open_its_run(
        monkeypatch, caplog):
    import dataclasses
    import types

    from rlstruct.algos import a2c

    config_cls = type("CellConfig", (a2c.A2CConfig,), {"__module__": "__main__"})
    cell = dataclasses.replace(a2c.ALGORITHM, name="cell", config_cls=config_cls)
    notebook = types.ModuleType("__main__")  # a notebook's or a script's: no import name (no __spec__)
    notebook.CELL = cell
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    with caplog.at_level("WARNING", logger="rlstruct.algos._train.registry"):
        assert algorithm_source(cell) == "__main__:CELL"
    assert "the algorithm 'cell' is defined in __main__ (a notebook cell, or a script run as a file): this run " \
           "trains, but rlstruct eval, export and train --resume, in another process, cannot import it" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlstruct.algos._train.registry"):
        algorithm_source(a2c.ALGORITHM)
    assert caplog.text == ""


def test_what_cannot_be_had_is_refused_in_one_line_naming_it(mylab):
    (mylab / "mylab" / "broken.py").write_text("raise RuntimeError('no GPU driver here')\n")
    (mylab / "mylab" / "clash.py").write_text(
        "import dataclasses\nfrom rlstruct.algos import a2c\n"
        "ALGORITHM = dataclasses.replace(a2c.ALGORITHM, title='mine')\nNUMBER = 3\n")
    cases = {
        "nolab.myalgo:ALGORITHM": r"algorithm 'nolab.myalgo:ALGORITHM': no module named 'nolab' here; run from the "
                                  r"folder that holds it",
        "mylab.nothere:ALGORITHM": r"no module named 'mylab.nothere'",
        "mylab.broken:ALGORITHM": r"module 'mylab.broken' does not import: RuntimeError: no GPU driver here",
        "mylab.myalgo:NOPE": r"module 'mylab.myalgo' has no attribute 'NOPE'; name the module's algorithm description",
        "mylab.clash:NUMBER": r"'mylab.clash:NUMBER' is a int, not an algorithm description",
        "mylab.clash:ALGORITHM": r"is named 'a2c', the name of the built-in algorithm rlstruct.algos.a2c; give its "
                                 r"description another name",
        "__main__:ALGORITHM": r"was defined in a script run as __main__, which another process cannot import",
        "mylab.myalgo:": r"must be MODULE:ATTRIBUTE \(e.g. mylab.myalgo:ALGORITHM\)",
        "ppo2": r"unknown algorithm 'ppo2'; expected one of \['reinforce', .*\], or MODULE:ATTRIBUTE",
    }
    for source, message in cases.items():
        with pytest.raises(AlgorithmSourceError, match=message):
            algorithm(source)


def test_the_command_refuses_in_one_line_and_its_help_lists_the_installed_algorithms(mylab, tmp_path, capsys,
                                                                                      monkeypatch):
    out = rlstruct_in_process(capsys, "train", "nolab.x:ALGORITHM", "--env", "CartPole-v1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("rlstruct train: error: algorithm 'nolab.x:ALGORITHM': no module named 'nolab'")
    # An installed package's entry point, read from its metadata: listed by --help, trained by its name.
    dist = tmp_path / "site" / "mylab_algos-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab-algos\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmyalgo = mylab.myalgo:ALGORITHM\n"
                                           "misnamed = mylab.myalgo:ALGORITHM\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert entry_point_algorithms() == {"myalgo": "mylab.myalgo:ALGORITHM", "misnamed": "mylab.myalgo:ALGORITHM"}
    helped = rlstruct_in_process(capsys, "train", "--help")
    assert helped.returncode == 0
    assert "myalgo       mylab.myalgo:ALGORITHM" in helped.stdout and "MODULE:ATTRIBUTE" in helped.stdout
    assert algorithm("myalgo") is algorithm("mylab.myalgo:ALGORITHM")
    with pytest.raises(AlgorithmSourceError, match=r"entry point 'misnamed' of rlstruct.algorithms names "
                                                   r"'mylab.myalgo:ALGORITHM', whose name is 'myalgo'"):
        algorithm("misnamed")
    shown = rlstruct_in_process(capsys, "train", "myalgo", "--env", "CartPole-v1", "--show-config")
    assert shown.returncode == 0 and "rlstruct train myalgo --env CartPole-v1" in shown.stdout


def _run(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """A fresh process running ``args`` in ``cwd``, with an environment that names no folder of the test's."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([*args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


#: eval, then export, of the run in the current folder through the command's code, in an interpreter started with
#: ``-P`` (a console script's ``sys.path``: no current folder), ``mylab`` forgotten and ``sys.path`` restored after
#: each; then ``load().predict`` with the current folder first on ``sys.path``, as ``python -c`` has it
OPEN_THE_RUN = """
import sys
from rlstruct.algos import load
from rlstruct.algos._train.cli import main
path = list(sys.path)
for argv in (["eval", "run", "--episodes", "2", "--max-steps", "20", "--trust-code"],
             ["export", "run", "--output", "policy.pt", "--trust-code"]):
    print("status", main(argv), flush=True)
    for name in [name for name in sys.modules if name == "mylab" or name.startswith("mylab.")]:
        del sys.modules[name]
    sys.path[:] = path
sys.path.insert(0, "")
p = load("run", trust_code=True)
print(p.source, int(p.predict([0.0, 0.0, 0.0, 0.0])))
"""


def forked(argv: list[str], output: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``rlstruct argv`` in a child forked from this process (:class:`~tests.helpers.ForkedCommand`), run to its end:
    its status and what it printed. Forked from the current folder, with ``mylab`` not imported and ``sys.path``
    lacking that folder, the child imports the run's module by its ``MODULE:ATTRIBUTE`` as a console script does,
    without the seconds a fresh interpreter spends importing torch."""
    child = ForkedCommand(argv, output)
    child.wait(timeout)
    return subprocess.CompletedProcess(["rlstruct", *argv], child.returncode, child.stdout, child.stderr)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_copy_of_a2c_outside_the_package_gets_every_command_in_another_process(tmp_path, capsys, monkeypatch):
    """Every command that imports the run's module does so in a process that never imported it, from a ``sys.path``
    that lacks the current folder. One fresh interpreter, started with ``-P`` (a console script's ``sys.path``),
    proves that the recorded source imports where nothing was imported before: eval, export and ``load().predict``
    in it, the module forgotten between them (:data:`OPEN_THE_RUN`). Training, its resume and a sweep run in
    children forked from this process (:func:`forked`): the same import by the same source, without an interpreter's
    start each. The commands that decide without importing it (eval refused without ``--trust-code``, eval where the
    module is missing, compare) run in this process, from the same folders, with ``mylab`` not imported and
    ``sys.path`` as it was after each."""
    lab = write_myalgo(tmp_path / "lab")
    forget_mylab()
    monkeypatch.setattr(sys, "path", list(sys.path))  # the commands' own search of the current folder is undone
    monkeypatch.chdir(lab)
    trained = forked(["train", "mylab.myalgo:ALGORITHM", "--env", "CartPole-v1", *TINY, "--logdir", "run"],
                     tmp_path / "trained")
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout.splitlines()[-1])["env_steps"] >= 128
    config = json.loads((lab / "run" / "config.json").read_text())
    assert (config["algo"], config["algorithm"]) == ("myalgo", "mylab.myalgo:ALGORITHM")
    assert "mylab" not in sys.modules, "imported by the child only"

    # the run's own module, in the current folder: imported with the user's consent only
    refused = rlstruct_in_process(capsys, "eval", "run", "--episodes", "2")
    assert refused.returncode == 2 and "pass --trust-code" in refused.stderr, refused.stderr
    assert "mylab" not in sys.modules, "refused before importing it"
    opened = _run(sys.executable, "-P", "-c", OPEN_THE_RUN, cwd=lab)
    assert opened.returncode == 0, opened.stderr
    lines = opened.stdout.splitlines()
    assert [line for line in lines if line.startswith("status")] == ["status 0", "status 0"], opened.stdout
    assert [json.loads(line)["algo"] for line in lines if line.startswith("{") and '"episodes"' in line] == ["myalgo"]
    assert (lab / "policy.pt").stat().st_size > 0
    source, action = lines[-1].split()
    assert source == "mylab.myalgo:ALGORITHM" and action in ("0", "1")

    resumed = forked(["train", "mylab.myalgo:ALGORITHM", "--resume", "run", "--max-env-steps", "256"],
                     tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["env_steps"] >= 256

    compared = rlstruct_in_process(capsys, "compare", "run", "--json")
    assert compared.returncode == 0, compared.stderr

    swept = forked(["sweep", "mylab.myalgo:ALGORITHM", "--env", "CartPole-v1", "--trials", "2",
                    "--storage", f"sqlite:///{lab}/sweep.db", "--logdir", "trials", "--", *TINY], tmp_path / "swept")
    assert swept.returncode == 0, swept.stderr
    assert sorted(p.name for p in (lab / "trials").iterdir()) == ["trial-0", "trial-1"]
    assert "rlstruct train mylab.myalgo:ALGORITHM" in swept.stdout
    assert "mylab" not in sys.modules

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    missing = rlstruct_in_process(capsys, "eval", str(lab / "run"), "--episodes", "2", "--trust-code")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no module named 'mylab'" in missing.stderr


def test_the_config_of_an_outside_algorithm_finds_its_description_for_the_package_train(mylab):
    from rlstruct.algos._train.entry import _description

    module = __import__("mylab.myalgo", fromlist=["ALGORITHM"])
    assert _description(module.A2CConfig()) is module.ALGORITHM
    with pytest.raises(TypeError, match="config must be an algorithm's config"):
        _description(object())


def test_profile_runs_an_outside_on_policy_algorithm_and_refuses_an_episodic_one(mylab):
    from rlstruct.algos._train.profile import profile_training

    report = profile_training("CartPole-v1", algo="mylab.myalgo:ALGORITHM", n_envs=8, n_timesteps=4, iterations=2)
    assert report.env_steps == 2 * 8 * 4
    with pytest.raises(ValueError, match=r"algo must collect a fixed number of steps per iteration .* got "
                                         r"'rlstruct.algos.reinforce:ALGORITHM', which collects whole episodes"):
        profile_training(algo="rlstruct.algos.reinforce:ALGORITHM")
