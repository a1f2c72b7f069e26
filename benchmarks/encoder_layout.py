"""The CNN encoder's memory layout at the minibatches of DQN and PQN: row-major maps after the MinAtar conv, or not.

On the CPU the encoder runs its convolutions on channels-last maps (oneDNN's gradients are faster there). A minibatch
of at most ``out_dim`` rows (DQN's 32-64 frames, PQN's 128) flattens the maps with a copy into the first linear
layer's (C, H, W) order, and the ReLU before it then meets, in its backward, a gradient laid out unlike its output:
a strided elementwise pass. ``CNNEncoder`` lays the MinAtar conv's output out row by row before its norm and ReLU
instead (the same copy, taken earlier). This script measures both layouts, each configuration in a fresh process
(``benchmarks/_fresh.py``: the order rotated over rounds, the median and the range), one torch thread, in CPU time of
the thread:

* ``encoder``: the encoder and a linear head as DQN's gradient step uses them: a forward and backward with gradients,
  then two forwards without (the online and target networks on the next frames);
* ``dqn step``: ``DQNLearner.gradient_step`` with the ``dqn-minatar`` preset's batch of 64 from a filled replay buffer
  (sampling, the three forwards, the Huber loss, backward, clipping, Adam).

Each workload runs with ``row-major`` (the maps laid out row by row after the last conv) and ``channels-last`` (kept
channels-last until the flattening): the MinAtar CNN does the first (before, the second), the Nature CNN (Atari) the
second, where the copy's place made no measurable difference.

Run: python benchmarks/encoder_layout.py [--rounds 3] [--seconds 3] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fresh import Config, add_arguments, measure_or_rounds, ratio, selected  # noqa: E402

#: workload (no commas: --only splits on them) -> (frame shape, minibatch, the encoder's LayerNorm (PQN's CNN))
WORKLOADS = {
    "MinAtar Breakout (4 channels) at 64": ((10, 10, 4), 64, False),
    "MinAtar Seaquest (10 channels) at 64": ((10, 10, 10), 64, False),
    "MinAtar Seaquest with PQN's LayerNorm CNN at 128": ((10, 10, 10), 128, True),
    "Atari (Nature CNN) at 32": ((4, 84, 84), 32, False),
}
#: the DQN gradient steps measured: workload -> channels
DQN_STEPS = {"DQN gradient step on MinAtar Breakout": 4, "DQN gradient step on MinAtar Seaquest": 10}
LAYOUTS = ("row-major", "channels-last")


def _set_layout(model, layout: str) -> None:
    """Lays the maps of every encoder in ``model`` out row by row after its last conv (``row-major``), or keeps them
    channels-last until the flattening copies them (``channels-last``), whatever the encoder does by itself."""
    from torch import nn

    from rlstruct.algos.encoders import CNNEncoder

    for module in model.modules():
        if isinstance(module, CNNEncoder):
            last_conv = max(i for i, layer in enumerate(module._map_layers) if isinstance(layer, nn.Conv2d))
            module._row_major_after = last_conv if layout == "row-major" else None


def _default_layout(shape: tuple[int, ...]) -> str:
    """The layout ``CNNEncoder`` picks for frames of ``shape`` (the MinAtar CNN row-major, the Nature CNN not)."""
    from rlstruct.algos.encoders import CNNEncoder

    return "row-major" if CNNEncoder(shape)._row_major_after is not None else "channels-last"


def _timed(step, seconds: float, warmup: int = 20) -> dict:
    """Thread-CPU milliseconds a call of ``step`` takes: the minimum over five slices of about ``seconds / 5``."""
    for _ in range(warmup):
        step()
    best = float("inf")
    for _ in range(5):
        n, t0, c0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - t0 < seconds / 5:
            step()
            n += 1
        best = min(best, (time.thread_time() - c0) / n * 1e3)
    return {"cpu_ms": best}


def measure_encoder(workload: str, layout: str, seconds: float) -> dict:
    import torch
    from torch import nn

    from rlstruct.algos.encoders import CNNEncoder

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape, batch, layer_norm = WORKLOADS[workload]
    minatar = shape[0] == 10
    model = nn.Sequential(CNNEncoder(shape, obs_dtype="uint8", obs_high=1 if minatar else 255, layer_norm=layer_norm),
                          nn.Linear(128 if minatar else 512, 6))
    _set_layout(model, layout)
    frames = torch.randint(2 if minatar else 256, (batch, *shape), dtype=torch.uint8)

    def step():
        model(frames).square().mean().backward()
        with torch.no_grad():
            model(frames)
            model(frames)

    return _timed(step, seconds)


def measure_dqn_step(channels: int, layout: str, seconds: float) -> dict:
    import torch

    from rlstruct.algos import EnvSpec
    from rlstruct.algos.dqn import DQNConfig, DQNLearner
    from rlstruct.algos.replay import ReplayBuffer

    torch.set_num_threads(1)
    spec = EnvSpec((10, 10, channels), "uint8", 3, 10_000, obs_high=1)
    learner = DQNLearner(DQNConfig(batch_size=64, lr=2.5e-4), spec, None, device=torch.device("cpu"), seed=0,
                         n_rows=8)
    _set_layout(learner.policy, layout)
    _set_layout(learner.target, layout)
    buffer = ReplayBuffer(100_000, (10, 10, channels), "cpu", obs_dtype=torch.uint8, seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        frames = (torch.rand(512, 10, 10, channels, generator=g) < 0.1).to(torch.uint8)
        buffer.push(frames, torch.randint(3, (512,), generator=g), torch.rand(512, generator=g), frames.roll(1, 0),
                    torch.ones(512))
    return _timed(lambda: learner.gradient_step(buffer), seconds)


def configs(args: argparse.Namespace) -> dict[str, Config]:
    """``WORKLOAD: LAYOUT`` for every workload and layout, the encoder's own layout marked ``(as it is)`` and compared
    with the other."""
    workloads = {w: (shape, lambda lay, w=w: measure_encoder(w, lay, args.seconds))
                 for w, (shape, _, _) in WORKLOADS.items()}
    workloads.update({w: ((10, 10, c), lambda lay, c=c: measure_dqn_step(c, lay, args.seconds))
                      for w, c in DQN_STEPS.items()})
    out = {}
    for workload, (shape, measure) in workloads.items():
        own = _default_layout(shape)
        other = next(lay for lay in LAYOUTS if lay != own)
        out[f"{workload}: {own} (as it is)"] = Config(lambda m=measure, lay=own: m(lay),
                                                     against=((f"faster than {other}", f"{workload}: {other}"),))
        out[f"{workload}: {other}"] = Config(lambda m=measure, lay=other: m(lay))
    return selected(out, args.only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds a configuration")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    add_arguments(parser, rounds=3)
    args = parser.parse_args()
    cfgs = configs(args)
    results = measure_or_rounds(__file__, cfgs, args)
    if results is None:
        return
    print("\n| configuration | CPU ms a call, median [min, max] | ratio (of medians) [same-round range] |")
    print("|:--|--:|:--|")
    for name, rounds in results.items():
        values = [r["cpu_ms"] for r in rounds]
        # a ratio of the other layout's time over this one's: above 1, this layout is faster
        against = "; ".join(f"{ratio([r['cpu_ms'] for r in results[other]], values)} {label}"
                            for label, other in cfgs[name].against if other in results)
        print(f"| {name} | {statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}] | {against} |")


if __name__ == "__main__":
    main()
