"""MinAtar on the CPU: the numba step against ``torch.compile`` of the torch rules, each in a fresh process.

Both run the same work: the auto-reset step of ``N`` envs of one game (the sticky-action and game draws, the rules,
the time limit, the restart of the finished envs) with the two frames of the step (the one it ends on and the one
the envs act on next), the rewards and the flags, actions drawn by ``torch.randint``:

* ``numba``: the compiled CPU step of ``MinAtarEnv`` (``env.kernel == "jit"``, from the first step), the kernel
  called directly (the state in place, the observations into preallocated arrays: what ``env.step_into`` runs
  under ``RL_Batcher``, without the env's checks of the action).
* ``inductor``: ``torch.compile(autoreset_step, dynamic=False)`` of the torch rules (the dense auto-reset: every env
  draws a fresh state, the finished ones take it; a graph has no data-dependent shapes), default mode.
* ``inductor max-autotune``: the same with ``mode="max-autotune-no-cudagraphs"``.
* ``inductor no-vec``: the default mode with inductor's vectorization off (``torch._inductor.config.cpp.simdlen =
  1``): its vector code for ``bool`` tensors (the frames, the brick walls) moves one byte at a time through stack
  buffers, and the scalar loops run faster on these rules.
* ``eager``: the torch step op by op (``RLSTRUCT_JIT=0``, the sparse restart), for scale.

Each process is pinned to ``--cores`` cores with as many torch threads. Steps per second are the median of three
timings of at least ``--seconds`` each, after warm-up; the compile time (the first call of the compiled step:
numba's load and compilation, or its disk cache; inductor's trace, code generation and C++ build, or its caches) is
reported separately, in seconds.

Run: python benchmarks/minatar_compile.py [--games Breakout,Seaquest] [--envs 1,64,1024,4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _fresh import Config, add_arguments, measure_or_rounds

BACKENDS = ("numba", "inductor", "inductor max-autotune", "inductor no-vec", "eager")


def _pin(cores: int) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(allowed[:cores]))
    import torch

    torch.set_num_threads(cores)


def measure(game: str, n: int, backend: str, args) -> dict:
    _pin(args.cores)
    if backend == "numba":
        os.environ["RLSTRUCT_JIT_AFTER"] = "0"
    else:
        os.environ["RLSTRUCT_JIT"] = "0"
    import torch

    from rlstruct import DictTensor
    from rlstruct.envs.minatar import MinAtarEnv
    from rlstruct.envs.minatar._env import autoreset_step

    env = MinAtarEnv(game, n, seed=0, autoreset=True)
    obs, _ = env.reset()
    n_actions = env.action_space.n
    actions = [torch.randint(0, n_actions, (n,)) for _ in range(20)]
    if backend == "numba":
        nxt, run = ({k: torch.zeros_like(v).numpy() for k, v in obs.items()} for _ in range(2))

        def one(a):
            env._step_into(a.numpy(), nxt, run)

        t0 = time.perf_counter()
        env.step(DictTensor({"action": actions[0]}))  # loads and compiles (or reads numba's cache)
        compile_s = time.perf_counter() - t0
        assert env.kernel == "jit"
    elif backend == "eager":

        def one(a):
            env.step(DictTensor({"action": a}))

        compile_s = 0.0
    else:
        if backend.endswith("no-vec"):
            import torch._inductor.config

            torch._inductor.config.cpp.simdlen = 1
        mode = "max-autotune-no-cudagraphs" if backend.endswith("max-autotune") else None
        fn = torch.compile(lambda s, a: autoreset_step(env, s, a), dynamic=False, mode=mode)
        state = dict(env._state)

        def one(a):
            nonlocal state
            state, _ = fn(state, a)

        t0 = time.perf_counter()
        one(actions[0])
        compile_s = time.perf_counter() - t0
    for a in actions[:3]:
        one(a)
    rates = []
    for _ in range(3):  # three timings of at least --seconds each, the median kept
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            for a in actions:
                one(a)
            steps += len(actions)
        rates.append(n * steps / (time.perf_counter() - t0))
    return {"env_steps_per_s": statistics.median(rates), "compile_s": compile_s,
            "kernel": env.kernel if backend in ("numba", "eager") else backend}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--games", default="Asterix,Breakout,Freeway,Seaquest,SpaceInvaders")
    parser.add_argument("--envs", default="1,64,1024,4096", help="env counts, comma-separated")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--seconds", type=float, default=1.0, help="the least time of each of the three timings")
    parser.add_argument("--cores", type=int, default=1, help="pin each process to this many cores and threads")
    add_arguments(parser)
    args = parser.parse_args(argv)
    configs = {}
    for game in args.games.split(","):
        for n in (int(x) for x in args.envs.split(",")):
            backends = args.backends.split(",")
            for backend in backends:
                against = (("of numba", f"{game} N={n} numba"),) if backend != "numba" and "numba" in backends else ()
                configs[f"{game} N={n} {backend}"] = Config(
                    lambda game=game, n=n, backend=backend: measure(game, n, backend, args), against)
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is None:
        return
    print("\n| configuration | env steps/s, median [min, max] | ratio to numba (of medians) [same-round range] "
          "| compile s, median |")
    print("|:--|--:|:--|--:|")
    from _fresh import med_range, ratio

    for name, runs in results.items():
        values = [r["env_steps_per_s"] for r in runs]
        ratios = "; ".join(ratio(values, [r["env_steps_per_s"] for r in results[base]])
                           for _, base in configs[name].against if base in results)
        compile_s = statistics.median(r["compile_s"] for r in runs)
        print(f"| {name} | {med_range(values)} | {ratios} | {compile_s:.2f} |")


if __name__ == "__main__":
    main()
