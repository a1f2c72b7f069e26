"""Every ``rlstruct ...`` command in the README and the documentation runs as written (at a reduced budget), in the
order a reader meets them, and every return the text promises is covered by a learning test or benchmark suite.

The commands run in one temporary folder (relative log folders such as ``runs/ppo`` land there, so that
``rlstruct eval runs/ppo`` finds what the command before it trained). A training command gets flags appended that
cap its budget, its evaluations and an off-policy run's learning start and, where the text leaves it to a preset, its
rollout's length and its envs' random start steps (the last of a repeated flag wins, so they override the text's);
nothing else is changed.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The commands run in reading order in one folder (an eval reads the run a train wrote): one xdist worker runs them.
pytestmark = pytest.mark.xdist_group("doc_commands")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: appended to every ``rlstruct train``: a few hundred env steps, short evaluations (a final one of two episodes, where
#: a page's 150 cost 2.5 CPU s), no bar, no events; the time limit only ends a command that outgrows its cap, with room
#: for a loaded machine (the test's timeout is 300 s)
CAP = ["--max-env-steps", "256", "--time-limit", "240", "--no-progress", "--no-tensorboard", "--n-evaluation-envs",
       "2", "--evaluation-max-steps", "20", "--eval-every", "1000", "--final-evaluation-episodes", "2"]
#: and to a new on-policy run (its iteration of at least :data:`MIN_ROLLOUT` steps an env is the whole run for most
#: pages' env counts): half the budget, so that Atari's 8 envs collect 16 frames each, not 32, for the network's update
CAP_ON_POLICY = ["--max-env-steps", "128"]
#: and to the off-policy ones: learn in the iteration that reaches the budget, and in it only (a buffer counts as
#: filled once an iteration's collection brings it to ``learning_starts``, and the run goes on until its env steps
#: reach the budget, so exactly its last iteration makes its gradient steps): the gradient steps are most of such a
#: run's CPU seconds (DQN's Atari preset takes 8 an iteration of 32 env steps, SAC's and TD3's MuJoCo presets one an
#: env step), and what the command proves (its flags, preset, env and network, an update, the run folder) does not
#: depend on how many ran
CAP_REPLAY = ["--learning-starts", CAP[CAP.index("--max-env-steps") + 1]]
#: appended to every ``rlstruct eval``: two short episodes (its default 16 build 16 envs: 16 Atari emulators)
CAP_EVAL = ["--max-steps", "20", "--episodes", "2"]
#: the steps an env of an on-policy run's iteration at least, where :func:`_capped_rollout` shortens the rollout
MIN_ROLLOUT = 8
#: the most random start steps (``env_kwargs["random_start_steps"]``, a MinAtar preset's 2,500) a training env plays
#: here before the run's first step: 128 envs x 2,500 batched random steps cost 18 CPU s, and on a loaded machine
#: outran the run's --time-limit before its first iteration; a few still take the random-start path
RANDOM_START_STEPS = 8
#: appended to ``rlstruct profile`` and ``rlstruct autotune``: a couple of short acquisitions (of at most
#: :data:`PROFILE_ENVS` envs a worker: a page's 16,384 would learn from 131k env steps a PPO update, and the profile's
#: table reads the same at any count), and autotune's sweep cut to two env counts a process count (each configuration
#: starts its own worker processes; what the sweep finds is tests/batchers/test_autotune.py's to check, the command's
#: output is this test's)
CAP_PROFILE = ["--iterations", "2", "--n-timesteps", "8"]
#: the most envs a worker of ``rlstruct profile`` steps here
PROFILE_ENVS = 1024
CAP_AUTOTUNE = ["--iters", "1", "--n-timesteps", "8", "--min-envs", "16", "--max-envs", "32"]
#: placeholders that a reader replaces: such a line is a template, not a command
PLACEHOLDER = re.compile(r"(?<![\w-])(ALGO|ID|RUN|DIR|CHECKPOINT|S|N|K|PATH)(?![\w-])|\.\.\.")
#: (reason, test) for what this machine cannot run here: a GPU, or a JAX backend whose compile dominates
SKIP = [
    (re.compile(r"cuda"), "needs a CUDA GPU (tests marked cuda cover it)"),
    (re.compile(r"--backend (mjx|brax)"), "a JAX backend compiles for minutes here; tests/envs/test_mujoco.py and "
                                          "tests/envs/test_brax.py train through it"),
    (re.compile(r"--compile-policy"), "torch.compile builds C++ kernels for minutes on a CPU; "
                                      "tests/algos/test_fast_path.py compiles the policy step"),
]
#: (algorithm, env) -> the learning test or benchmark suite that backs a return a page promises for it
COVERED = {
    ("ppo", "CartPole-v1"): "tests/algos/test_ppo.py",
    ("a2c", "CartPole-v1"): "tests/algos/test_learning.py::test_a2c_learns_cartpole",
    ("sac", "Pendulum-v1"): "tests/algos/test_sac.py::test_sac_learns_pendulum",
    ("ppo", "inverted_pendulum"): "tests/envs/test_brax.py::test_ppo_learns_brax_inverted_pendulum",
}


def documented_commands() -> list[tuple[str, str, str]]:
    """``(page, command, comment)`` for every line of a fenced block that runs ``rlstruct``, in reading order."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```[\w-]*\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if line.split(maxsplit=1)[:1] not in (["rlstruct"], [".venv/bin/rlstruct"]):
                    continue  # output shown beside the commands is no shell line (an apostrophe in a message)
                words = shlex.split(line, comments=True)
                if words:
                    comment = line.partition(" #")[2].strip()
                    found.append((str(page.relative_to(ROOT)), shlex.join(words), comment))
    return found


COMMANDS = documented_commands()


def test_the_pages_hold_commands_and_the_reader_order_trains_before_it_evaluates():
    assert len(COMMANDS) >= 30
    trained: set[str] = set()
    for _, command, _ in COMMANDS:
        argv = shlex.split(command)
        if argv[1] == "train" and "--logdir" in argv:
            trained.add(argv[argv.index("--logdir") + 1])
        if argv[1] == "eval":
            assert Path(argv[2]).parts[:2] in {Path(t).parts[:2] for t in trained}, f"{command} evaluates an " \
                                                                                    "untrained run"


def _promised_return(comment: str) -> bool:
    """A comment that says what a run reaches: "-200 in 4k-6k env steps", "1,000 within ~30k", "reward threshold"."""
    return bool(re.search(r"-?\d[\d,]* (in|within) ", comment)) or "reward threshold" in comment


def test_every_promised_return_is_covered_by_a_learning_test_or_suite():
    from benchmarks.learning import SUITES
    from rlstruct.algos._train.presets import find_preset

    for page, command, comment in COMMANDS:
        argv = shlex.split(command)
        if argv[1] != "train" or not _promised_return(comment):
            continue
        algo, env = argv[2], argv[argv.index("--env") + 1] if "--env" in argv else "CartPole-v1"
        backed = COVERED.get((algo, env)) or next((s.name for s in SUITES if (s.algo, s.env) == (algo, env)), None)
        preset = find_preset(algo, env)
        assert backed or (preset and preset.benchmark), f"{page}: `{command}` promises {comment!r}, but no learning " \
                                                        "test or suite covers it: add one to COVERED or to SUITES"
        if backed and backed.startswith("tests/"):
            file, _, name = backed.partition("::")
            assert (ROOT / file).exists() and (not name or f"def {name}(" in (ROOT / file).read_text()), backed


def _without_logdir(command: str) -> str:
    argv = shlex.split(command)
    if "--logdir" in argv:
        del argv[argv.index("--logdir"):argv.index("--logdir") + 2]
    return shlex.join(argv)


#: the commands a page also shows with a --logdir of their own: the run into the default folder, which no later command
#: reads, proves nothing that the run into the named folder does not (each distinct flag and the default folder are
#: still run), and would pay the same training again (PPO on Atari: 11 CPU s)
WITH_A_LOGDIR = {_without_logdir(command) for _, command, _ in COMMANDS if "--logdir" in shlex.split(command)}
#: each distinct command once, where the reader first meets it
DISTINCT = [entry for entry in
            list({command: (page, command, comment) for page, command, comment in reversed(COMMANDS)}.values())[::-1]
            if entry[1] not in WITH_A_LOGDIR]


#: (a word a command holds, a module that command needs, the extra that installs it)
NEEDS = [("ALE/", "ale_py", "atari"), ("MinAtar/", "minatar", "minatar"), ("Hopper", "mujoco", "mujoco"),
         ("HalfCheetah", "mujoco", "mujoco"), ("LunarLander", "Box2D", "box2d"), ("--video", "imageio", "video"),
         ("--video", "pygame", "video"), ("mlflow", "mlflow", "mlflow"), ("export", "onnxscript", "export"),
         ("sweep", "optuna", "sweep"), ("compare", "scipy", "stats"), ("report", "scipy", "stats"),
         ("report", "matplotlib", "plot"), ("--curves", "matplotlib", "plot"), ("record", "minari", "datasets"),
         ("record", "h5py", "datasets")]
#: the log folder of each documented run whose training was skipped -> the extra it needs
SKIPPED_RUNS: dict[str, str] = {}


def _missing_extra(argv: list[str]) -> str | None:
    """The extra that a command needs and this install lacks (named as pip takes it), else None: a run's own extra,
    the plot extra of profile's and autotune's default PNG, or the extra of the run an eval or a resume reads."""
    needs = [(module, extra) for word, module, extra in NEEDS if any(a.startswith(word) for a in argv)]
    if argv[1] in ("profile", "autotune") and "--png" not in argv:
        needs.append(("matplotlib", "plot"))
    for module, extra in needs:
        if importlib.util.find_spec(module) is None:
            if argv[1] == "train" and "--logdir" in argv:
                SKIPPED_RUNS[argv[argv.index("--logdir") + 1]] = extra
            return extra
    reads = [argv[2]] if argv[1] == "eval" else [argv[argv.index("--resume") + 1]] if "--resume" in argv else []
    return next((extra for run, extra in SKIPPED_RUNS.items() for path in reads
                 if Path(path).parts[:2] == Path(run).parts[:2]), None)


def _marks(command: str) -> list[pytest.MarkDecorator]:
    """``long`` for the commands whose work is set by a time rather than a size: ``autotune`` measures every
    configuration for a fixed time, with its worker processes busy throughout, so its CPU seconds grow with the
    machine's speed and load (12-48 CPU s measured on one 2-core machine before :data:`CAP_AUTOTUNE` cut its sweep
    to two env counts, 7 after)."""
    if shlex.split(command)[1:2] == ["autotune"]:
        return [pytest.mark.long(reason="autotune measures each configuration for a fixed time (7-48 CPU s)")]
    return []


def _capped_rollout(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """``--n-steps`` for an on-policy training command (``argv``, its budget capped) whose one iteration would take
    more env steps than the budget: its ``n_envs x n_steps``, the text's or its preset's as ``--show-config`` gives
    them (128 envs x 32 steps of MinAtar, 8 x 128 Atari frames), cut to the budget's (at least :data:`MIN_ROLLOUT`
    steps an env); and ``--env-kwargs`` with its ``random_start_steps`` cut to :data:`RANDOM_START_STEPS` where the
    command's settings start the envs further out of step (the other keyword arguments as shown). A run makes one
    iteration at least; what the command proves (its flags, preset, env and network, an update, the run folder) does
    not depend on the rollout's length or on how far the envs start out of step."""
    from rlstruct.algos._train import cli

    capsys.readouterr()
    assert cli.main([*argv[1:], "--show-config"]) in (0, None)
    shown_text = capsys.readouterr().out
    shown = dict(re.findall(r"^--(n-envs|n-steps|max-env-steps)\s+(\d+)", shown_text, re.M))
    n_envs, n_steps, budget = (int(shown[k]) for k in ("n-envs", "n-steps", "max-env-steps"))
    capped = max(MIN_ROLLOUT, -(-budget // n_envs))
    extra = ["--n-steps", str(capped)] if capped < n_steps else []
    env_kwargs = re.search(r"^--env-kwargs\s+(\{.*\})\s", shown_text, re.M)
    kwargs = json.loads(env_kwargs.group(1)) if env_kwargs else {}
    if kwargs.get("random_start_steps", 0) > RANDOM_START_STEPS:
        extra += ["--env-kwargs", json.dumps({**kwargs, "random_start_steps": RANDOM_START_STEPS})]
    return extra


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reader")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page, command", [pytest.param(p, c, marks=_marks(c)) for p, c, _ in DISTINCT],
                         ids=[f"{i:02d}-{' '.join(shlex.split(c)[1:4])}" for i, (_, c, _) in enumerate(DISTINCT)])
def test_documented_command_runs_as_written(page, command, workdir, monkeypatch, capsys):
    # Through the console script's own entry point, in this process (each command would spend two seconds importing
    # torch in a fresh one); worker processes, signals and files are the command's as in a shell.
    from rlstruct.algos._train import cli

    for pattern, reason in SKIP:
        if pattern.search(command):
            pytest.skip(f"{page}: {reason}")
    argv = shlex.split(command)
    if missing := _missing_extra(argv):
        pytest.skip(f"{page}: needs the {missing} extra (pip install 'rlstruct[{missing}]')")
    if argv[1] == "train" and "--show-config" not in argv:
        argv += CAP + (CAP_REPLAY if argv[2] in ("dqn", "sac", "td3") else [])
        if argv[2] in ("ppo", "a2c", "pqn") and "--resume" not in argv:
            argv += CAP_ON_POLICY
            argv += _capped_rollout(argv, capsys)
    if argv[1] == "eval":
        argv += CAP_EVAL
    argv += {"profile": CAP_PROFILE, "autotune": CAP_AUTOTUNE}.get(argv[1], [])
    if argv[1] == "profile" and "--n-envs" in argv and int(argv[argv.index("--n-envs") + 1]) > PROFILE_ENVS:
        argv += ["--n-envs", str(PROFILE_ENVS)]
    if argv[1] == "sweep":  # one capped trial; the flags after -- are its run's
        cut = argv.index("--") if "--" in argv else len(argv)
        argv = [*argv[:cut], "--trials", "1", "--", *argv[cut + 1:], *CAP]
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(workdir / "minari"))  # rlstruct record's datasets
    # The extending page's own algorithm (tutorials/mylab) is importable as its reader makes it: on PYTHONPATH.
    monkeypatch.syspath_prepend(str(ROOT / "tutorials"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "tutorials"),
                                                                   os.environ.get("PYTHONPATH")])))
    try:
        status = cli.main(argv[1:])
    finally:  # the tutorials' mylab is not left imported for the tests that write their own
        for name in [name for name in sys.modules if name == "mylab" or name.startswith("mylab.")]:
            del sys.modules[name]
    out = capsys.readouterr()
    assert status == 0, f"{page}: `{command}` exited with {status}:\n{out.err[-2000:]}"
    if argv[1] == "train" and "--show-config" not in argv and "--resume" not in argv:
        summary = json.loads(out.out.strip().splitlines()[-1])
        for run in summary.get("members", [summary]):  # a population (--seeds): each member's summary
            assert run["iterations"] >= 1 and run["env_steps"] >= 1, f"{page}: `{command}` did not train"
            if argv[2] in ("dqn", "sac", "td3"):  # :data:`CAP_REPLAY`'s learning starts left it an update
                with open(workdir / run["logdir"] / "progress.csv", newline="") as f:
                    losses = [v for row in csv.DictReader(f) for k, v in row.items() if k.startswith("loss/") and v]
                assert losses, f"{page}: `{command}` made no gradient step within its capped budget"
