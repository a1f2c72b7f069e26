"""The update clock of the learner comparisons (learner_peers_dqn.py, learner_peers_sac.py): a learner's rate from
its update calls alone. No torch at import: the comparisons' parent process only starts the fresh processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class UpdateClock:
    """Times a learner from its update calls alone: :meth:`wrap` wraps its update function, counts the FLOPs of the
    first call (``torch.utils.flop_counter``; untimed), then marks the wall and process CPU time at the start of every
    later call and adds up each call's thread CPU time (with one torch thread, the update's own work).

    A cycle is ``calls_per_cycle`` update calls and the collection between two cycles; :meth:`window` spans the whole
    cycles from the first timed call to the start of the last whole cycle's successor, so that a run's start-up and
    its end (a final evaluation, a checkpoint) stay out of the rate.
    """

    def __init__(self, calls_per_cycle: int):
        self.calls_per_cycle = calls_per_cycle
        self.update_cpu, self.flops = 0.0, None
        self.starts: list[tuple[float, float]] = []  # (wall, process CPU) at the start of each timed call

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        from torch.utils.flop_counter import FlopCounterMode

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self.flops is None:
                with FlopCounterMode(display=False) as counter:
                    out = fn(*args, **kwargs)
                self.flops = counter.get_total_flops()
                return out
            self.starts.append((time.perf_counter(), time.process_time()))
            c0 = time.thread_time()
            out = fn(*args, **kwargs)
            self.update_cpu += time.thread_time() - c0
            return out
        return wrapped

    def window(self) -> tuple[int, float, float]:
        """``(cycles, wall seconds, process CPU seconds)`` of the whole timed cycles.

        Raises:
            ValueError: fewer timed calls than one whole cycle.
        """
        cycles = (len(self.starts) - 1) // self.calls_per_cycle
        if cycles < 1:
            raise ValueError(f"{len(self.starts)} timed update calls, not a whole cycle; pass a larger --steps")
        (w0, c0), (w1, c1) = self.starts[0], self.starts[cycles * self.calls_per_cycle]
        return cycles, w1 - w0, c1 - c0
