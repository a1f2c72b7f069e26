"""Where a whole test run's CPU goes, every process of it, read from a sampling profile (py-spy's raw output).

The JUnit report (``benchmarks/test_guard.py``) holds what each test counted: its pytest process's CPU and that of
the children it waited for. It does not see the processes that no test waits for: the Ray cluster's nodes and
actors, the fork servers the batchers' workers come from, the xdist controller. A sampling profiler that follows
every child does::

    pip install py-spy
    py-spy record -r 25 --nonblocking --subprocesses --format raw -o suite.raw -- \\
        .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup ...   # make test's pytest command
    python benchmarks/suite_profile.py suite.raw --rate 25

Each line of a raw profile is one stack, its frames joined by ``;`` (the processes first, ``process PID:"COMMAND"``,
then the Python frames, outermost first) and its number of samples; a sample is ``1 / rate`` CPU seconds of one
thread that was running (py-spy leaves idle threads out). Printed: the sampled CPU seconds by the kind of process,
and by what the stacks were doing (a stack counts toward each kind of work one of its frames names).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable

#: a process frame: its pid and its command line
_PROCESS = re.compile(r'process (\d+):"(.*?)"(?=;|$)')

#: the kinds of process, by a piece of their command line, first match wins
PROCESS_KINDS = (
    ("fork servers and the workers forked from them", "multiprocessing.forkserver import main"),
    ("spawned workers", "multiprocessing.spawn import spawn_main"),
    ("Ray's nodes and actors", "/ray/"),
    ("Ray's nodes and actors", "bin/ray "),
    ("torchrun's launchers", "torch.distributed.run"),
    ("torchrun's launchers", "bin/torchrun"),
    ("pytest's workers and the children forked from them", "exec(eval(sys.stdin.readline()))"),
    ("pytest's controller", " -m pytest "),
)
#: what a stack was doing, by a piece of one of its frames; a stack may count toward several
WORK_KINDS = (
    ("importing modules", "_find_and_load ("),
    ("evaluations of policies (rlstruct's evaluator)", "algos/_train/evaluation.py"),
    ("backward passes", "_engine_run_backward ("),
    ("torch.compile (dynamo, inductor)", "torch/_dynamo/"),
    ("torch.compile (dynamo, inductor)", "torch/_inductor/"),
    ("learning curves (matplotlib)", "learning_curve_png ("),
    ("numba", "numba/"),
    ("JAX and XLA", "jax/_src/"),
)


def parse(lines: Iterable[str]) -> list[tuple[list[str], list[str], int]]:
    """``(process command lines, Python frames, samples)`` of each stack of a raw profile; lines that are not
    ``STACK COUNT`` are skipped."""
    stacks = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        processes = list(_PROCESS.finditer(stack))
        rest = stack[processes[-1].end():].lstrip(";") if processes else stack
        stacks.append(([m.group(2) for m in processes], rest.split(";") if rest else [], int(count)))
    return stacks


def process_kind(commands: list[str]) -> str:
    """The kind of the innermost process of a stack (:data:`PROCESS_KINDS`), else ``other interpreters``."""
    command = commands[-1] if commands else ""
    for kind, piece in PROCESS_KINDS:
        if piece in command:
            return kind
    return "other interpreters (commands, tutorials, scripts, ...)"


def summarize(stacks: list[tuple[list[str], list[str], int]]) -> tuple[int, Counter, Counter]:
    """All samples, the samples by kind of process and the samples by kind of work (a stack counted once per kind)."""
    total, by_process, by_work = 0, Counter(), Counter()
    for commands, frames, count in stacks:
        total += count
        by_process[process_kind(commands)] += count
        for kind in dict.fromkeys(k for k, piece in WORK_KINDS if any(piece in f for f in frames)):
            by_work[kind] += count
    return total, by_process, by_work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("profile", help="py-spy's raw output (--format raw)")
    parser.add_argument("--rate", type=float, default=100.0, help="the samples per second it was recorded at (-r)")
    args = parser.parse_args()
    with open(args.profile) as f:
        total, by_process, by_work = summarize(parse(f))
    print(f"{total} samples: {total / args.rate:,.0f} CPU s sampled\n")
    for title, counts in (("process", by_process), ("work (a stack may count toward several)", by_work)):
        print(f"| {title} | CPU s | share |\n|:--|--:|--:|")
        for kind, count in counts.most_common():
            print(f"| {kind} | {count / args.rate:,.0f} | {count / max(total, 1):.1%} |")
        print()


if __name__ == "__main__":
    main()
