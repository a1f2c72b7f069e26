"""The cost of checking action values at every step: the torch CartPole (auto-reset, the default CPU step) stepped
with and without the host check, in one process, alternating.

A cost of a few µs on a step of some hundred µs is below the spread of fresh-process runs on a shared machine, so
this script pairs the two in one process instead: blocks of ``--steps`` env steps, with and without the check in
turns (the order alternating from block to block), and reports the fastest and the median step time of each, the
median of the paired ratios, and the check's own time on the same actions (the fastest of five timings). On a loaded
machine the fastest block is the least disturbed. Without the check means the env's host test of the values switched
off; everything else (shape, dtype and device checks, the copy of the action) runs in both.

Usage::

    python benchmarks/action_check.py --sizes 4096 --blocks 40 --steps 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import timeit

os.environ.setdefault("RLSTRUCT_JIT_AFTER", "0")  # the steady state: the compiled CPU step from the first step

import torch  # noqa: E402

from rlstruct import DictTensor  # noqa: E402
from rlstruct.envs import CartPole  # noqa: E402


def measure(n: int, blocks: int, steps: int) -> dict[str, float]:
    env = CartPole(n, autoreset=True)
    env.reset()
    gen = torch.Generator().manual_seed(0)
    actions = [DictTensor({"action": torch.randint(0, 2, (n,), generator=gen)}) for _ in range(64)]
    spec = env._action_spec
    test = spec._host_bad

    def block() -> float:
        t = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % 64])
        return (time.perf_counter() - t) / steps

    block()
    on: list[float] = []
    off: list[float] = []
    for b in range(blocks):
        for checked in ((True, False) if b % 2 else (False, True)):
            spec._host_bad = test if checked else None
            (on if checked else off).append(block())
    spec._host_bad = test
    host = actions[0]["action"].numpy()
    alone = min(timeit.repeat(lambda: test(host), number=2000, repeat=5)) / 2000
    return {
        "step_with_check_us": 1e6 * statistics.median(on),
        "step_without_us": 1e6 * statistics.median(off),
        "fastest_with_check_us": 1e6 * min(on),
        "fastest_without_us": 1e6 * min(off),
        "paired_ratio": statistics.median(a / b for a, b in zip(on, off)),
        "check_alone_us": 1e6 * alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096], help="numbers of envs")
    parser.add_argument("--blocks", type=int, default=40, help="blocks of each kind, alternating")
    parser.add_argument("--steps", type=int, default=100, help="env steps per block")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for n in args.sizes:
        r = measure(n, args.blocks, args.steps)
        print(f"N={n}: step {r['fastest_with_check_us']:.1f} µs with the check, {r['fastest_without_us']:.1f} µs "
              f"without (fastest blocks); medians {r['step_with_check_us']:.1f} and {r['step_without_us']:.1f} µs "
              f"(paired ratio {r['paired_ratio']:.3f}); the check alone {r['check_alone_us']:.2f} µs")


if __name__ == "__main__":
    main()
