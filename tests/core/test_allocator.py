"""rlstruct.allocator: glibc's mmap threshold fixed in the processes rlstruct collects in (each check in a fresh
interpreter, since the setting is process-wide and glibc reads its environment variables at start-up)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")

#: prints the bytes of mmapped blocks that a 4 MiB allocation adds, before and after tune_allocator()
PROBE = textwrap.dedent("""
    import ctypes, json, sys
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    kept = []  # never freed: freeing an mmapped block would raise glibc's dynamic threshold by itself
    def mmapped_by_4_mib():
        before = libc.mallinfo2().hblkhd
        kept.append(bytearray(4 * 1024 * 1024))
        return libc.mallinfo2().hblkhd - before
    first = mmapped_by_4_mib()
    from rlstruct.allocator import tune_allocator
    SETUP
    tuned = tune_allocator()
    print(json.dumps({"before": first, "tuned": tuned, "again": tune_allocator(), "after": mmapped_by_4_mib()}))
""")


def probe(setup: str = "", **env: str) -> dict:
    import json

    proc = subprocess.run([sys.executable, "-c", PROBE.replace("SETUP", setup)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 2.2 CPU s on the reference CPU: slow is 1.5 s or more
def test_a_multi_mib_block_comes_from_the_heap_once_tuned():
    out = probe()
    assert out["before"] >= 4 * 1024 * 1024, "a fresh process mmaps a 4 MiB block"
    assert out["tuned"] and out["again"]
    assert out["after"] == 0, "after tune_allocator the block comes from the heap"


@pytest.mark.slow  # 2.1 CPU s on the reference CPU: slow is 1.5 s or more
def test_switched_off_by_its_environment_variable():
    out = probe(RLSTRUCT_TUNE_MALLOC="0")
    assert not out["tuned"] and out["after"] > 0


@pytest.mark.slow  # 2.3 CPU s on the reference CPU: slow is 1.5 s or more
def test_glibcs_own_variables_win():
    out = probe(MALLOC_MMAP_THRESHOLD_="1048576")
    assert not out["tuned"]
    assert out["before"] > 0 and out["after"] > 0, "glibc's own threshold (1 MiB) still mmaps 4 MiB"


@pytest.mark.slow  # 2.6 CPU s on the reference CPU: slow is 1.5 s or more
def test_an_in_process_batcher_tunes_its_process():
    setup = ("from rlstruct import RL_Batcher\nfrom tests.fakes import ConstantAgent, CountingEnv\n"
             "RL_Batcher(2, ConstantAgent, {}, CountingEnv, {'n_envs': 2}, 0, [0]).close()\n"
             "import rlstruct.allocator as a; assert a._tuned")
    assert probe(setup)["after"] == 0
