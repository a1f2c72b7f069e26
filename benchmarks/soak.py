"""Soak test of RL_Batcher(restart_workers=...): a long collection while worker processes are SIGKILLed at random.

A training-shaped loop (update the weights, execute, get) runs for ``--minutes`` over ``--workers`` worker processes
of the torch CartPole (``--envs`` each, auto-reset, ``--timesteps`` steps an acquisition) with a small MLP policy,
while a thread SIGKILLs a random worker at exponentially distributed intervals (mean ``--kill-every`` seconds).
Every failure is left to ``restart_workers``. It reports:

* env steps delivered, acquisitions, kills sent and restarts made (every kill must become exactly one restart);
* steps lost: every acquisition must deliver all of its ``B x T`` steps (a killed worker's rows are collected again
  by its replacement), so what is lost is at most the killed workers' rows of the acquisitions they died in,
  ``restarts x envs x T`` (the steps they had taken before dying, thrown away); the check is that delivered steps
  are exactly ``acquisitions x B x T``;
* the learner's RSS and the workers' summed RSS, sampled over time (first, peak, last sample: flat means no leak);
* open file descriptors, /dev/shm entries and child processes before the batcher was built and after it closed
  (back to the start means nothing leaked; a warm-up batcher first starts what multiprocessing keeps for the
  interpreter's life, its resource tracker and resource-sharer listener).

Not in CI: it runs for minutes by design.

Run: python benchmarks/soak.py [--minutes 20] [--workers 4] [--envs 64] [--timesteps 32] [--kill-every 20]
     [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from multiprocessing import resource_tracker

import numpy as np
import torch

from rlstruct import DictTensor, RL_Agent
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import CartPole


class MLPAgent(RL_Agent):
    """A 4-64-2 MLP sampling CartPole actions from its own seeded generator; ``update`` loads weights."""

    def __init__(self):
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
        self.generator = torch.Generator()

    def seed(self, seed):
        self.generator.manual_seed(seed)

    def update(self, state_dict):
        self.net.load_state_dict(state_dict)

    def __call__(self, state, observation, agent_info, history=None):
        with torch.no_grad():
            probs = torch.softmax(self.net(observation["frame"]), dim=-1)
        action = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return DictTensor({"action": action}), state


def make_env(n_envs: int, seed: int) -> CartPole:
    return CartPole(n_envs=n_envs, seed=seed, autoreset=True, max_episode_steps=500)


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def resources() -> dict[str, list[str]]:
    """What a leak would grow: this process's open fds (what they point to), /dev/shm entries, live child
    processes (their command lines)."""
    fds = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            fds.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:  # the descriptor listdir itself opened, closed since
            pass
    children = []
    for pid in _children():
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                children.append(f"{pid}: {f.read().replace(chr(0), ' ')[:100]}")
        except OSError:
            pass
    return {"fds": fds, "dev_shm": sorted(os.listdir("/dev/shm")), "children": children}


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[1] == me and fields[0] != "Z":
                    out.append(int(pid))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    return out


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Killer(threading.Thread):
    """SIGKILLs a random live worker every ``Exp(mean)`` seconds until stopped."""

    def __init__(self, batcher: RL_Batcher, mean_s: float, seed: int):
        super().__init__(daemon=True)
        self.batcher, self.mean_s = batcher, mean_s
        self.rng = np.random.default_rng(seed)
        self.stop = threading.Event()
        self.kills: list[tuple[float, int]] = []
        self.killed: set[int] = set()

    def run(self) -> None:
        while not self.stop.wait(self.rng.exponential(self.mean_s)):
            pids = [r["pid"] for r in self.batcher.worker_reports()]
            pid = int(self.rng.choice(pids))
            # Killed already and not replaced yet (a killed process takes a while to die): a second kill would not
            # be a second fault.
            if pid in self.killed or not _running(pid):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills.append((time.monotonic(), pid))
                self.killed.add(pid)
            except ProcessLookupError:
                pass


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--envs", type=int, default=64, help="envs per worker")
    p.add_argument("--timesteps", type=int, default=32)
    p.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between kills")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)

    learner = MLPAgent()
    B, T = args.workers * args.envs, args.timesteps
    # multiprocessing keeps a resource tracker (a process and a pipe) and, once shared memory has been sent to a
    # worker, a resource-sharer listener (a socket) for the interpreter's life: a short warm-up batcher starts
    # them before the "before" counts, so that what differs at the end is the soaked batcher's.
    resource_tracker.ensure_running()
    with RL_Batcher(T, MLPAgent, {}, make_env, {"n_envs": args.envs}, 1, [args.seed]) as warm:
        warm.reset()
        warm.execute()
        warm.get()
    time.sleep(0.5)
    before = resources()
    batcher = RL_Batcher(T, MLPAgent, {}, make_env, {"n_envs": args.envs}, args.workers,
                         [args.seed + k for k in range(args.workers)],
                         agent_seeds=[1000 + args.seed + k for k in range(args.workers)], restart_workers=10**9)
    killer = Killer(batcher, args.kill_every, args.seed)
    samples: list[tuple[float, float, float]] = []  # (seconds, learner RSS, workers' RSS)
    delivered = acquisitions = 0
    t0 = time.monotonic()
    next_sample = t0
    try:
        batcher.reset()
        killer.start()
        while time.monotonic() - t0 < args.minutes * 60:
            # Weights change every iteration, as in training: a restarted worker must get the latest.
            with torch.no_grad():
                for q in learner.net.parameters():
                    q.add_(0.001 * torch.randn_like(q))
            batcher.update({k: v.clone() for k, v in learner.net.state_dict().items()})
            batcher.execute()
            traj, _ = batcher.get()
            delivered += int(traj.trajectories.lengths.sum())
            acquisitions += 1
            now = time.monotonic()
            if now >= next_sample:
                workers = sum(rss_mb(r["pid"]) for r in batcher.worker_reports())
                samples.append((now - t0, rss_mb(os.getpid()), workers))
                next_sample = now + args.sample_every
        killer.stop.set()
        killer.join()
        # A worker killed after the last get() has not been seen yet: one more call meets it and replaces it.
        batcher.update({k: v.clone() for k, v in learner.net.state_dict().items()})
    finally:
        killer.stop.set()
        killer.join()
        elapsed = time.monotonic() - t0
        restarts = list(batcher.restarts)
        batcher.close()
    time.sleep(0.5)  # let the last killed workers be reaped
    after = resources()

    lost_bound = len(restarts) * args.envs * T
    kills = killer.kills
    result = {
        "minutes": elapsed / 60, "workers": args.workers, "envs_per_worker": args.envs, "timesteps": T,
        "kill_every_s": args.kill_every, "acquisitions": acquisitions, "env_steps_delivered": delivered,
        "env_steps_expected": acquisitions * B * T, "env_steps_per_s": delivered / elapsed, "kills": len(kills),
        "restarts": len(restarts),
        "restarts_during": {d: sum(r.during == d for r in restarts) for d in ("get", "reset", "update")},
        "steps_lost_at_most": lost_bound,
        "learner_rss_mb": {"first": samples[0][1], "peak": max(s[1] for s in samples), "last": samples[-1][1]},
        "workers_rss_mb": {"first": samples[0][2], "peak": max(s[2] for s in samples), "last": samples[-1][2]},
        "before": before, "after": after, "rss_samples": samples,
    }
    # Every kill must show up as one restart, whose cause names the killed pid.
    causes = " ".join(r.cause for r in restarts)
    result["kills_without_restart"] = [pid for _, pid in kills if f"(pid {pid})" not in causes]
    print(json.dumps({k: v for k, v in result.items() if k not in ("rss_samples", "before", "after")}, indent=1))
    for key in before:
        print(f"{key}: {len(before[key])} before, {len(after[key])} after",
              "" if before[key] == after[key] else f"(new: {sorted(set(after[key]) - set(before[key]))})")
    ok = delivered == acquisitions * B * T and len(restarts) == len(kills) and after == before
    print("checks:", "OK" if ok else "FAILED", "(every acquisition delivered B x T steps; every kill restarted; fds, "
          "/dev/shm and children back to the start)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
