"""PPO's CPU learner on MinAtar Breakout: where an iteration's time goes, and what each learner option saves.

Every configuration runs in a fresh process (``benchmarks/_fresh.py``: the order rotated over rounds, the median and
the range reported), one torch thread, the ``ppo-minatar`` preset's settings (32 envs x 64 steps, 4 epochs of 4
minibatches) on the torch ``MinAtar/Breakout-v1``, its compiled CPU step from the first step. Each trains
``--iterations`` iterations after ``--warmup`` untimed ones (allocations; the compiled update's compilation) through
``rlstruct train``'s on-policy loop with its loop timer, and reports:

* ``learn us/sample``: the learn step's wall seconds per sample and epoch (``n_epochs`` passes over 2,048 samples);
* ``collect us/step``: the collection's wall seconds (env step, policy forward, buffer writes) per env step;
* ``steps/s``: env steps per second, learning included;
* the same in CPU seconds of the learner's thread (one torch thread: the work runs there), which a loaded machine
  changes less than wall time; the table compares configurations by it.

The configurations: ``eager`` (the preset as it is), ``two-pass`` (the loss's policy and value as two calls, each
through the shared CNN, which ``EncoderActorCritic.policy_value`` makes one), ``compile`` (``--compile-update``:
inductor on the CPU), ``bf16`` (``--autocast bfloat16``), ``mb2`` and ``mb8`` (2 or 8 minibatches a pass:
minibatches of 1,024 or 256),
and the microbenchmarks ``encoder as-is``/``encoder relu-copy``/``encoder contiguous``/``encoder
channels-last`` (the MinAtar CNN's forward and backward over a minibatch of 512 frames: the encoder as it is, the
same with its ReLUs allocating their output instead of running in place, the ``[N, H, W, C]`` frames made
NCHW-contiguous first, or the network and the frames in channels-last memory format) and ``policy no_grad``/
``policy inference_mode`` (the collection's forward of 32 frames under each mode). The encoder rows also give
their FLOPs per CPU second, beside ``gemm``: one thread's float32 matrix product at the shape of the encoder's largest
layer, the most its FLOPs could run at.

Run: python benchmarks/ppo_learner.py [--iterations 8] [--warmup 2] [--rounds 3] [--only eager,compile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._fresh import (  # noqa: E402
    Config,
    add_arguments,
    compiled_cpu_steps,
    measure_or_rounds,
    ratio,
    selected,
)

ENV = "MinAtar/Breakout-v1"
#: config field -> value of each training configuration, over the ppo-minatar preset
VARIANTS: dict[str, dict] = {
    "eager": {},
    "two-pass": {},
    "compile": {"compile_update": True},
    "bf16": {"autocast": "bfloat16"},
    "mb2": {"n_minibatches": 2},
    "mb8": {"n_minibatches": 8},
}


def _cpu_timer(warmup: int):
    """A loop timer that also keeps the thread CPU seconds of the counted iterations' learn and collect phases: with
    one torch thread the work runs on this thread, and its CPU time changes less than wall time with the load."""
    from contextlib import contextmanager

    import torch

    from rlstruct.batchers.profile import COLLECT, LoopTimer

    class CpuLoopTimer(LoopTimer):
        cpu = {"learn": 0.0, COLLECT: 0.0}

        @contextmanager
        def __call__(self, name):
            t0 = time.thread_time()
            with super().__call__(name):
                yield
            if name in self.cpu and self._started > self.warmup:
                self.cpu[name] += time.thread_time() - t0

    return CpuLoopTimer(torch.device("cpu"), sync=False, warmup=warmup)


def measure_training(name: str, iterations: int, warmup: int) -> dict:
    """Trains PPO on Breakout for ``warmup + iterations`` iterations with the loop timer (the first ``warmup`` not
    counted) and returns the phases' seconds per sample."""
    import torch

    from rlstruct.algos._train.loops import train_on_policy
    from rlstruct.algos._train.registry import algorithm
    from rlstruct.algos._train.session import validate

    variant = VARIANTS[name]
    if name == "two-pass":
        from rlstruct.algos.networks import EncoderActorCritic

        # the loss's forward as two calls, each through the shared encoder: what policy_value saves
        EncoderActorCritic.policy_value = lambda self, frame: (self.policy(frame), self.value(frame))
    threads = variant.get("torch_threads", 1)
    torch.set_num_threads(threads)
    description = algorithm("ppo")
    timer = _cpu_timer(warmup)
    with tempfile.TemporaryDirectory(prefix="ppo-learner-") as logdir:
        config = description.config_cls(
            env=ENV, preset="ppo-minatar", logdir=logdir, progress=False, tensorboard=False, time_limit=1e9,
            n_evaluation_envs=1, eval_every=2**31 - 1, evaluation_max_steps=10,
            max_env_steps=(warmup + iterations) * 2048, **variant)
        setup = validate(description, config)
        train_on_policy(setup, timer=timer)
    report = timer.report(1, {})
    seconds = report.seconds
    samples = iterations * 2048
    collect = sum(seconds[k] for k in ("env_step", "agent_forward", "buffer_write", "copy", "wait", "gather"))
    epochs = setup.config.n_epochs
    return {"learn_cpu_us_per_sample": timer.cpu["learn"] / (samples * epochs) * 1e6,
            "collect_cpu_us_per_step": timer.cpu["collect"] / samples * 1e6,
            "learn_us_per_sample": seconds["learn"] / (samples * epochs) * 1e6,
            "collect_us_per_step": collect / samples * 1e6,
            "steps_per_s": report.steps_per_s,
            "learn_share": seconds["learn"] / sum(seconds.values())}


def _minatar_cnn(channels_last: bool):
    import torch

    from rlstruct.algos.encoders import CNNEncoder

    torch.manual_seed(0)
    enc = CNNEncoder((10, 10, 4), obs_dtype="bool")
    head = torch.nn.Linear(enc.out_dim, 4)
    model = torch.nn.Sequential(enc, head)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def _per_sample(step, rows: int, seconds: float, *, warmup: int = 5, flops: float | None = None) -> dict:
    """Calls ``step()`` ``warmup`` times untimed, then for about ``seconds``: the wall and thread-CPU microseconds a
    call takes per each of its ``rows`` samples, and, given one call's ``flops``, their rate per CPU second."""
    for _ in range(warmup):
        step()
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
    out = {"cpu_us_per_sample": cpu / (n * rows) * 1e6, "us_per_sample": wall / (n * rows) * 1e6}
    if flops is not None:
        out["gflop_per_cpu_s"] = flops * n / cpu / 1e9
    return out


def measure_encoder(mode: str, seconds: float = 3.0) -> dict:
    """The MinAtar CNN's forward and backward over 512 frames, repeated for about ``seconds``, and its FLOPs per CPU
    second (``torch.utils.flop_counter``'s count of one pass)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    model = _minatar_cnn(mode == "channels-last")
    frames = torch.rand(512, 10, 10, 4) < 0.2
    if mode in ("as-is", "relu-copy"):
        for layer in model.modules():  # relu-copy: the ReLUs allocate their output, as before they ran in place
            if isinstance(layer, torch.nn.ReLU):
                layer.inplace = mode == "as-is"
        forward = model
    else:
        enc, head = model[0], model[1]

        def forward(x):
            x = x.permute(0, 3, 1, 2).contiguous() if mode == "contiguous" else x.permute(0, 3, 1, 2)
            x = x.float()
            if mode == "channels-last":
                x = x.contiguous(memory_format=torch.channels_last)
            return head(enc.linear(enc.convs(x)))
    def step():
        forward(frames).square().mean().backward()

    with FlopCounterMode(display=False) as flops:
        step()
    return _per_sample(step, 512, seconds, flops=flops.get_total_flops())


def measure_gemm(seconds: float = 3.0) -> dict:
    """The CPU's float32 matrix product on one thread at the shape of the encoder's largest layer over 512 frames
    (``[512, 1024] @ [1024, 128]``, as many FLOPs as each of its backward's two products): the rate the learner's
    FLOPs could run at, at best."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(512, 1024), torch.randn(1024, 128)
    return _per_sample(lambda: a @ b, 512, seconds, flops=2 * 512 * 1024 * 128)


def measure_policy(mode: str, seconds: float = 3.0) -> dict:
    """The collection's forward: the actor-critic's logits and value for 32 frames, under ``torch.no_grad`` or
    ``torch.inference_mode``."""
    import torch

    torch.set_num_threads(1)
    model = _minatar_cnn(False)
    frames = torch.rand(32, 10, 10, 4) < 0.2
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with context():
        return _per_sample(lambda: model(frames), 32, seconds, warmup=20)


def configs(args: argparse.Namespace) -> dict[str, Config]:
    out = {name: Config(lambda name=name: measure_training(name, args.iterations, args.warmup),
                        against=(() if name == "eager" else (("against eager", "eager"),)))
           for name in VARIANTS}
    for mode in ("as-is", "relu-copy", "contiguous", "channels-last"):
        out[f"encoder {mode}"] = Config(lambda m=mode: measure_encoder(m),
                                        against=(() if mode == "as-is" else (("against as-is", "encoder as-is"),)))
    out["gemm"] = Config(measure_gemm)
    for mode in ("no_grad", "inference_mode"):
        out[f"policy {mode}"] = Config(lambda m=mode: measure_policy(m),
                                       against=(() if mode == "no_grad" else (("against no_grad", "policy no_grad"),)))
    return selected(out, args.only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--iterations", type=int, default=8, help="timed iterations of 2,048 env steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    add_arguments(parser, rounds=3)
    args = parser.parse_args()
    compiled_cpu_steps()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfgs = configs(args)
    results = measure_or_rounds(__file__, cfgs, args)
    if results is None:
        return
    print("| configuration | learn CPU us/sample | learn wall us/sample | collect CPU us/step | steps/s (wall) | "
          "GFLOP per CPU s | against (CPU) |")
    print("|:--|--:|--:|--:|--:|--:|:--|")
    for name, rounds in results.items():
        def med(key):
            values = [r[key] for r in rounds if key in r]
            return f"{statistics.median(values):,.1f} [{min(values):,.1f}, {max(values):,.1f}]" if values else "-"
        cpu, wall = (("learn_cpu_us_per_sample", "learn_us_per_sample") if "learn_us_per_sample" in rounds[0]
                     else ("cpu_us_per_sample", "us_per_sample"))
        against = "; ".join(
            f"{label}: {ratio([r[cpu] for r in results[other]], [r[cpu] for r in rounds])} faster"
            for label, other in cfgs[name].against if other in results)
        cells = [med(cpu), med(wall), med("collect_cpu_us_per_step"), med("steps_per_s"), med("gflop_per_cpu_s")]
        print(f"| {name} | " + " | ".join(cells) + f" | {against} |")


if __name__ == "__main__":
    main()
