"""The replay buffer at Atari scale: sampled-batch speed in memory and on disk, and the memory of a full buffer.

Two parts, every configuration in a fresh process:

- ``sample``: a buffer of ``--capacity`` transitions of Atari frames (``uint8 [4, 84, 84]``, each frame stored once)
  filled through its own add path (``push_steps`` of 3-step windows of 8 envs, as the ``dqn-atari`` preset's
  learner pushes them, ``--rollout`` steps at a time), in memory and on disk (memory-mapped files: the page cache
  holds what was just written, so this is the speed of a buffer whose files fit in the cache; beyond it, the disk's
  reads add to it), then ``--iters`` draws of a batch of 32: microseconds per batch. One torch thread.
- ``fill``: ``--fill-capacity`` transitions (the preset's 1M) filled to ``--fill-fraction``: the buffer's bytes, the
  process's peak RSS (``ru_maxrss``) and the fill rate.

The frames are synthetic: a pool of random 84x84 frames cycled through, stacked four at a time as ale-py stacks them
(zero frames before an episode's first), episodes ending with probability ``1 / --episode-length`` a step.

Usage::

    python benchmarks/replay.py                                   # sample (3 rounds) and fill
    python benchmarks/replay.py --part fill --fill-fraction 1.0
"""

from __future__ import annotations

import argparse
import resource
import shlex
import tempfile
import time

import torch
from _fresh import Config, add_arguments, machine, measure_or_rounds, print_results, run_one

from rlstruct.algos import EnvSpec
from rlstruct.algos.replay import NStepWindow, ReplayBuffer
from rlstruct.structures import TemporalDictTensor

SPEC = EnvSpec((4, 84, 84), "uint8", 4, 27_000)
N_ENVS, N_STEP, POOL = 8, 3, 4096


class SyntheticAtari:
    """``N_ENVS`` auto-reset envs of stacked 84x84 frames drawn from a pool, as the batcher records them."""

    def __init__(self, episode_length: int, rollout: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.rollout = rollout
        self.pool = torch.randint(0, 256, (POOL, 84, 84), dtype=torch.uint8, generator=g)
        self.g, self.p_end = g, 1.0 / episode_length
        self.newest = torch.arange(N_ENVS) * 997  # each env's newest frame (a global counter)
        self.start = self.newest.clone()  # the first frame of each env's episode

    def _stacks(self, newest: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        k = newest[..., None] - torch.arange(3, -1, -1)
        return torch.where((k >= start[..., None])[..., None, None], self.pool[k % POOL], 0)

    def window(self) -> TemporalDictTensor:
        obs, nxt, done = [], [], torch.rand(N_ENVS, self.rollout, generator=self.g) < self.p_end
        for t in range(self.rollout):  # a loop over steps, each over every env at once
            obs.append(self._stacks(self.newest, self.start))
            nxt.append(self._stacks(self.newest + 1, self.start))
            self.newest = self.newest + 1 + done[:, t]  # an episode end: its terminal frame, then a fresh one
            self.start = torch.where(done[:, t], self.newest, self.start)
        return TemporalDictTensor({
            "observation/frame": torch.stack(obs, 1), "_observation/frame": torch.stack(nxt, 1),
            "action/action": torch.randint(0, 4, (N_ENVS, self.rollout), generator=self.g),
            "_observation/reward": torch.zeros(N_ENVS, self.rollout), "_observation/done": done,
            "_observation/terminated": done})


def fill(buffer: ReplayBuffer, transitions: int, episode_length: int, rollout: int) -> float:
    """Pushes ``transitions`` transitions, ``rollout`` steps of every env at a time; returns the seconds it took."""
    env, window = SyntheticAtari(episode_length, rollout), NStepWindow(0.99, N_STEP)
    t = time.perf_counter()
    while buffer._n_pushed < transitions:
        buffer.push_steps(**window.steps(env.window()))
    return time.perf_counter() - t


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def measure_sample(storage: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        buffer = ReplayBuffer.for_spec(SPEC, args.capacity, "cpu", storage=storage, folder=folder)
        fill(buffer, args.capacity, args.episode_length, args.rollout)
        for _ in range(50):
            buffer.sample(32)
        t = time.perf_counter()
        for _ in range(args.iters):
            batch = buffer.sample(32)
        us = (time.perf_counter() - t) / args.iters * 1e6
        assert batch["obs"].shape == (32, 4, 84, 84) and batch["obs"].dtype == torch.uint8
        buffer.close()
    return {"us_per_batch": us, "capacity": args.capacity}


def measure_fill(args: argparse.Namespace) -> dict:
    before = peak_rss_gb()
    buffer = ReplayBuffer.for_spec(SPEC, args.fill_capacity, "cpu")
    transitions = int(args.fill_capacity * args.fill_fraction)
    seconds = fill(buffer, transitions, args.episode_length, args.rollout)
    return {"capacity": args.fill_capacity, "filled": len(buffer), "buffer_gb": buffer.nbytes() / 1e9,
            "bytes_per_transition": buffer.nbytes() / args.fill_capacity, "frames": buffer.store.n_frames,
            "frames_per_transition": buffer.store.n_frames / max(len(buffer), 1),
            "peak_rss_gb": peak_rss_gb(), "rss_before_gb": before, "fill_transitions_per_s": transitions / seconds}


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)  # as a learner beside env workers runs; on a shared machine, spinning threads cost more
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--part", choices=("all", "sample", "fill"), default="all")
    parser.add_argument("--capacity", type=int, default=50_000, help="transitions of the sample part's buffers")
    parser.add_argument("--iters", type=int, default=2_000, help="batches of 32 timed")
    parser.add_argument("--fill-capacity", type=int, default=1_000_000, help="transitions of the fill part's buffer")
    parser.add_argument("--fill-fraction", type=float, default=0.6, help="fraction of it filled")
    parser.add_argument("--episode-length", type=int, default=200, help="mean steps of a synthetic episode")
    parser.add_argument("--rollout", type=int, default=64, help="steps of every env per push (the preset's: 4)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    configs = {"memory": Config(lambda: measure_sample("memory", args)),
               "disk": Config(lambda: measure_sample("disk", args), against=(("of memory", "memory"),)),
               "fill": Config(lambda: measure_fill(args))}
    if args.one is not None or args.part == "sample":
        if args.one is None:
            configs.pop("fill")
        results = measure_or_rounds(__file__, configs, args)
        if results is not None:
            print_results(results, configs, "us_per_batch", "microseconds per batch of 32", fmt="{:,.1f}")
        return
    if args.part == "all":
        sample = {k: v for k, v in configs.items() if k != "fill"}
        results = measure_or_rounds(__file__, sample, args)
        print_results(results, sample, "us_per_batch", "microseconds per batch of 32", fmt="{:,.1f}")
    else:
        print(f"# {machine()}")
    fill_args = ["--fill-capacity", str(args.fill_capacity), "--fill-fraction", str(args.fill_fraction),
                 "--episode-length", str(args.episode_length), "--rollout", str(args.rollout)]
    print(f"\nfill ({shlex.join(fill_args)}):", run_one(__file__, "fill", fill_args))


if __name__ == "__main__":
    main()
