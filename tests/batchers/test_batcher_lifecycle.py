"""Batchers a program forgot to close: closed at interpreter exit and at garbage collection, with a
ResourceWarning naming where they were created, no process left behind, and a prompt exit even with an
acquisition under way.

Each case runs a small script in a fresh interpreter (``-W always::ResourceWarning``), since what is checked is
the interpreter's exit itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from rlstruct.batchers import RL_Batcher
from rlstruct.batchers._lifecycle import creation_site
from tests.fakes import ConstantAgent, CountingEnv
from tests.helpers import wall_limit

REPO = Path(__file__).resolve().parents[2]
AUTORESET = {"n_envs": 2, "autoreset": True, "episode_lengths": (100,)}

# A script that builds batchers as ``case`` says, prints its workers' pids and the time it reaches its end, and
# ends without close().
SCRIPT = textwrap.dedent("""
    import gc, os, sys, time
    from rlstruct.batchers import RL_Batcher
    from tests.fakes import ConstantAgent, CountingEnv, SlowAgent, pid_alive

    ENV = {"n_envs": 2, "autoreset": True, "episode_lengths": (100,)}

    def build(n_processes, pending):
        # pending: an acquisition of 1 s (4 steps of 0.25 s) under way, where the script reaches its end milliseconds
        # after the execute
        agent, args = (SlowAgent, {"delay": 0.25}) if pending else (ConstantAgent, {})
        b = RL_Batcher(4, agent, args, CountingEnv, ENV, n_processes, list(range(max(n_processes, 1))))
        b.reset()
        b.execute()
        if not pending:
            b.get()
        return b

    if __name__ == "__main__":
        case = sys.argv[1]
        if case == "two":  # rlstructures' PPO: a training batcher with processes and an evaluation one, unclosed
            train, evaluation = build(2, pending=False), build(0, pending=True)
            pids = [r["pid"] for r in train.worker_reports()]
        else:  # "pending": a batcher dropped mid-script, then worker processes with an acquisition under way
            b = build(2, pending=True)
            dropped = [r["pid"] for r in b.worker_reports()]
            del b
            gc.collect()
            print("alive after del:", [p for p in dropped if pid_alive(p)], flush=True)
            b = build(2, pending=True)
            pids = [r["pid"] for r in b.worker_reports()]
        print("pids", *pids, flush=True)
        print("pgid", os.getpgrp(), flush=True)
        print("end", time.time(), flush=True)
""")


def _run(tmp_path: Path, case: str, *, session: bool = False) -> tuple[subprocess.CompletedProcess, list[int], float]:
    """Runs the script (``session``: as the leader of a new session, so that its process group holds its pid)."""
    script = tmp_path / "unclosed.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-W", "always::ResourceWarning", str(script), case], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=wall_limit(150), start_new_session=session)
    exited = time.time()
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines() if ln.strip()}
    assert "end" in lines, out.stdout + out.stderr
    return out, [int(p) for p in lines["pids"]], exited - float(lines["end"][0])


def _process_group(pgid: int) -> list[tuple[int, str, str]]:
    """``(pid, state, command)`` of every process in process group ``pgid``, read from /proc (zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:  # exited meanwhile
            continue
        # After "pid (comm) ": state, ppid, pgrp, ...; comm may hold spaces and parentheses.
        state, _, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid:
            found.append((int(entry), state, command))
    return found


@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")
@pytest.mark.parametrize("case", ["pending", "two"])
@pytest.mark.slow
def test_an_unclosed_batcher_is_closed_at_exit_with_a_resource_warning_and_leaves_no_process(tmp_path, case):
    """The script runs as the leader of a new session: once it has exited, neither its workers nor anything else of
    its process group may be left. Checked at once, not after a sleep: the script waits for its workers, and for
    the resource tracker that spawning them started, before its interpreter is gone (else init reaps them later, or
    never).

    Each case is a fresh interpreter and fork server (the test's cost), so two cases cover the states a batcher
    can be left in: "pending" leaves worker processes with an acquisition under way, "two" an idle batcher with
    worker processes beside an in-process one with an acquisition under way (an idle or an in-process batcher alone
    takes the same exit path as in "two"). "pending" first drops a batcher of 2 worker processes with an acquisition
    under way mid-script: its collection closes it at once (its workers gone before the script goes on), with its
    own warning, in the interpreter that the exit is checked in anyway."""
    start = time.monotonic()
    out, pids, exit_s = _run(tmp_path, case, session=True)
    took = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    # The interpreter's exit waits for the workers' ends, not for a timeout (wall limits scaled to the load).
    assert exit_s < wall_limit(10), f"the interpreter took {exit_s:.1f} s to exit"
    assert took < wall_limit(120), took
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == [], "a worker outlived its script"
    pgid = int(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("pgid")))
    assert pgid not in pids and len(pids) == 2
    assert _process_group(pgid) == [], f"processes left in the script's process group: {_process_group(pgid)}"
    # The warning names the script's line that built the batcher; nothing leaked or was left for a tracker.
    assert "ResourceWarning: unclosed RL_Batcher" in out.stderr, out.stderr
    assert f"created at {tmp_path / 'unclosed.py'}:" in out.stderr
    assert "leaked" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("ResourceWarning") == 2, out.stderr
    if case == "pending":  # the batcher dropped mid-script
        assert "alive after del: []" in out.stdout, out.stdout
        assert "ResourceWarning: unclosed RL_Batcher with 2 worker processes" in out.stderr, out.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n_processes", [0, 1])
def test_a_closed_batcher_warns_nothing_and_is_collected(n_processes):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = RL_Batcher(4, ConstantAgent, {}, CountingEnv, AUTORESET, n_processes, [0])
        b.reset()
        b.execute()
        b.get()
        b.close()
        del b
        import gc

        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


@pytest.mark.timeout(60)
def test_an_unclosed_in_process_batcher_warns_when_collected():
    b = RL_Batcher(4, ConstantAgent, {}, CountingEnv, AUTORESET, 0, [0])
    env = b._workers[0].acq.env
    with pytest.warns(ResourceWarning, match=r"unclosed RL_Batcher \(in process\) created at .*test_batcher_lifecycle"):
        del b
        import gc

        gc.collect()
    assert env.closed


def test_the_creation_site_is_the_callers_frame():
    filename, lineno, function = creation_site()
    assert filename == __file__ and function == "test_the_creation_site_is_the_callers_frame"
