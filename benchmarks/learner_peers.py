"""PPO's CPU learner beside the peers a user would pick instead: env steps/s, learning included, on MinAtar Breakout.

Every configuration runs in a fresh process (``benchmarks/_fresh.py``: the order rotated over rounds, the median and
the range reported) with the ``ppo-minatar-5m`` preset's hyperparameters (64 envs x 128 steps = 8,192 env steps an
iteration, 4 epochs of 8 minibatches of 1,024, lr 5e-4, gamma 0.999, GAE 0.95, clip 0.2, entropy 0.01, value 0.5,
gradient norm 0.5) and the MinAtar CNN (conv 16x3x3, linear 128, policy and value heads), at one and at two compute
threads:

* ``rlstruct``: ``rlstruct train ppo --preset ppo-minatar-5m`` on the torch ``MinAtar/Breakout-v1`` (the compiled
  CPU step from the first step), through the training loop and its loop timer, evaluation off;
* ``rlstruct-nchw``: the same with the CNN encoder's maps flattened in (C, H, W) order, a copy of the
  channels-last maps forward and backward (the encoder before it flattened large batches in memory order);
* ``rlstruct-critic``: the same with PPO's values computed as before the agents recorded them (the critic's
  forward over the collection's 8,192 frames and 8,192 next frames before the epochs);
* ``cleanrl``: ``benchmarks/_cleanrl_ppo.py``, a CleanRL-style single-file torch PPO on the same torch env;
* ``rlstruct-bf16`` and ``cleanrl-bf16``: the same two with the network's forwards under bfloat16 autocast
  (rlstruct's ``--autocast bfloat16``; the peer given the same ``torch.autocast`` by hand, which CleanRL lacks);
* ``rejax``: rejax's PPO (``pip install rejax``, a ``peers`` extra) on gymnax's ``Breakout-MinAtar``, the whole
  training one ``jax.jit``-compiled function, its actor and critic each the same CNN (rejax's PPO keeps the two
  networks apart: two CNN passes a minibatch where the others share one), evaluation off. Its compile time is
  reported apart from the rate; gymnax's Breakout has no sticky actions.

Each configuration runs ``--warmup`` untimed iterations first (allocations, the compiled env step; for rejax the
compile) and reports env steps/s over the next ``--iterations``, the cores it kept busy (process CPU seconds per wall
second over them) and its start-up seconds (to the first timed iteration; rejax: the compile alone). Threads: torch's
``set_num_threads``; XLA's CPU thread pool limited by ``intra_op_parallelism_threads`` with Eigen's multi-threading
off for one thread, left as it is for two (this machine has two cores).

Usage::

    python benchmarks/learner_peers.py [--iterations 12] [--warmup 1] [--rounds 3] [--only rlstruct-1t,cleanrl-1t]
    python benchmarks/learner_peers.py --profile [--iterations 4]   # per-phase time of rlstruct's learner
    python benchmarks/learner_peers.py --xla-probe   # XLA's CNN gradient alone and inside a lax.scan
"""

from __future__ import annotations

import argparse
import functools
import os
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
    print_results,
    selected,
)

ENV = "MinAtar/Breakout-v1"
PRESET = "ppo-minatar-5m"
N_ENVS, N_STEPS = 64, 128  # the preset's: 8,192 env steps an iteration
PEERS = ("rlstruct", "rlstruct-bf16", "rlstruct-nchw", "rlstruct-critic", "cleanrl", "cleanrl-bf16", "rejax")
THREADS = (1, 2)


def measure_rlstruct(iterations: int, warmup: int, threads: int, *, n_envs: int = N_ENVS, profile: str | None = None,
                     autocast: str = "none") -> dict:
    """``rlstruct train ppo --preset ppo-minatar-5m`` (``n_envs`` envs) for ``warmup + iterations`` iterations; the
    loop timer's env steps/s over the last ``iterations``. With ``profile``, the learner's phases under cProfile,
    written there; ``autocast`` is the run's setting."""
    import torch

    from rlstruct.algos import validate
    from rlstruct.algos._train.loops import train_on_policy
    from rlstruct.algos._train.registry import algorithm
    from rlstruct.batchers.profile import COLLECT, LoopTimer

    t_start = time.perf_counter()
    marks: dict[str, float] = {}

    class Timer(LoopTimer):
        def __call__(self, name):
            if name == COLLECT and self._started == self.warmup:  # the first timed iteration starts
                marks["t0"], marks["c0"] = time.perf_counter(), time.process_time()
            return super().__call__(name)

    timer = Timer(torch.device("cpu"), sync=False, warmup=warmup)
    description = algorithm("ppo")
    with tempfile.TemporaryDirectory(prefix="learner-peers-") as logdir:
        config = description.config_cls(
            env=ENV, preset=PRESET, logdir=logdir, progress=False, tensorboard=False, time_limit=1e9,
            n_evaluation_envs=1, eval_every=2**31 - 1, evaluation_max_steps=10, torch_threads=threads,
            autocast=autocast, n_envs=n_envs, max_env_steps=(warmup + iterations) * n_envs * N_STEPS)
        setup = validate(config)
        if setup.config.n_envs != n_envs:  # a preset fills the fields left at their defaults
            raise ValueError(f"--n-envs must differ from PPO's default to take effect, got {n_envs}; the run took "
                             f"{setup.config.n_envs}")
        if profile is None:
            train_on_policy(setup, timer=timer)
        else:
            import cProfile

            with cProfile.Profile() as prof:
                train_on_policy(setup, timer=timer)
            prof.dump_stats(profile)
    wall = time.perf_counter() - marks["t0"]
    report = timer.report(1, {})
    seconds = report.seconds
    return {"steps_per_s": report.steps_per_s, "cores": (time.process_time() - marks["c0"]) / wall,
            "warmup_s": marks["t0"] - t_start, "learn_share": seconds["learn"] / sum(seconds.values()),
            "us_per_step": {k: v / report.env_steps * 1e6 for k, v in seconds.items() if v > 0}}


def measure_cleanrl(iterations: int, warmup: int, threads: int, *, n_envs: int = N_ENVS, bf16: bool = False) -> dict:
    """``benchmarks/_cleanrl_ppo.py``'s training (``n_envs`` envs) for ``warmup + iterations`` iterations (``bf16``:
    under autocast)."""
    from benchmarks._cleanrl_ppo import Args, train

    return train(iterations, warmup, threads, Args(n_envs=n_envs, n_steps=N_STEPS), bf16=bf16)


def _rejax_cnn_networks(n_actions: int):
    """rejax's discrete policy and value network with the MinAtar CNN as their trunk (rejax builds MLPs)."""
    from flax import linen as nn
    from rejax.networks import DiscretePolicy, VNetwork

    class MinAtarCNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(16, (3, 3), padding="VALID")(x))
            return nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))

    class CNNPolicy(DiscretePolicy):
        def setup(self):
            self.features = MinAtarCNN()
            self.action_logits = nn.Dense(self.action_dim)

    class CNNValue(VNetwork):
        @nn.compact
        def __call__(self, obs):
            return nn.Dense(1)(MinAtarCNN()(obs)).squeeze(1)

    return (CNNPolicy(n_actions, hidden_layer_sizes=(), activation=nn.relu),
            CNNValue(hidden_layer_sizes=(), activation=nn.relu))


def measure_rejax(iterations: int, warmup: int, threads: int, *, n_envs: int = N_ENVS) -> dict:
    """rejax's PPO on gymnax's Breakout-MinAtar (``n_envs`` envs), the training of ``iterations`` iterations compiled
    (timed apart) and then run; ``warmup`` is not used (the compile is the warm-up)."""
    if threads == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from rejax import PPO

    t_start = time.perf_counter()
    batch = n_envs * N_STEPS
    algo = PPO.create(env="Breakout-MinAtar", num_envs=n_envs, num_steps=N_STEPS, num_epochs=4, num_minibatches=8,
                      learning_rate=5e-4, gamma=0.999, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
                      max_grad_norm=0.5, total_timesteps=iterations * batch, eval_freq=batch,
                      skip_initial_evaluation=True)
    actor, critic = _rejax_cnn_networks(algo.action_space.n)
    algo = algo.replace(actor=actor, critic=critic, eval_callback=lambda algo, ts, rng: jnp.zeros(()))
    compiled = jax.jit(algo.train).lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.perf_counter() - t_start
    t0, c0 = time.perf_counter(), time.process_time()
    ts, _ = compiled(jax.random.PRNGKey(0))
    jax.block_until_ready(ts)
    wall = time.perf_counter() - t0
    return {"steps_per_s": iterations * batch / wall, "cores": (time.process_time() - c0) / wall,
            "warmup_s": compile_s}


def measure_rlstruct_nchw(iterations: int, warmup: int, threads: int, *, n_envs: int = N_ENVS) -> dict:
    """``measure_rlstruct`` with the CNN encoder's maps always flattened in (C, H, W) order (a copy of the
    channels-last maps, forward and backward), as the encoder did before it flattened large batches in memory
    order."""
    use_the_plain_encoder()
    return measure_rlstruct(iterations, warmup, threads, n_envs=n_envs)


def use_the_plain_encoder() -> None:
    """Makes the CNN encoder the registered chain in this process: the frames as they come (seen as NCHW), no
    channels-last layout on the CPU, the maps flattened in (C, H, W) order. ``-nchw`` rows, here and in
    ``learner_peers_dqn.py``, measure the encoder's layout choices against it."""
    from rlstruct.algos.encoders import CNNEncoder, _to_float

    def forward(self, frame):
        x = _to_float(frame, self.scale)
        return self.linear(self.convs(x.permute(0, 3, 1, 2) if self.channels_last else x))

    CNNEncoder.forward = forward


def measure_rlstruct_critic(iterations: int, warmup: int, threads: int, *, n_envs: int = N_ENVS) -> dict:
    """``measure_rlstruct`` with PPO's values computed as before the agents recorded them: the critic's forward over
    the collection's frames and next frames (2 x 8,192) before the epochs."""
    from rlstruct.algos.networks import EncoderActorCritic

    EncoderActorCritic.value_at_acting = False
    return measure_rlstruct(iterations, warmup, threads, n_envs=n_envs)


def xla_scan_probe(repeats: int = 3) -> None:
    """Prints the MinAtar CNN's gradient (flax, 1,024 frames) as one jitted call and as each step of a jitted
    ``lax.scan`` over 8 minibatches (rejax's update loop: scans over minibatches, epochs and iterations)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    from flax import linen as nn

    class MinAtarCNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(16, (3, 3), padding="VALID")(x))
            return nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1)))).sum()

    frames = (jax.random.uniform(jax.random.PRNGKey(0), (8, 1024, 10, 10, 4)) < 0.2).astype("float32")
    model = MinAtarCNN()
    params = model.init(jax.random.PRNGKey(0), frames[0])
    grad = jax.grad(lambda p, x: model.apply(p, x))

    def scanned(p, xs):  # a plain SGD step a minibatch: the scan carries the parameters
        return jax.lax.scan(lambda p, x: (jax.tree.map(lambda a, g: a - 1e-3 * g, p, grad(p, x)), None), p, xs)[0]

    for label, fn, arg, n in (("one jitted call", jax.jit(grad), frames[0], 1),
                              ("a step of a jitted scan of 8", jax.jit(scanned), frames, 8)):
        jax.block_until_ready(fn(params, arg))
        t0 = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(fn(params, arg))
        ms = (time.perf_counter() - t0) / (repeats * n) * 1e3
        print(f"the CNN's gradient over 1,024 frames, {label}: {ms:.1f} ms")


MEASURES = {"rlstruct": measure_rlstruct, "rlstruct-bf16": functools.partial(measure_rlstruct, autocast="bfloat16"),
            "rlstruct-nchw": measure_rlstruct_nchw, "rlstruct-critic": measure_rlstruct_critic,
            "cleanrl": measure_cleanrl,
            "cleanrl-bf16": functools.partial(measure_cleanrl, bf16=True), "rejax": measure_rejax}


def configs(args: argparse.Namespace) -> dict[str, Config]:
    out = {}
    for threads in THREADS:
        for peer in PEERS:
            name = f"{peer}-{threads}t"
            against = () if peer == "rlstruct" else (("of rlstruct's", f"rlstruct-{threads}t"),)
            iterations = args.rejax_iterations if peer == "rejax" else args.iterations
            out[name] = Config(lambda p=peer, t=threads, n=iterations: MEASURES[p](n, args.warmup, t,
                                                                                   n_envs=args.n_envs),
                               against=against)
    return selected(out, args.only)


def profile_rlstruct(args: argparse.Namespace) -> None:
    """cProfile of rlstruct's run on the same budget, one thread: the learner's phases and the top functions."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="learner-profile-") as folder:
        path = os.path.join(folder, "prof")
        result = measure_rlstruct(args.iterations, args.warmup, 1, n_envs=args.n_envs, profile=path)
        print(f"{result['steps_per_s']:,.0f} env steps/s under cProfile; each phase's wall us an env step "
              "(the loop timer's, timed iterations only):")
        for phase, us in sorted(result["us_per_step"].items(), key=lambda kv: -kv[1]):
            print(f"  {phase:>16} {us:8.1f}")
        pstats.Stats(path).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--iterations", type=int, default=12, help="timed iterations (8,192 env steps at 64 envs)")
    parser.add_argument("--rejax-iterations", type=int, default=2,
                        help="rejax's timed iterations (its rate is steady from the first: one compiled step each)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--n-envs", type=int, default=N_ENVS,
                        help=f"envs of every configuration (default: the preset's {N_ENVS}); fewer make smaller "
                             f"iterations of {N_STEPS} steps an env (tests)")
    parser.add_argument("--only", default="", help="comma-separated configuration names, e.g. rlstruct-1t,rejax-2t")
    parser.add_argument("--profile", action="store_true", help="profile rlstruct's run instead (cProfile)")
    parser.add_argument("--xla-probe", action="store_true",
                        help="time XLA's CNN gradient alone and inside a lax.scan instead (why rejax is slow here)")
    add_arguments(parser, rounds=3)
    args = parser.parse_args()
    compiled_cpu_steps()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.profile:
        profile_rlstruct(args)
        return
    if args.xla_probe:
        xla_scan_probe()
        return
    cfgs = configs(args)
    results = measure_or_rounds(__file__, cfgs, args)
    if results is not None:
        print_results(results, cfgs, "steps_per_s", "env steps/s incl. learning",
                      note=lambda r: f"{r['cores']:.2f} cores busy, start-up {r['warmup_s']:.1f} s")
        # the same per second of the process's CPU: what the load changes less (one thread: one core at most)
        for runs in results.values():
            for r in runs:
                r["steps_per_cpu_s"] = r["steps_per_s"] / r["cores"]
        print_results(results, cfgs, "steps_per_cpu_s", "env steps per CPU second")


if __name__ == "__main__":
    main()
