"""A saved run travels (a colleague's folder, a paper's results): opening one (``rlstruct eval``, ``export``,
``train --resume``, ``rlstruct.algos.load``) imports only the code it names that is rlstruct's or an installed
package's, unless the user passes ``--trust-code``; a run records the distributions of the modules it names, and
``--resume``, the entry points and a sweep's study tell algorithms and settings apart by their source, not their
name."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from rlstruct.algos import load
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, content_digest
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.registry import (
    ENTRY_POINT_GROUP,
    algorithm,
    check_resume_source,
    check_run_code,
    entry_point_algorithms,
    run_code,
)
from rlstruct.errors import AlgorithmSourceError, ConfigError, UntrustedCodeError
from tests.algos.test_outside_algorithms import forget_mylab, write_myalgo
from tests.helpers import rlstruct_in_process

#: a module that leaves a file behind when it is imported, and offers what each setting names
EVIL = ("from pathlib import Path\nPath({marker!r}).write_text('imported')\nALGORITHM = None\n\n\n"
        "def make(*args, **kwargs):\n    Path({marker!r}).write_text('called')\n")
#: a short evaluation
EPISODES = ["--episodes", "2", "--max-steps", "20"]


@pytest.fixture
def clean_path(monkeypatch):
    """``sys.path`` and the current folder restored after the test (the commands run in this process may append the
    current folder, as the console script does), and no module of the tests' own left imported."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in ("evil", "cwdevil", "this"):
        sys.modules.pop(name, None)
    forget_mylab()


def hostile_run(source: Path, folder: Path, **changes) -> Path:
    """A copy of the run ``source`` in ``folder`` whose checkpoint says what ``changes`` say (``config``: its
    config's settings), its digest recomputed, as an edited run that passes every check of its file would be."""
    folder.mkdir(parents=True)
    data = torch.load(source / CHECKPOINT_NAME, weights_only=True)
    data["config"].update(changes.pop("config", {}))
    data.update(changes)
    data["digest"] = content_digest(data)
    torch.save(data, folder / CHECKPOINT_NAME)
    shutil.copy(source / "config.json", folder / "config.json")
    return folder


#: (setting, value, where its module lies, the refusal's reason)
HOSTILE = {
    "algorithm in the run's folder": (
        "algorithm", "evil:ALGORITHM", "run", r"which lies in the run's folder \(.*evil.py\)"),
    "network in the run's folder": ("network", "evil:make", "run", r"which lies in the run's folder"),
    "env in the run's folder": ("env", "evil:make", "run", r"which lies in the run's folder"),
    "network in the current folder": (
        "network", "cwdevil:make", "cwd", r"which the current folder provides \(.*cwdevil.py\)"),
    "os:system": ("network", "os:system", None, r"which is Python's own \(built into the interpreter\)"),
    "this": ("algorithm", "this:ALGORITHM", None, r"which is Python's own \(its standard library\)"),
}


def _open_with(opener: str, run: Path, capsys) -> None:
    """Opens ``run`` as ``opener`` does; a command's one-line refusal is raised as the error its line names."""
    if opener == "load":
        load(run)
    elif opener == "evaluate_checkpoint":
        evaluate_checkpoint(str(run), episodes=2, max_steps=20)
    else:
        argv = {"eval": ["eval", str(run), *EPISODES], "export": ["export", str(run), "--output", "p.pt"],
                "resume": ["train", "a2c", "--resume", str(run)]}[opener]
        out = rlstruct_in_process(capsys, *argv)
        prog = "rlstruct train a2c" if opener == "resume" else f"rlstruct {opener}"
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith(f"{prog}: error: ")
        raise (ConfigError if "is a run of the algorithm" in out.stderr else UntrustedCodeError)(out.stderr)


@pytest.mark.parametrize("opener", ["load", "evaluate_checkpoint", "eval", "export", "resume"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_run_naming_code_that_is_not_installed_is_refused_before_it_is_imported(
        case, opener, tiny_cartpole_run, tmp_path, monkeypatch, capsys, clean_path):
    field, value, lies_in, reason = HOSTILE[case]
    here, marker = tmp_path / "here", tmp_path / "marker"
    here.mkdir()
    changes = {"config": {field: value}} if field != "algorithm" else {"algorithm": value}
    run = hostile_run(tiny_cartpole_run, tmp_path / "shared-run", **changes)
    module = value.partition(":")[0]
    if lies_in is not None:
        folder = run if lies_in == "run" else here
        (folder / f"{module}.py").write_text(EVIL.format(marker=str(marker)))
        # the worst case: the folder is where Python looks first (python -m run from it, a notebook there)
        monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(here)
    calls = []
    if module == "os":  # imported by everything: its system is watched instead
        monkeypatch.setattr(os, "system", lambda *args: calls.append(args))
    else:
        sys.modules.pop(module, None)
    if opener == "resume" and field == "algorithm":  # the command names the algorithm: the run's is never imported
        reason = rf"is a run of the algorithm {value!r}, got 'a2c', another description named 'a2c'"
        error = ConfigError
    else:
        reason = (rf"{field}={value!r} of the run '.*shared-run' names module {module!r}, {reason}.*"
                  rf"\(this run needs: {field} {module}\): pass --trust-code \(trust_code=True in Python\)")
        error = UntrustedCodeError
    with pytest.raises(error, match=reason):
        _open_with(opener, run, capsys)
    assert not marker.exists() and not calls and (module == "os" or module not in sys.modules)
    assert not (here / "p.pt").exists()


def test_the_console_script_opening_a_run_does_not_search_the_current_folder(tiny_cartpole_run, tmp_path,
                                                                           monkeypatch, capsys, clean_path):
    run = hostile_run(tiny_cartpole_run, tmp_path / "run", config={"network": "evil:make"})
    (run / "evil.py").write_text(EVIL.format(marker=str(tmp_path / "marker")))
    monkeypatch.chdir(run)  # rlstruct eval . from inside the shared folder
    out = rlstruct_in_process(capsys, "eval", ".", *EPISODES)
    assert out.returncode == 2 and "names module 'evil', which is not installed here" in out.stderr
    assert str(run) not in sys.path and "" not in sys.path
    video = rlstruct_in_process(capsys, "eval", ".", "--video", "v.gif")  # refused before a frame is drawn
    assert video.returncode == 2 and "'evil', which is not installed here" in video.stderr
    assert not (run / "v.gif").exists()
    assert not (tmp_path / "marker").exists()
    # the commands that name the user's own module search it; with --trust-code, so does eval
    assert rlstruct_in_process(capsys, "train", "--help").returncode == 0 and str(run) in sys.path


@pytest.fixture
def outside_run(tiny_cartpole_run, tmp_path, monkeypatch, clean_path):
    """``lab/mylab/myalgo.py`` (a copy of A2C named ``myalgo``, of no installed package) and a run of it,
    ``lab/run``; the current folder is ``lab``, not on ``sys.path``, as for the console script run from there."""
    lab = write_myalgo(tmp_path / "lab")
    forget_mylab()
    run = hostile_run(tiny_cartpole_run, lab / "run", algo="myalgo", algorithm="mylab.myalgo:ALGORITHM", code={})
    monkeypatch.chdir(lab)
    return run


def test_trust_code_lets_a_run_of_the_users_own_algorithm_be_evaluated(outside_run, capsys):
    refused = rlstruct_in_process(capsys, "eval", "run", *EPISODES)
    assert refused.returncode == 2 and refused.stderr.startswith(
        "rlstruct eval: error: algorithm='mylab.myalgo:ALGORITHM' of the run 'run' names module 'mylab.myalgo', "
        "which is not installed here;")
    assert "(this run needs: algorithm mylab.myalgo)" in refused.stderr and "mylab" not in sys.modules
    with pytest.raises(UntrustedCodeError, match="pass --trust-code"):
        load("run")
    evaluated = rlstruct_in_process(capsys, "eval", "run", *EPISODES, "--trust-code")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.splitlines()[-1])["algo"] == "myalgo"
    policy = load("run", trust_code=True)
    assert policy.source == "mylab.myalgo:ALGORITHM" and int(policy.predict([0.0, 0.0, 0.0, 0.0])) in (0, 1)


def _install(site: Path, files: dict[str, str], *, name: str = "mylab-algos") -> Path:
    """An installed distribution ``name`` 1.0 in ``site`` (its metadata, as pip writes it) holding ``files``."""
    dist = site / f"{name.replace('-', '_')}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "top_level.txt").write_text("".join(dict.fromkeys(f.split("/")[0] + "\n" for f in files)))
    (dist / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    for file, text in files.items():
        (site / file).parent.mkdir(parents=True, exist_ok=True)
        (site / file).write_text(text)
    return site


NETS = ("from os import system\nfrom subprocess import run as make\n\n\ndef own(spec):\n"
        "    raise RuntimeError('called')\n")


def test_an_installed_packages_run_opens_without_trust_and_records_its_distribution(outside_run, tmp_path,
                                                                                     monkeypatch):
    lab = tmp_path / "lab"
    files = {"mylab/__init__.py": "", "mylab/myalgo.py": (lab / "mylab" / "myalgo.py").read_text(),
             "mylab/nets.py": NETS}
    monkeypatch.syspath_prepend(str(_install(tmp_path / "site", files)))
    shutil.rmtree(lab / "mylab")  # only the installed copy is left
    assert load("run").source == "mylab.myalgo:ALGORITHM"
    assert run_code("mylab.myalgo:ALGORITHM", {"env": "CartPole-v1", "network": "mylab.nets:own"}) == {
        "algorithm": {"source": "mylab.myalgo:ALGORITHM", "module": "mylab.myalgo", "distribution": "mylab-algos",
                      "version": "1.0"},
        "network": {"source": "mylab.nets:own", "module": "mylab.nets", "distribution": "mylab-algos",
                    "version": "1.0"}}
    # What a setting names in an installed package must be a factory of that package, before anything calls it.
    checkpoint = torch.load(Path("run") / CHECKPOINT_NAME, weights_only=True)
    for value, match in (("mylab.nets:system", r"network='mylab.nets:system' names the C function posix.system, not "
                                               r"a factory"),
                         ("mylab.nets:make", r"network='mylab.nets:make' names a callable defined in 'subprocess', "
                                             r"outside the package 'mylab' the setting names")):
        with pytest.raises(UntrustedCodeError, match=match):
            check_run_code({**checkpoint, "config": {**checkpoint["config"], "network": value}}, "run")
    # The same package in the current folder is the folder's, not the installed one's.
    (lab / "mylab").mkdir()
    (lab / "mylab" / "__init__.py").write_text(f"open({str(tmp_path / 'marker')!r}, 'w')\n")
    monkeypatch.syspath_prepend(str(lab))
    forget_mylab()
    with pytest.raises(UntrustedCodeError, match=r"names module 'mylab.myalgo', which the current folder provides"):
        load("run")
    assert not (tmp_path / "marker").exists()


def test_resume_continues_a_run_only_with_the_algorithm_it_recorded(outside_run, tmp_path, capsys, monkeypatch):
    lab = tmp_path / "lab"
    (lab / "mylab" / "other.py").write_text((lab / "mylab" / "myalgo.py").read_text())  # another module, same name
    refused = rlstruct_in_process(capsys, "train", "mylab.other:ALGORITHM", "--resume", "run")
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "rlstruct train myalgo: error: resume='run' is a run of the algorithm 'mylab.myalgo:ALGORITHM', got "
        "'mylab.other:ALGORITHM', another description named 'myalgo'; resume it with rlstruct train "
        "mylab.myalgo:ALGORITHM, or start a new run without --resume"]
    checkpoint = torch.load(Path("run") / CHECKPOINT_NAME, weights_only=True)
    check_resume_source(algorithm("mylab.myalgo:ALGORITHM"), "run", checkpoint)  # its own: no word
    # the same source from another installed package than the one the run recorded
    files = {"mylab/__init__.py": "", "mylab/myalgo.py": (lab / "mylab" / "myalgo.py").read_text()}
    monkeypatch.syspath_prepend(str(_install(tmp_path / "site", files)))
    forget_mylab()
    shutil.rmtree(lab / "mylab")
    recorded = {**checkpoint, "code": {"algorithm": {"source": "mylab.myalgo:ALGORITHM", "module": "mylab.myalgo",
                                                     "distribution": "their-algos", "version": "2.0"}}}
    with pytest.raises(ConfigError, match=r"resume='run' is a run of 'mylab.myalgo:ALGORITHM' from the installed "
                                          r"package 'their-algos', got 'mylab.myalgo:ALGORITHM' from 'mylab-algos'"):
        check_resume_source(algorithm("mylab.myalgo:ALGORITHM"), "run", recorded)


def test_two_installed_entry_points_of_one_name_are_refused_naming_both(monkeypatch):
    from importlib.metadata import EntryPoint

    offered = [EntryPoint(name="twin", value="alab.algo:ALGORITHM", group=ENTRY_POINT_GROUP),
               EntryPoint(name="twin", value="blab.algo:ALGORITHM", group=ENTRY_POINT_GROUP),
               EntryPoint(name="same", value="clab.algo:ALGORITHM", group=ENTRY_POINT_GROUP),
               EntryPoint(name="same", value="clab.algo:ALGORITHM", group=ENTRY_POINT_GROUP)]
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group=None: [ep for ep in offered if ep.group == group])
    with pytest.raises(AlgorithmSourceError, match=r"entry point 'twin' of rlstruct.algorithms is offered 2 times, by "
                                                   r"'alab.algo:ALGORITHM' and 'blab.algo:ALGORITHM'; uninstall all "
                                                   r"but one"):
        algorithm("twin")
    # one value offered twice is one algorithm: what it names is looked for
    with pytest.raises(AlgorithmSourceError, match=r"no module named 'clab' here"):
        algorithm("same")
    assert entry_point_algorithms() == {"twin": "alab.algo:ALGORITHM", "same": "clab.algo:ALGORITHM"}


def test_a_second_sweep_call_with_another_seed_is_refused_naming_both():
    optuna = pytest.importorskip("optuna")
    from rlstruct.algos._train.sweep import SweepPlan, _check_same_flags

    study = optuna.create_study(study_name="s", direction="maximize")
    flags = ("--max-env-steps", "256")
    _check_same_flags(study, SweepPlan("a2c", "CartPole-v1", {}, flags, "sqlite://", "s", "runs/s", 0, None))
    _check_same_flags(study, SweepPlan("a2c", "CartPole-v1", {}, flags, "sqlite://", "s", "runs/s", 0, None))
    with pytest.raises(ConfigError, match=r"study 's' runs its trials with other train flags than this call: --seed 0 "
                                          r"\(the study's\) vs 1 \(this call's\); pass the study's --seed and its "
                                          r"flags after --"):
        _check_same_flags(study, SweepPlan("a2c", "CartPole-v1", {}, flags, "sqlite://", "s", "runs/s", 1, None))


def test_a_run_records_the_modules_it_imports_and_their_distributions(tiny_cartpole_run):
    recorded = {"algorithm": {"source": "a2c", "module": "rlstruct.algos.a2c", "distribution": "rlstruct",
                              "version": __import__("rlstruct").__version__}}
    assert json.loads((tiny_cartpole_run / "config.json").read_text())["code"] == recorded
    assert torch.load(tiny_cartpole_run / CHECKPOINT_NAME, weights_only=True)["code"] == recorded
    assert run_code("ppo", {"env": "lab.sims:Maze-v0", "network": "nolab:make"})["env"] == {
        "source": "lab.sims:Maze-v0", "module": "lab.sims", "distribution": None, "version": None}
    assert os.fspath(tiny_cartpole_run)  # read, never written
