"""What the whole test run is held to, beside each test's own time guard (the root conftest.py registers this
plugin):

- ``--cpu-budget``: the CPU seconds of each kind of test, summed over the run, against the kind's budget
  (:data:`BUDGETS`, in the reference machine's CPU seconds, scaled as the time guard's limits are and by the run's
  load), and the costliest tests listed at the end of the run. A kind over its budget fails the run: the next
  feature pays for its tests by making others cheaper, or by raising a budget in a reviewed change that says why.
- ``--leak-check``: the run leaves nothing behind. Every process the run starts inherits :data:`SESSION_VARIABLE`;
  one that still runs when the run ends (a worker, a Ray node, a ``torchrun`` rank, whatever started it) is named,
  killed, and fails the run, and so does a file left in ``/dev/shm`` that the run created. Every process the run
  starts also has a temp folder of the run's own (``TMPDIR``, one subfolder for each pytest process, see
  :func:`own_temp_folder`): what is left in it at the end (a run's folder made with ``mkdtemp`` and never removed,
  the socket folder of a fork server whose owner was killed) is named with the test that made it, fails the run, and
  is removed with the folder. pytest's own ``tmp_path`` folders stay where they were (``PYTEST_DEBUG_TEMPROOT``).

The Makefile's ``test`` and ``quick`` pass both. The CPU seconds are those the time guard measures (the process's and
its waited-for children's, in the JUnit report's ``cpu_seconds``): unlike the wall clock, they do not grow when other
work shares the CPUs, so neither verdict depends on the load.
"""

from __future__ import annotations

import getpass
import multiprocessing.process
import multiprocessing.util
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
import weakref
from pathlib import Path

import pytest

#: each kind's budget over a whole run, in the reference machine's CPU seconds: what a quiet fresh clone's `make test`
#: took on the slowest VM of the reference kind met so far (2-vCPU AMD EPYC, no GPU, 2026-11-29: 235, 1,299, 492 and
#: 45) and 20% more, since VMs of one kind differ by a quarter in the CPU seconds of the same tests (1,656 to 2,070)
#: where the calibration sees none (docs/benchmarks/test-guard.md); Ray's a third more, since the shared cluster's CPU
#: goes to whichever test reaps it.
#: ``quick`` the tests ``make quick`` runs, ``slow`` the rest up to 30 CPU s each, ``long`` the tests allowed more,
#: ``ray`` those that start or join a Ray cluster
BUDGETS = {"quick": 285.0, "slow": 1560.0, "long": 590.0, "ray": 60.0}
#: the load per core of a quiet run of the suite itself (its two workers and what they start, on two cores): a run
#: under more load than this has its budgets scaled by the ratio (:func:`load_scale`)
SUITE_LOAD_PER_CORE = 1.5
#: the environment variable that marks the processes of one test run
SESSION_VARIABLE = "RLSTRUCT_TEST_SESSION"
#: the environment variable that holds the run's temp folder (``--leak-check``)
TEMP_VARIABLE = "RLSTRUCT_TEST_TEMP"
SHM = Path("/dev/shm")
#: how many of the costliest tests the end of the run lists
TOP = 25
#: seconds the run's own helpers (xdist's workers, multiprocessing's fork servers) get to end after the last test
GRACE_SECONDS = 20.0

_costs: list[tuple[float, str, str]] = []
_loads: list[float] = []
_shm_before = pytest.StashKey[set[str]]()
_failed = pytest.StashKey[list[str]]()
_temp = pytest.StashKey[Path]()


def pytest_addoption(parser):
    parser.addoption("--cpu-budget", action="store_true",
                     help="sum each kind of test's CPU seconds over the run, list the costliest tests, and fail the "
                          "run if a kind goes over its budget (tests/suite_checks.py)")
    parser.addoption("--leak-check", action="store_true",
                     help="fail the run if a process it started still runs at its end, a file it made in /dev/shm "
                          "is left, or an entry of its temp folder is (tests/suite_checks.py)")
    parser.addoption("--leak-grace", type=float, default=GRACE_SECONDS, metavar="SECONDS",
                     help="with --leak-check, how long the run's processes get to end after its last test before "
                          f"one still running is a leak (default {GRACE_SECONDS:g})")


def _controller(config) -> bool:
    """Whether this process runs the session as a whole (xdist's controller, or pytest without xdist)."""
    return not hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)  # after the conftest's session caches are made where they are removed from
def pytest_configure(config):
    if not config.getoption("--leak-check"):
        return
    if _controller(config):
        os.environ[SESSION_VARIABLE] = uuid.uuid4().hex  # the xdist workers and all they start inherit it
        config.stash[_shm_before] = _shm_entries()
        # A short name: Ray's and multiprocessing's sockets live under TMPDIR, within AF_UNIX's 107 bytes.
        os.environ[TEMP_VARIABLE] = tempfile.mkdtemp(prefix="rlt-")
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    if TEMP_VARIABLE in os.environ:
        config.stash[_temp] = own_temp_folder(Path(os.environ[TEMP_VARIABLE]), _process_name(config))


def machine_caches() -> tuple[str, ...]:
    """The entries of the machine's temp folder that are caches meant to outlive a run, which each pytest process's
    temp folder links to: inductor's precompiled headers (``torchinductor_USER``, as torch names it; 163 MB and about
    14 CPU s to build, keyed by the compiler and its flags: built once on a machine, then reused)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user),)


#: files a library keeps in the temp folder for the machine, once, whichever program wrote them first: not a run's
#: leftovers (onnxruntime's telemetry session, ``.ses``: written at its first session where the temp folder has none)
MACHINE_STATE_FILES = frozenset({".ses"})


def _process_name(config) -> str:
    """``main`` for the controller, the xdist worker's id (``gw0``...) for a worker."""
    return getattr(config, "workerinput", {}).get("workerid", "main")


def own_temp_folder(root: Path, name: str) -> Path:
    """``root/name``, made, as this process's temp folder and that of every process it starts from now on
    (``TMPDIR``, and :mod:`tempfile`'s cached one). One folder a pytest process, so that an entry in it is charged to
    the test that process ran when it appeared (:func:`pytest_runtest_protocol`). The :func:`machine_caches` in it
    are links to those of the machine's temp folder (``root``'s parent)."""
    folder = root / name
    folder.mkdir(exist_ok=True)
    for cache in machine_caches():
        (root.parent / cache).mkdir(exist_ok=True)  # a link to a folder that exists: makedirs under it works
        if not (folder / cache).is_symlink():
            (folder / cache).symlink_to(root.parent / cache, target_is_directory=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    return folder


def _tests_file(folder: Path) -> Path:
    """Where the entries that appeared in ``folder`` during a test are written, each beside the test's id."""
    return folder.with_name(f"{folder.name}.tests")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = item.config.stash.get(_temp, None)
    before = set(os.listdir(folder)) if folder is not None else set()
    yield
    if folder is not None:
        new = set(os.listdir(folder)) - before
        if new:
            with _tests_file(folder).open("a") as out:
                out.writelines(f"{name}\t{item.nodeid}\n" for name in sorted(new))


def kind(keywords) -> str:
    """The budget a test's cost counts toward, from its markers."""
    for name in ("ray", "long", "slow"):
        if name in keywords:
            return name
    return "quick"


def pytest_runtest_logreport(report):
    if report.when != "teardown":
        return
    props = dict(report.user_properties)
    if "cpu_seconds" in props:
        _costs.append((float(props["cpu_seconds"]), kind(report.keywords), report.nodeid.split("@")[0]))
        _loads.append(os.getloadavg()[0] / (os.cpu_count() or 1))


def load_scale(loads: list[float]) -> float:
    """How much a run's CPU seconds grew with the load beside it: its mean load per core (sampled as each test ended)
    over :data:`SUITE_LOAD_PER_CORE`, at least 1. Processes that share cores with others spend more CPU seconds on
    the same work (caches, switches), so two CPU burners beside the suite do not fail its budget.

    >>> load_scale([1.2, 1.5, 1.8]), load_scale([3.0, 3.0])
    (1.0, 2.0)
    """
    return max(1.0, sum(loads) / len(loads) / SUITE_LOAD_PER_CORE) if loads else 1.0


def over_budget(costs: list[tuple[float, str, str]], scale: float) -> list[str]:
    """One line a kind of test whose summed CPU seconds in ``costs`` exceed its budget times ``scale``."""
    totals = {k: sum(c for c, k2, _ in costs if k2 == k) for k in BUDGETS}
    return [f"{k} tests took {totals[k]:.0f} CPU s, over their budget of {BUDGETS[k] * scale:.0f}"
            for k in BUDGETS if totals[k] > BUDGETS[k] * scale]


def _scale(config) -> float:
    """The budgets' factor: this CPU's calibration (the time guard's) times the run's load (:func:`load_scale`)."""
    from tests.conftest import _guard_scale

    return _guard_scale(config) * load_scale(_loads)


def pytest_terminal_summary(terminalreporter, config):
    if not (config.getoption("--cpu-budget") and _controller(config)) or not _costs:
        return
    scale = _scale(config)
    write = terminalreporter.write_line
    terminalreporter.section("CPU budget (tests/suite_checks.py)")
    write(f"budgets x {scale:.2f}: this CPU's calibration times the run's load (mean per core "
          f"{sum(_loads) / max(len(_loads), 1):.2f}, {SUITE_LOAD_PER_CORE:g} is the suite's own)")
    write(f"{'kind':<6} {'tests':>6} {'CPU s':>8} {'budget':>8}")
    for k, budget in BUDGETS.items():
        mine = [c for c, k2, _ in _costs if k2 == k]
        write(f"{k:<6} {len(mine):>6} {sum(mine):>8.0f} {budget * scale:>8.0f}")
    write(f"{'all':<6} {len(_costs):>6} {sum(c for c, _, _ in _costs):>8.0f} "
          f"{sum(BUDGETS.values()) * scale:>8.0f}")
    write(f"the {TOP} costliest tests (CPU s, kind):")
    for cost, k, nodeid in sorted(_costs, reverse=True)[:TOP]:
        write(f"{cost:8.2f}  {k:<5}  {nodeid}")
    for line in over_budget(_costs, scale):
        terminalreporter.write_line(f"over budget: {line}", red=True)


@pytest.hookimpl(trylast=True)  # after xdist has ended its workers
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _controller(config):
        return
    failed = []
    if config.getoption("--cpu-budget") and _costs:
        failed += over_budget(_costs, _scale(config))
    if config.getoption("--leak-check") and SESSION_VARIABLE in os.environ:
        failed += leftovers(os.environ[SESSION_VARIABLE], config.stash.get(_shm_before, set()),
                            grace=config.getoption("--leak-grace"))
    if _temp in config.stash:
        close_own_temporary_folders(config.stash[_temp].parent)
        failed += temp_leftovers(config.stash[_temp].parent, _own_multiprocessing_folder())
    if failed:
        config.stash[_failed] = failed
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    """The failed checks, written after pytest's last line ("N passed in T s"): a log read from its end (a CI's
    tail) shows why a run whose tests all passed failed. The run's temp folder is removed, what was left in it too."""
    if _temp in config.stash and _controller(config):
        root = config.stash[_temp].parent
        if _own_multiprocessing_folder() is None:
            shutil.rmtree(root, ignore_errors=True)
        else:  # after multiprocessing's own removal of its folder there, at this process's exit
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(root,), kwargs={"ignore_errors": True},
                                          exitpriority=-200)
    failed = config.stash.get(_failed, [])
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if failed and reporter is not None:
        reporter.ensure_newline()
        for line in failed:
            reporter.write_line(f"suite check failed: {line}", red=True)


def _shm_entries() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir()}
    except OSError:
        return set()


#: what multiprocessing starts for a process that uses it, which ends when that process does
_HELPERS = ("from multiprocessing.forkserver import main", "from multiprocessing.resource_tracker import main")


def marked_processes(marker: str) -> dict[int, str]:
    """``{pid: command line}`` of the processes other than this one and its own multiprocessing helpers (they end
    with it) whose environment holds ``SESSION_VARIABLE=marker``. A process in the middle of its exec is not seen
    (its ``/proc`` environment is empty until the new program's is in place, after a vfork's parent has resumed):
    the check runs after the last test, when what the run left has long been started."""
    needle = f"{SESSION_VARIABLE}={marker}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended while being read, or not ours to read
            continue
        if state == "Z" or (int(parent) == os.getpid() and any(h in command for h in _HELPERS)):
            continue  # ended and not yet reaped, or this process's own helper
        found[int(entry.name)] = command
    return found


def leftovers(marker: str, shm_before: set[str], *, grace: float = GRACE_SECONDS) -> list[str]:
    """What the run left behind, one line each: its processes still running after ``grace`` seconds (killed here),
    and the files it made in ``/dev/shm`` (named, not removed: another program may be reading them)."""
    deadline = time.monotonic() + grace
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked_processes(marker)
    lines = [f"process {pid} was left running ({cmd[:200].strip()}); killed" for pid, cmd in sorted(left.items())]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines += [f"{SHM / name} was left behind" for name in sorted(_shm_entries() - shm_before)]
    return lines


def _own_multiprocessing_folder() -> Path | None:
    """This process's multiprocessing temp folder (its fork server's socket: tests that ran in this process, as
    without xdist, may have started one), which multiprocessing removes at this process's exit; ``None`` if none."""
    folder = multiprocessing.process.current_process()._config.get("tempdir")
    return Path(folder) if folder else None


def close_own_temporary_folders(root: Path) -> None:
    """Removes now, as this process's exit would, each folder under ``root`` that a live
    ``tempfile.TemporaryDirectory`` of this process holds: a library may keep one for its process's lifetime (wandb's
    media and artifact staging folders, made when it is imported), and tests run in this process without xdist."""
    cleanup = tempfile.TemporaryDirectory._cleanup.__func__
    for finalizer in list(weakref.finalize._registry):  # noqa: SLF001 (the live finalizers: no public view)
        held = finalizer.peek()
        if held is not None and getattr(held[1], "__func__", None) is cleanup and held[2] and \
                Path(held[2][0]).is_relative_to(root):
            finalizer()


def temp_leftovers(root: Path, own: Path | None = None) -> list[str]:
    """One line an entry left in a pytest process's temp folder under ``root`` (:func:`own_temp_folder`), with the
    test during which it appeared where one did (else it appeared between tests, or after the last); ``own``, this
    process's multiprocessing folder, which its exit removes, is none."""
    lines = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        tests = {}
        if _tests_file(folder).exists():
            tests = dict(line.split("\t", 1) for line in _tests_file(folder).read_text().splitlines())
        for name in sorted(set(os.listdir(folder)) - set(machine_caches()) - MACHINE_STATE_FILES):
            if own is not None and folder / name == own:
                continue
            by = f" by {tests[name]}" if name in tests else f" (in {folder.name}'s temp folder, between tests)"
            lines.append(f"the temp entry {name} was left behind{by}")
    return lines
