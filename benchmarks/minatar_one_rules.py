"""A MinAtar game's rules written once (for the torch and the numba step) against the two copies of a revision.

A game whose ``rules`` module is written in the shared vocabulary (``rlstruct.envs.minatar._batched``) has its
compiled CPU step compiled from those very functions (``rlstruct.envs.minatar._scalar``). This compares, for the
games given, its two steps with those of the revision ``--baseline``, where the game had two copies (``rules.py``
over batched tensors, ``kernel.py`` for numba); the baseline's two files are read from git and imported as
modules of their own:

* ``numba``: the compiled auto-reset step of ``MinAtarEnv`` (state in place, the observations into preallocated
  arrays: what ``step_into`` runs), this tree's against the same loop (``_jit_driver._autoreset``) calling the
  baseline's ``kernel.py``;
* ``torch``: the torch step op by op (``RLSTRUCT_JIT=0``: ``env.step``, CPU eager, one torch thread), this tree's
  ``rules.py`` against the baseline's (the env's ``game`` swapped).

Each configuration runs in a fresh process (the order rotated each round, see ``_fresh``); inside it the two
variants step the same env in turn, ``--pairs`` times each, every timing at least ``--seconds`` of the thread's CPU
time (the machine may be loaded by others: CPU time counts this thread's work only). A round's figure is the median
over its pairs; the table gives the median and the range over rounds of env steps per CPU second, and of the ratio
new / baseline.

Run: python benchmarks/minatar_one_rules.py [--games Breakout] [--envs 64,1024] [--rounds 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from _fresh import machine, med_range, rotated_rounds

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "c0fd688"


def _baseline_module(rev: str, game: str, part: str) -> types.ModuleType:
    """``rlstruct/envs/minatar/_<game>/<part>.py`` at ``rev``, imported as a module of its own (its file kept in a
    folder per revision, so that numba's disk cache of it is reused from process to process)."""
    text = subprocess.run(["git", "show", f"{rev}:rlstruct/envs/minatar/_{game}/{part}.py"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    # A baseline kernel imports the baseline's rules (imported first), not this tree's.
    text = text.replace(f"from rlstruct.envs.minatar._{game}.rules import", f"from baseline_{game}_rules import")
    folder = Path(tempfile.gettempdir()) / f"rlstruct-one-rules-{rev}"
    folder.mkdir(exist_ok=True)
    name = f"baseline_{game}_{part}"
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _baseline_loop(kernel: types.ModuleType, game: str):
    """The driver's auto-reset loop calling the baseline's kernel functions (as ``_jit_driver.autoreset`` built it)."""
    from rlstruct.envs.minatar import _jit_driver

    digest = hashlib.sha1(Path(kernel.__file__).read_bytes()).hexdigest()[:16]
    scope = {**_jit_driver._autoreset.__globals__, "_reset": kernel.reset, "_step": kernel.step,
             "_observe": kernel.observe}
    fn = types.FunctionType(_jit_driver._autoreset.__code__, scope, "autoreset")
    fn.__qualname__ = f"autoreset_{game}_baseline_{digest}"
    return _jit_driver._jit(fn)


def _cpu_rate(step, actions, n: int, seconds: float) -> float:
    """Env steps per CPU second of this thread: ``step(a)`` over ``actions`` in turn, for at least ``seconds``."""
    k, t0 = 0, time.thread_time()
    while True:
        for a in actions:
            step(a)
        k += len(actions)
        spent = time.thread_time() - t0
        if spent >= seconds:
            return n * k / spent


def measure(game: str, n: int, path: str, args) -> dict:
    """The two variants of one configuration, ``--pairs`` interleaved timings each, in this process."""
    if path == "numba":
        os.environ["RLSTRUCT_JIT_AFTER"] = "0"
    else:
        os.environ["RLSTRUCT_JIT"] = "0"
    import torch

    torch.set_num_threads(1)
    from rlstruct import DictTensor
    from rlstruct.envs.minatar import GAMES, MinAtarEnv

    minatar_name = GAMES[game][0]
    # Each variant steps an env of its own: the baseline's env runs the baseline's game (and, for numba, its
    # kernel's loop over its own state arrays), whose state layout may differ from this tree's.
    envs = {"new": MinAtarEnv(game, n, seed=0, autoreset=True), "baseline": MinAtarEnv(game, n, seed=0, autoreset=True)}
    base_rules = _baseline_module(args.baseline, minatar_name, "rules")
    envs["baseline"].game = base_rules.GAME
    obs = {name: env.reset()[0] for name, env in envs.items()}
    gen = torch.Generator().manual_seed(0)
    actions = [torch.randint(0, envs["new"].action_space.n, (n,), generator=gen) for _ in range(16)]
    if path == "numba":
        from rlstruct.envs.minatar import _jit_driver

        bufs = {name: tuple({k: torch.zeros_like(v).numpy() for k, v in obs[name].items()} for _ in range(2))
                for name in envs}
        kernel = _baseline_module(args.baseline, minatar_name, "kernel")
        base = envs["baseline"]
        base._jit_step = _jit_driver.CompiledStep(base, tuple("game/" + k for k in kernel.STATE_KEYS))
        base._jit_step.loop = _baseline_loop(kernel, minatar_name)
        for env in envs.values():
            env.step(DictTensor({"action": actions[0]}))  # loads and compiles (or reads numba's cache)
            assert env.kernel == "jit"
        host = [a.numpy() for a in actions]

        def variant(name):
            env, (nxt, run) = envs[name], bufs[name]

            def one(a):
                env._step_into(a, nxt, run)
            return one, host
    else:
        wrapped = [DictTensor({"action": a}) for a in actions]

        def variant(name):
            return envs[name].step, wrapped
    rates: dict[str, list[float]] = {"new": [], "baseline": []}
    for name in rates:  # warm-up: compile (or load) both, allocate
        one, acts = variant(name)
        _cpu_rate(one, acts, n, 0.05)
    for p in range(args.pairs):
        for name in (("new", "baseline") if p % 2 == 0 else ("baseline", "new")):
            one, acts = variant(name)
            rates[name].append(_cpu_rate(one, acts, n, args.seconds))
    new, base = statistics.median(rates["new"]), statistics.median(rates["baseline"])
    return {"new": new, "baseline": base, "ratio": new / base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--games", default="Breakout")
    parser.add_argument("--envs", default="64,1024")
    parser.add_argument("--paths", default="numba,torch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--one", default=None)
    args = parser.parse_args()
    if args.one is not None:
        game, n, path = args.one.split(":")
        print(json.dumps(measure(game, int(n), path, args)))
        return
    names = [f"{g}:{n}:{p}" for g in args.games.split(",") for p in args.paths.split(",")
             for n in args.envs.split(",")]
    flags = ["--pairs", str(args.pairs), "--seconds", str(args.seconds), "--baseline", args.baseline]
    results = rotated_rounds(__file__, names, args.rounds, flags, skip_failed=False)
    print(machine())
    print(f"{'config':28s} {'new env steps/CPU s':>30s} {'baseline':>30s} {'new / baseline':>22s}")
    for name, rows in results.items():
        print(f"{name:28s} {med_range([r['new'] for r in rows]):>30s} {med_range([r['baseline'] for r in rows]):>30s}"
              f" {med_range([r['ratio'] for r in rows], '{:.3f}'):>22s}")


if __name__ == "__main__":
    main()
