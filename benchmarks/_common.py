"""Helpers shared by the benchmark scripts (run as ``python benchmarks/x.py``, which puts this folder on
``sys.path``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

Runner = tuple[Callable[[], None], Callable[[], None]]


def time_steps(step: Callable[[], None], sync: Callable[[], None], min_seconds: float) -> float:
    """Seconds per call of ``step``, over at least ``min_seconds`` (growing the number of calls)."""
    n = 4
    while True:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return dt / n
        n *= 2 if dt <= 0 else max(2, min(16, int(1.5 * min_seconds / dt) + 1))


def device_sync(device: str) -> Callable[[], None]:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on CUDA, nothing elsewhere."""
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def numpy_runner(env: Any, n: int, warmup: int) -> Runner:
    """Steps a numpy vector env of ``n`` CartPoles with random actions from numpy's generator (seed 0)."""
    rng = np.random.default_rng(0)

    def step() -> None:
        env.step(rng.integers(0, 2, n))

    for _ in range(warmup):
        step()
    return step, lambda: None


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Prints a right-aligned markdown table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.rjust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")


def batcher_steps_per_s(batcher: Any, iters: int, warmup: int = 1) -> float:
    """Env steps per second of ``iters`` acquisitions (``execute`` + ``get``) after ``warmup`` untimed ones (with
    ``cuda_graph``, two: the first runs eagerly, the second captures); the batcher's ``timings()`` then cover the
    timed acquisitions only. On a CUDA batcher the clock stops after the device's queued work."""
    batcher.reset()
    for _ in range(warmup):
        batcher.execute()
        batcher.get()
    batcher.reset_timings()
    t0 = time.perf_counter()
    steps = 0
    for _ in range(iters):
        batcher.execute()
        traj, _ = batcher.get()
        steps += int(traj.trajectories.lengths.sum())
    if batcher.device.type == "cuda":
        torch.cuda.synchronize(batcher.device)
    return steps / (time.perf_counter() - t0)


def best_of_rounds(rounds: int, *measures: Callable[[], float]) -> list[float]:
    """Each measure's best of ``rounds`` rounds, the measures taking turns within a round (so that a change in the
    machine's load touches every measure alike).

    >>> best_of_rounds(2, iter([1.0, 3.0]).__next__, iter([5.0, 4.0]).__next__)
    [3.0, 5.0]
    """
    best = [0.0] * len(measures)
    for _ in range(rounds):
        for i, measure in enumerate(measures):
            best[i] = max(best[i], measure())
    return best


def print_rows(rows: list[tuple[str, str, float, str]]) -> None:
    """Prints ``(part, configuration, env steps/s, ratio)`` rows as a markdown table."""
    print("\n| part | configuration | env steps/s | ratio |")
    print("|---|---|---:|---|")
    for part, label, sps, note in rows:
        print(f"| {part} | {label} | {sps:,.0f} | {note} |")


def logging_nowhere(model: Any) -> Any:
    """``model``, a Stable-Baselines3 algorithm, with a logger that writes nowhere; returned. Its default logger
    (``verbose=0`` too) makes an empty ``SB3-<date and time>`` folder in the temp folder at each ``learn`` and never
    removes it; the benchmarks read the model's progress through their callbacks instead."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
    return model
