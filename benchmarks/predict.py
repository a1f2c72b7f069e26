"""The time of one ``Policy.predict`` call (one CartPole observation, numpy in and out) in fresh processes: at torch's
default thread count, at the policy's ``torch_threads`` (the run's, 1: set and restored around each call), and with
one thread set once for the process; each alone and beside a CPU burner (one busy process per core).

    python benchmarks/predict.py --rounds 3                # trains a tiny A2C CartPole run first
    python benchmarks/predict.py --run runs/a2c-CartPole-v1-0 --rounds 3
    python benchmarks/predict.py --run runs/a2c-CartPole-v1-0 --switch --seconds 20   # the switch's cost alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fresh import machine, med_range, run_one  # noqa: E402

#: name -> (what it runs, load's torch_threads, threads set once for the process before loading)
CONFIGS = {
    "default": ("torch's default threads", 0, None),
    "policy": ("the policy's torch_threads (the run's: 1), set and restored around each call", None, None),
    "set-once": ("one thread, set once for the process", 0, 1),
}


def measure(run: str, torch_threads: int | None, process_threads: int | None, seconds: float) -> dict:
    import numpy as np
    import torch

    from rlstruct.algos import load

    default = torch.get_num_threads()
    if process_threads is not None:
        torch.set_num_threads(process_threads)
    policy = load(run, torch_threads=torch_threads)
    obs = np.zeros(policy.spec.obs_shape, dtype=np.float32)
    for _ in range(200):
        policy.predict(obs)
    per_call, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(50):
            policy.predict(obs)
        per_call.append((time.perf_counter() - t0) / 50)
    return {"us_per_call": statistics.median(per_call) * 1e6, "batches": len(per_call),
            "default_threads": default, "threads_during_predict": policy.torch_threads or torch.get_num_threads(),
            "threads_after": torch.get_num_threads()}


def switch_cost(run: str, seconds: float) -> dict:
    """In one process at torch's default threads, blocks of 50 calls alternating between a policy that switches to
    one thread and back around each call and one that runs at the count the process has, set to one: the medians a
    call and the difference, what the switch costs."""
    import numpy as np
    import torch

    from rlstruct.algos import load

    default = torch.get_num_threads()
    switching, plain = load(run, torch_threads=1), load(run, torch_threads=0)
    obs = np.zeros(switching.spec.obs_shape, dtype=np.float32)
    times: dict[str, list[float]] = {"switching": [], "set-once": []}
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for name, policy in (("switching", switching), ("set-once", plain)):
            torch.set_num_threads(default if name == "switching" else 1)
            policy.predict(obs)
            t0 = time.perf_counter()
            for _ in range(50):
                policy.predict(obs)
            times[name].append((time.perf_counter() - t0) / 50)
    medians = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return {**{f"{k}_us": v for k, v in medians.items()}, "switch_us": medians["switching"] - medians["set-once"],
            "blocks": len(times["set-once"])}


def tiny_run(folder: str) -> str:
    """A 3,000-step A2C CartPole run's folder (what the measurement loads)."""
    cmd = [sys.executable, "-m", "rlstruct.algos", "train", "a2c", "--env", "CartPole-v1", "--max-env-steps",
           "3000", "--logdir", folder, "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    return folder


def burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--run", default=None, help="a run's folder (default: train a tiny A2C CartPole run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per process")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 1, help="busy processes beside (default: "
                        "one per core)")
    parser.add_argument("--switch", action="store_true", help="only the cost of the switch to one thread and back, "
                        "in one process (alternating blocks)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.switch:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(switch_cost(args.run or tiny_run(os.path.join(tmp, "run")), args.seconds)))
        return
    if args.one is not None:
        _, torch_threads, process_threads = CONFIGS[args.one]
        print(json.dumps(measure(args.run, torch_threads, process_threads, args.seconds)))
        return
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run or tiny_run(os.path.join(tmp, "run"))
        flags = ["--run", run, "--seconds", str(args.seconds)]
        cases = [(name, load) for load in ("alone", "burner") for name in CONFIGS]
        results: dict[tuple[str, str], list[dict]] = {c: [] for c in cases}
        for r in range(args.rounds):
            for name, load in cases[r % len(cases):] + cases[:r % len(cases)]:
                started = burners(args.burners) if load == "burner" else []
                try:
                    results[(name, load)].append(run_one(__file__, name, flags))
                finally:
                    for p in started:
                        p.kill()
                        p.wait()
                print(f"  round {r + 1}/{args.rounds} {name} {load}: {results[(name, load)][-1]}", file=sys.stderr,
                      flush=True)
    print(f"{machine()}; load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} rounds, {args.burners} burners")
    print("| predict, one observation | alone: us a call | beside a CPU burner: us a call | threads (default) |")
    print("|---|---|---|---|")
    for name, (what, _, _) in CONFIGS.items():
        alone, burned = results[(name, "alone")], results[(name, "burner")]
        threads = f"{alone[0]['threads_during_predict']} ({alone[0]['default_threads']})"
        print(f"| {what} | {med_range([x['us_per_call'] for x in alone])} | "
              f"{med_range([x['us_per_call'] for x in burned])} | {threads} |")


if __name__ == "__main__":
    main()
