"""Each configuration of a benchmark in a fresh process: the harness the benchmark scripts share.

A ratio taken in one warm process depends on what ran before (glibc's dynamic mmap threshold, caches, compiled
kernels, a thread pool already up), so every configuration here runs as ``python SCRIPT --one NAME ...`` in a new
interpreter, the order rotated from round to round (so that a drift of the machine's load touches every
configuration alike), and the report gives the median and the range over rounds.

A script using it answers ``--one NAME`` by measuring that configuration alone and printing one JSON object as its last
stdout line. The simplest use: :func:`add_arguments` on the script's parser, a ``{name: Config}`` dict built from its
parsed flags (the same in the parent and in every child), and :func:`measure_or_rounds`, which either measures
``--one`` here or runs every configuration in fresh processes with the parent's own flags; :func:`print_results`
prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def compiled_cpu_steps() -> None:
    """Makes the torch simulators step with their compiled CPU kernels from the first step, in this process and the
    ones it starts (a value already set wins): a throughput figure is the steady state, while a run moves to those
    kernels only after ``RLSTRUCT_JIT_AFTER`` env steps (65,536 by default: see ``rlstruct.envs._jit``)."""
    os.environ.setdefault("RLSTRUCT_JIT_AFTER", "0")


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


@dataclass(frozen=True)
class Config:
    """One configuration: what measures it (in a fresh process; returns a JSON-able dict) and the rows it is compared
    with, as ``(label, name)`` pairs: the table gives ``median(this) / median(name)`` beside the label."""

    measure: Callable[[], dict[str, Any]]
    against: tuple[tuple[str, str], ...] = ()


def timed_acquisitions(batcher: Any, seconds: float, warm_up: int = 3, before: Callable[[], Any] | None = None
                       ) -> tuple[int, float]:
    """``(acquisitions, seconds)``: ``batcher``'s ``execute``/``get`` pairs run back to back for about ``seconds``,
    after ``warm_up`` untimed ones (allocations, the compiled CPU kernels) and ``before()``, if given."""
    for _ in range(warm_up):
        batcher.execute()
        batcher.get()
    if before is not None:
        before()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batcher.execute()
        batcher.get()
        n += 1
    return n, time.perf_counter() - t0


def paired_configs(envs: Sequence[str], processes: Sequence[int], labels: tuple[str, str], against: str,
                   measure: Callable[[str, int, bool], dict[str, Any]]) -> dict[str, Config]:
    """An A/B table: ``"{env} {in process | K workers} {label}"`` for every env, process count (0: in process) and
    the two ``labels``; ``measure(env, n_processes, second)`` measures one, and each second configuration is compared
    with its first under the label ``against``."""
    configs = {}
    for env in envs:
        for n_processes in processes:
            where = "in process" if n_processes == 0 else f"{n_processes} workers"
            for second, label in enumerate(labels):
                configs[f"{env} {where} {label}"] = Config(
                    lambda env=env, n_processes=n_processes, second=bool(second): measure(env, n_processes, second),
                    against=((against, f"{env} {where} {labels[0]}"),) if second else (),
                )
    return configs


def add_arguments(parser: argparse.ArgumentParser, rounds: int = 3) -> None:
    """Adds ``--rounds`` and the harness's hidden ``--one NAME`` to ``parser``."""
    parser.add_argument("--rounds", type=int, default=rounds,
                        help="rounds, each configuration in a fresh process per round, the order rotated")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)


def selected(configs: Mapping[str, Config], only: str) -> dict[str, Config]:
    """The configurations named in ``only`` (comma-separated, a script's ``--only``); all of them when it is empty.

    >>> list(selected({"a": Config(dict), "b": Config(dict), "c": Config(dict)}, "c,a"))
    ['a', 'c']
    """
    names = set(only.split(",")) if only else None
    return {k: v for k, v in configs.items() if names is None or k in names}


def forwarded(argv: Sequence[str], parent_only: Sequence[str] = ("--rounds",)) -> list[str]:
    """The parent's flags to hand each fresh process: ``argv`` less the flags in ``parent_only`` and their values.

    >>> forwarded(["--iters", "3", "--rounds", "2", "--sizes", "64", "--rounds=4"])
    ['--iters', '3', '--sizes', '64']
    """
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg.split("=", 1)[0] in parent_only:
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def measure_or_rounds(script: str, configs: Mapping[str, Config], args: argparse.Namespace,
                      argv: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]] | None:
    """With ``args.one``: measures that configuration in this process, prints its JSON and returns ``None``.

    Otherwise prints the command, the machine and the load average, runs every configuration ``args.rounds`` times in
    fresh processes (``python script --one NAME`` and the parent's flags, less ``--rounds``), prints the load average
    at the end and returns each configuration's results in round order.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if args.one is not None:
        print(json.dumps(configs[args.one].measure()), flush=True)
        return None
    print(f"python benchmarks/{os.path.basename(script)} {shlex.join(argv)}".rstrip())
    print(f"# {machine()}")
    print(f"# load average at the start: {load_average()}", flush=True)
    results = rotated_rounds(script, list(configs), args.rounds, forwarded(argv))
    print(f"# load average at the end: {load_average()}")
    return results


def ratio(num: Sequence[float], den: Sequence[float]) -> str:
    """``median(num) / median(den)`` and, in brackets, the range of the same-round ratios ``num[r] / den[r]``.

    >>> ratio([2.0, 4.0, 3.0], [1.0, 2.0, 2.0])
    '1.50x [1.50, 2.00]'
    """
    rounds = [a / b for a, b in zip(num, den) if b]
    if not rounds:
        return "-"
    return f"{statistics.median(num) / statistics.median(den):.2f}x [{min(rounds):.2f}, {max(rounds):.2f}]"


def median_run(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is closest to the median of ``runs``' (to quote its other fields)."""
    mid = statistics.median(r[key] for r in runs)
    return min(runs, key=lambda r: abs(r[key] - mid))


def print_results(results: Mapping[str, Sequence[dict[str, Any]]], configs: Mapping[str, Config], key: str,
                  header: str = "env steps/s", *, fmt: str = "{:,.0f}",
                  note: Callable[[dict[str, Any]], str] | None = None) -> None:
    """Prints one row per configuration: ``key``'s median [min, max] over rounds, the ratios to the rows in its
    ``against`` (median over median, [range of the same-round ratios]), and ``note`` of its median run."""
    print(f"\n| configuration | {header}, median [min, max] | ratio (of medians) [same-round range] |"
          + (" notes (median run) |" if note else ""))
    print("|:--|--:|:--|" + (":--|" if note else ""))
    for name, runs in results.items():
        values = [r[key] for r in runs]
        ratios = "; ".join(f"{ratio(values, [r[key] for r in results[base]])} {label}"
                           for label, base in configs[name].against if base in results)
        extra = f" {note(median_run(runs, key))} |" if note else ""
        print(f"| {name} | {med_range(values, fmt)} | {ratios} |{extra}")
