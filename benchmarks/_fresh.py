"""Each configuration of a benchmark in a fresh process: the harness the benchmark scripts share.

A ratio taken in one warm process depends on what ran before (glibc's dynamic mmap threshold, caches, compiled
kernels, a thread pool already up), so every configuration here runs as ``python SCRIPT --one NAME ...`` in a new
interpreter, the order rotated from round to round (so that a drift of the machine's load touches every
configuration alike), and the report gives the median and the range over rounds.

A script using it answers ``--one NAME`` by measuring that configuration alone and printing one JSON object as its last
stdout line.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


def run_one(script: str, name: str, args: Sequence[str] = (), *, timeout: float = 900.0,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``python script --one name *args`` in a fresh interpreter and returns the JSON of its last stdout line.

    Raises:
        RuntimeError: the process failed or printed no JSON (its stderr's tail is in the message).
    """
    cmd = [sys.executable, script, "--one", name, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def rotated_rounds(script: str, names: Sequence[str], rounds: int, args: Sequence[str] = (), *,
                   skip_failed: bool = True, env: dict[str, str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of every configuration in ``names``, each run in a fresh process, the order rotated by one
    each round. Returns each name's results in round order. A configuration that fails (a peer not installed) is
    reported on stderr and dropped when ``skip_failed``."""
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    failed: set[str] = set()
    for r in range(rounds):
        order = list(names[r % len(names):]) + list(names[:r % len(names)])
        for name in order:
            if name in failed:
                continue
            try:
                results[name].append(run_one(script, name, args, env=env))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                if not skip_failed:
                    raise
                failed.add(name)
                print(f"skipped {name}: {str(e).strip().splitlines()[-1] if str(e).strip() else e}", file=sys.stderr)
            print(f"  round {r + 1}/{rounds} {name}: {results[name][-1] if name not in failed else 'skipped'}",
                  file=sys.stderr, flush=True)
    return {n: v for n, v in results.items() if v}


def med_range(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """``median [min, max]`` of ``values``, each formatted with ``fmt``."""
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def machine() -> str:
    """One line naming the machine: CPU model, logical cores, Python and torch versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import torch

    return f"{cpu}, {os.cpu_count()} logical cores, Python {platform.python_version()}, torch {torch.__version__}"
