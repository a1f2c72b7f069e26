"""Shared fixtures and the suite's rules: the devices every contract suite is parametrized over, one tiny trained run
for the tests that only read a run, the Ray tests kept on one xdist worker (and the users of a module-scoped fixture on
one worker each), the time guard, ``--torch-threads``, and no learning curve at a run's end but in the tests marked
``learning_curve`` (``RLSTRUCT_LEARNING_CURVE=0``).

A training run uses its config's ``torch_threads``: 1 unless a test sets it, whatever the machine's cores. The
learning tests' thresholds are set from their distribution over seeds 0-9 with 1 and with 2 torch threads
(``benchmarks/thresholds.py``, the numbers in each test's docstring), and ``pytest --torch-threads 2 -m slow`` runs
them with 2.

The time guard fails a test whose setup, call and teardown together take more than ``--max-test-seconds`` (30 by
default; 0 turns it off) of CPU time, unless it is marked ``@pytest.mark.long(reason="...")``. CPU time is the
pytest process's own plus that of the child processes it has waited for (batcher workers, ``rlstruct`` and
``torchrun`` subprocesses): it is what a test costs the machine, and, unlike the wall clock, it does not grow when
other work shares the CPUs, so the verdict does not depend on the load. A test that mostly waits is bounded by
pytest-timeout instead. A test not marked ``slow`` (nor ``long``, which
implies it) is held to ``--max-quick-seconds`` (8 by default): ``make quick`` runs those tests, and it stays the
edit loop of a few minutes only while each is cheap. A ``cuda`` test is not: it is skipped on a CPU machine, and on a
GPU its CPU seconds are the CUDA context's and the compilers'. Nor is the setup of a fixture that tests share (module
or session scope, such as a trained run): its cost is paid once, by whichever test comes first, and counts toward that
test's 30-second limit only.

Both limits are in the reference machine's CPU seconds (a quiet 2-core AMD EPYC): each pytest process times a fixed
piece of work when it starts (:func:`_calibration_seconds`) and scales the limits by how much longer it took there
than on the reference, never below 1, so a slower or busier CPU gets the time the same work takes on it, and a faster
one is held to the same limits. ``--time-guard-scale X`` sets the factor instead (1: the limits as written). The
header of the run says the factor.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from filelock import FileLock

#: the guard's default limit, in CPU seconds per test
MAX_TEST_SECONDS = 30.0
#: the guard's default limit for a test not marked ``slow`` (``make quick`` runs those: about 5 minutes on a 2-vCPU VM)
MAX_QUICK_SECONDS = 8.0
#: the CPU seconds :func:`_calibration_seconds`'s work takes on the reference machine, idle (the median of 9 starts)
REFERENCE_CALIBRATION_SECONDS = 0.31
#: the variable that turns a run's learning curve off (``algos/_train/run_folder.py``'s; the suite sets 0)
LEARNING_CURVE_ENV_VAR = "RLSTRUCT_LEARNING_CURVE"
_GUARD_SCALE = pytest.StashKey[float]()
_JAX_CACHE = pytest.StashKey[str]()
_COMPILE_CACHE = pytest.StashKey[str]()


@functools.cache
def _cuda_available() -> bool:
    # torch imported on first use, not with the plugin: a generated suite (tests/project/test_xdist_groups.py) runs
    # this conftest in interpreters that never use torch, each import of it 2-3 CPU s
    import torch

    return torch.cuda.is_available()


def device_params() -> list:
    """``cpu``, plus ``cuda:0`` marked ``cuda`` when a GPU is present."""
    return ["cpu"] + ([pytest.param("cuda:0", marks=pytest.mark.cuda)] if _cuda_available() else [])


@pytest.fixture(scope="session")
def tiny_cartpole_run(tmp_path_factory) -> Path:
    """A tiny trained run (``rlstruct train a2c --env CartPole-v1``, 300 env steps, episodes of at most 60 steps), for
    the tests that only read a run (eval, video, export, load). Trained once for the session: the xdist workers share
    one folder, the first to take the lock trains and the others wait for it. Read it, never write into it."""
    # Every xdist worker's basetemp is a folder of one per-session parent; without xdist, the session's own.
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    run = root / "tiny-cartpole-run"
    with FileLock(str(root / "tiny-cartpole-run.lock")):
        if not (run / "summary.json").exists():
            from rlstruct.algos._train import cli

            # The command's code in this process: a fresh one would spend more on importing torch and pyplot than on
            # the 300 steps.
            with contextlib.redirect_stdout(io.StringIO()):
                status = cli.main(["train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "300", "--logdir",
                                   str(run), "--no-progress", "--n-envs", "4", "--n-evaluation-envs", "2",
                                   "--max-episode-steps", "60", "--eval-every", "5"])
            assert status == 0, f"the tiny run's training ended with status {status}"
    return run


def _calibration_seconds() -> float:
    """The CPU seconds of a fixed piece of work like the tests' own (the interpreter's loops and small torch
    operations, on one thread), the median of three: what the time guard's limits are scaled by."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(3):
            start = time.process_time()
            total, x = 0, torch.full((96, 96), 0.01)
            for i in range(1_500_000):
                total += i % 7
            for _ in range(2_000):
                x = torch.tanh(x @ x + 0.01)
            times.append(time.process_time() - start)
        return sorted(times)[1]
    finally:
        torch.set_num_threads(threads)


def _guard_scale(config) -> float:
    """The factor the time guard's limits are multiplied by in this process (``--time-guard-scale``, else this CPU's
    calibration against the reference, at least 1)."""
    if _GUARD_SCALE not in config.stash:
        given = config.getoption("--time-guard-scale")
        config.stash[_GUARD_SCALE] = (given if given is not None
                                      else max(1.0, _calibration_seconds() / REFERENCE_CALIBRATION_SECONDS))
    return config.stash[_GUARD_SCALE]


def pytest_report_header(config):
    scale = _guard_scale(config)
    return (f"time guard: {config.getoption('--max-test-seconds'):g} CPU s a test, "
            f"{config.getoption('--max-quick-seconds'):g} outside `slow`, x {scale:.2f} on this CPU "
            "(--time-guard-scale)")


#: XLA's CPU flags for the test session, unless ``XLA_FLAGS`` is given (see :func:`pytest_configure`)
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def pytest_configure(config):
    """One JAX compilation cache on disk for the session (unless one is set already): the xdist workers, the batcher
    workers and the tutorials' and commands' subprocesses compile the same Brax, MJX and gymnax steps, and each
    after the first loads them instead (a Brax test file's compilations: 15 s, then 4 s). Removed at the end."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the workers inherit the controller's
        folder = tempfile.mkdtemp(prefix="rlstruct-tests-jax-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
        config.stash[_JAX_CACHE] = folder
    # XLA's CPU backend compiles without LLVM's optimisations (no fast-math either way) and with its older elemental
    # emitters instead of its fusion emitters, whose code generation for the large fusions of a physics step costs
    # more than the few hundred steps the tests run (MJX HalfCheetah's auto-reset step: 18 CPU s to compile, 11.8
    # with both flags; a Brax pendulum's: 10.5, 5.1). The numerics differ at rounding level (about 1e-6 after 300
    # Brax steps): the Brax learning test's distribution is measured with these flags.
    os.environ.setdefault("XLA_FLAGS", TEST_XLA_FLAGS)
    # The suite's training runs draw no learning curve at their end (RLSTRUCT_LEARNING_CURVE=0, unless given): the
    # figure is no test's claim but those marked `learning_curve`, and drawing it was about a twentieth of the whole
    # run's CPU (matplotlib's first figure in a process about a CPU second, each next one 0.2-0.4, in hundreds of runs).
    os.environ.setdefault(LEARNING_CURVE_ENV_VAR, "0")


def pytest_unconfigure(config):
    for key in (_JAX_CACHE, _COMPILE_CACHE):
        folder = config.stash.get(key, None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--torch-threads", type=int, default=None,
                     help="run every training run of the tests (a2c.train, ppo.train, a tutorial's train...) with this "
                          "many torch threads instead of its config's (1 unless a test sets it): the learning tests' "
                          "thresholds hold with 1 and with 2 (benchmarks/thresholds.py measures them)")
    parser.addoption("--max-test-seconds", type=float, default=MAX_TEST_SECONDS,
                     help="fail a test not marked `long` whose setup, call and teardown take more CPU seconds than "
                          f"this (the process's and its waited-for children's; default {MAX_TEST_SECONDS:g}, 0: off)")
    parser.addoption("--max-quick-seconds", type=float, default=MAX_QUICK_SECONDS,
                     help="fail a test not marked `slow` (or `long`) whose setup, call and teardown take more CPU "
                          f"seconds than this: `make quick` runs those (default {MAX_QUICK_SECONDS:g}, 0: off)")
    parser.addoption("--time-guard-scale", type=float, default=None,
                     help="multiply both time limits by this instead of by this CPU's calibration against the "
                          "reference machine (1: the limits as written)")


@pytest.fixture(autouse=True)
def _learning_curves_where_a_test_reads_them(request, monkeypatch):
    """A test marked ``learning_curve``: its runs, and the processes it starts, draw ``learning_curve.png`` as a
    user's runs do."""
    if request.node.get_closest_marker("learning_curve"):
        monkeypatch.setenv(LEARNING_CURVE_ENV_VAR, "1")
    yield


@pytest.fixture(autouse=True)
def _torch_threads_of_the_training_runs(request):
    """``--torch-threads N``: the training runs a test starts in this process use N torch threads."""
    threads = request.config.getoption("--torch-threads")
    if threads is None:
        yield
        return
    from tests.helpers import training_runs_with

    with training_runs_with(torch_threads=threads):
        yield


def pytest_itemcollected(item):
    if not item.config.pluginmanager.hasplugin("xdist"):
        return
    # One Ray cluster at a time on this machine: a second one would join the first (`ray start` writes the address
    # that ray.init and --ray-address auto find). --dist loadgroup sends a group's tests to one worker.
    if item.get_closest_marker("ray"):
        item.add_marker(pytest.mark.xdist_group("ray"))
    # A module-scoped fixture is built once per worker that runs a test using it: its users go to one worker, so
    # that a compiled simulator, a built wheel or a trained run is made once, not once on each worker.
    elif not item.get_closest_marker("xdist_group") and _uses_a_module_fixture(item):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _uses_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for name in item.fixturenames
                                    for d in info.name2fixturedefs.get(name, ()))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_xdist_groups(config, items):
    """Under --dist loadgroup: the long tests first, and the group suffix.

    --dist loadgroup schedules by a ``@group`` suffix that pytest-xdist's worker appends to each grouped test's id;
    pytest-xdist 3.8 writes it into an attribute that pytest 9.2 no longer reads (its ids became structured), and
    every test then runs wherever it falls. This appends the suffix where xdist's did not take."""
    if not getattr(config.option, "loadgroup", False):
        return
    # The tests marked long first (bar those of a group, whose order is the group's): handed out last, one of them
    # would keep a worker busy for a minute after the other one ran out of tests. The sort is stable.
    items.sort(key=lambda item: not (item.get_closest_marker("long") and not item.get_closest_marker("xdist_group")))
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            nodeid = f"{item.nodeid}@{'_'.join(groups)}"
            if hasattr(item, "_id"):
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(nodeid)
            else:
                item._nodeid = nodeid


#: modules whose doctests build a JAX or MuJoCo env (JAX's import and jit, MuJoCo's model): 2.3-2.8 s each, slow
SLOW_DOCTEST_MODULES = {"rlstruct.envs.brax_env", "rlstruct.envs.gymnax_env", "rlstruct.envs.mujoco_torch_env"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: a long test is a slow one, and `make quick` leaves it out
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("ray"):  # a cluster's start, and actors that each import torch: seconds a test
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("compiles"):  # the compiler's speed, not the code's: 5-10 CPU s cold on 2 cores
            item.add_marker(pytest.mark.slow)
        if isinstance(item, pytest.DoctestItem) and any(item.name == m or item.name.startswith(f"{m}.")
                                                         for m in SLOW_DOCTEST_MODULES):
            item.add_marker(pytest.mark.slow)
        long = item.get_closest_marker("long")
        if long is None:
            continue
        if not long.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.long needs reason='why this test may take more "
                                    f"than {MAX_TEST_SECONDS:g} s'")
        item.add_marker(pytest.mark.slow)
    cuda = [item for item in items if "cuda" in item.keywords]
    if not cuda or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in cuda:
        item.add_marker(skip)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _fork_server_cpu_seconds()


def _fork_server_cpu_seconds() -> float:
    """The CPU seconds of the fork server the batchers' workers are forked from, and of its children that exited
    (it reaps them): a worker is the server's child, not this process's, so RUSAGE_CHILDREN misses it."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After "pid (comm)": field 14-17 of proc(5) (utime, stime, cutime, cstime) are 11-14 here, in clock ticks.
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _held_to_quick_limit(item) -> bool:
    """Whether ``--max-quick-seconds`` holds for the test: not for ``slow`` ones, nor for ``cuda`` ones, which run only
    on a GPU machine and spend their CPU seconds creating the CUDA context and compiling kernels (an H100's fast-path
    tests took 10 to 13), not on what ``make quick`` costs a CPU machine, where they are skipped."""
    return item.get_closest_marker("slow") is None and item.get_closest_marker("cuda") is None


def wall_clock_scale(config) -> float:
    """How many times longer than on the reference machine, quiet, work takes here now: this CPU's calibration (the
    time guard's factor) times the load (runnable processes per core over the last minute, at least 1). Two CPU
    burners beside the suite's two workers on two cores make it about 2."""
    return _guard_scale(config) * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # before pytest-timeout's own wrapper reads the limit
def pytest_runtest_protocol(item, nextitem):
    """A test's wall-clock limit (pytest-timeout's, there to end a hang) scaled by :func:`wall_clock_scale` as the
    test starts, and the same factor for the limits the test puts on its own subprocesses
    (:func:`tests.helpers.wall_limit`): a busy machine's slowness is not a hang."""
    # tests.helpers imports torch: where nothing has imported torch (a generated suite's interpreter, see
    # tests/project/test_xdist_groups.py) no test can use its wall_limit, and importing it would cost 2-3 CPU s
    helpers = sys.modules.get("tests.helpers")
    if helpers is None and "torch" in sys.modules:
        from tests import helpers
    scale = wall_clock_scale(item.config)
    marker = item.get_closest_marker("timeout")
    limit = (marker.args[0] if marker is not None and marker.args else
             marker.kwargs.get("timeout") if marker is not None else item.config.getini("timeout"))
    if limit and float(limit) > 0 and scale > 1:
        item.add_marker(pytest.mark.timeout(float(limit) * scale), append=False)
    if helpers is not None:
        helpers.WALL_SCALE = scale
    try:
        yield
    finally:
        if helpers is not None:
            helpers.WALL_SCALE = 1.0


_STARTED = pytest.StashKey[tuple[float, float, float]]()
_FLAGGED = pytest.StashKey[bool]()
#: the CPU seconds this process has spent setting up fixtures that tests share (module, package or session scope)
_shared_fixture_seconds = 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    global _shared_fixture_seconds
    if fixturedef.scope == "function":
        yield
        return
    start = _cpu_seconds()
    try:
        yield
    finally:
        _shared_fixture_seconds += _cpu_seconds() - start


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_STARTED] = (_cpu_seconds(), time.perf_counter(), _shared_fixture_seconds)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _STARTED not in item.stash:
        return
    cpu0, wall0, shared0 = item.stash[_STARTED]
    cpu, wall = _cpu_seconds() - cpu0, time.perf_counter() - wall0
    shared = _shared_fixture_seconds - shared0
    if report.when == "teardown":  # the test's CPU seconds, in --junitxml's properties: where a suite's time goes
        report.user_properties.append(("cpu_seconds", round(cpu, 2)))
        report.user_properties.append(("shared_fixture_seconds", round(shared, 2)))
    scale = _guard_scale(item.config)
    limit = item.config.getoption("--max-test-seconds") * scale
    if limit and cpu > limit and report.passed and not item.get_closest_marker("long") and _FLAGGED not in item.stash:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {cpu:.1f} s of CPU time ({wall:.1f} s of wall clock) up to its "
                           f"{report.when}, more than the {limit:.3g} s a test may take on this CPU; make it "
                           "cheaper, move the proof to "
                           f"benchmarks/, or mark it @pytest.mark.long(reason='...')")
        item.stash[_FLAGGED] = True
    quick = item.config.getoption("--max-quick-seconds") * scale
    own = cpu - shared
    if quick and own > quick and report.passed and _held_to_quick_limit(item) and _FLAGGED not in item.stash:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {own:.1f} s of CPU time ({wall:.1f} s of wall clock) up to its "
                           f"{report.when}, besides its shared fixtures' {shared:.1f}, more than the {quick:.3g} s a "
                           f"test outside `slow` may take on this CPU (`make quick` runs those); mark it "
                           "@pytest.mark.slow, or make it cheaper")
        item.stash[_FLAGGED] = True


# --------------------------------------------------------------------------- one Ray cluster for the Ray tests in a row
@pytest.fixture(scope="module")
def ray_head():
    """The Ray cluster of the Ray tests that run in a row in this process (tests/ray_cluster.py), started by the
    first of them; its driver variables (address, token) are set in this process while the module's tests run.
    Skips without Ray (not importorskip: Ray imported before tests/ray_cluster.py's variables would listen on every
    interface)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed: pip install 'rlstruct[ray]'")
    from tests.ray_cluster import shared_head

    with shared_head().joined() as head:
        yield head


@pytest.hookimpl(trylast=True, specname="pytest_runtest_teardown")  # after the test's fixtures (a driver) ended
def pytest_runtest_teardown_shared_ray_cluster(item, nextitem):
    """Ends the shared Ray cluster once the next test is no Ray test of a module that joins it: under --dist
    loadgroup the Ray tests run in a row on one worker, so it runs while they do, not to the end of the session."""
    import sys

    cluster = sys.modules.get("tests.ray_cluster")
    if cluster is None or not cluster.running():
        return
    if nextitem is not None and nextitem.get_closest_marker("ray"):
        joining = item.session.stash.setdefault(_JOINING_RAY_HEAD, {})
        if nextitem.path not in joining:
            joining[nextitem.path] = any("ray_head" in other.fixturenames for other in item.session.items
                                         if other.path == nextitem.path)
        if joining[nextitem.path]:
            return
    cluster.stop_shared_head()


#: {module path: whether a test of it joins the shared Ray cluster}
_JOINING_RAY_HEAD = pytest.StashKey[dict]()


#: inductor's C++ builds for the test session (each unless given): ``-O0`` (``TORCHINDUCTOR_DEBUG_COMPILE``: without
#: ``-O3``'s optimisations, with ``-g``), the CPU's vector instructions taken from torch's detection without a trial
#: build of each (``TORCHINDUCTOR_VEC_ISA_OK``, which a fresh cache folder repeats), and the kernels built in the
#: compiling process rather than by a pool of worker interpreters that each import torch
#: (``TORCHINDUCTOR_COMPILE_THREADS``). No test's claim is the compiled code's speed: they hold its results to the
#: eager ones (bit for bit, or within float tolerance) and count what the caches answer, over a few hundred steps;
#: the generated code is the same, only the compiler's work on it differs (A2C's update compiled cold, as
#: tests/algos/test_compile_cache.py's first launch does: 61 CPU s with torch's defaults, 29 with these)
TEST_INDUCTOR_ENV = {"TORCHINDUCTOR_DEBUG_COMPILE": "1", "TORCHINDUCTOR_VEC_ISA_OK": "1",
                     "TORCHINDUCTOR_COMPILE_THREADS": "1"}


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_inductor_env(config):
    """:data:`TEST_INDUCTOR_ENV` for this process and the ones it starts, before anything imports inductor's config
    (which reads them once; nothing the suite imports at collection loads it)."""
    for name, value in TEST_INDUCTOR_ENV.items():
        os.environ.setdefault(name, value)
    # One folder for torch.compile's on-disk caches, the session's own (removed at its end): the runs' compile cache
    # (RLSTRUCT_COMPILE_CACHE, else under the user's home) and inductor's (TORCHINDUCTOR_CACHE_DIR, else under /tmp)
    # were two, each paying inductor's cold builds, and the suite wrote into the user's home. Set before the workers
    # start, which inherit it; one already set is the user's. (Inductor keeps its precompiled header, about 14 CPU s
    # to build, under /tmp/torchinductor_USER whatever this folder is: built once on a machine, then reused.)
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "RLSTRUCT_COMPILE_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="rlstruct-tests-compile-cache-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["RLSTRUCT_COMPILE_CACHE"] = folder
        config.stash[_COMPILE_CACHE] = folder
