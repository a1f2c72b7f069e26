"""Five seeds as one population against five solo runs: the learner's step (``--micro``).

``--micro`` measures one gradient step of all five seeds, three ways, each configuration in a fresh process
(``benchmarks/_fresh.py``: the order rotated over rounds, the median and the range), one torch thread, in CPU time of
that thread (steady under the load of other processes on the machine) and in wall time:

* ``solo x5``: five networks, each with its own Adam, one step after another (what five solo runs do);
* ``vmap``: a :class:`~rlstruct.algos.population.Population` with ``implementation="vmap"``, the whole loss of a
  member under ``torch.vmap`` (:meth:`~rlstruct.algos.population.Population.map`);
* ``batched``: ``implementation="batched"`` (batched linear layers, grouped convolutions), the loss of the members'
  outputs under ``torch.vmap``.

The population steps are one backward over the summed member losses, per-member gradient clipping
(:meth:`~rlstruct.algos.population.Population.clip_grad_norms`) and one fused Adam step over the stacked parameters
(:class:`~rlstruct.algos.population.PopulationAdam`): the same work as the five solo steps.

Workloads: DQN's gradient step on MinAtar Breakout (the ``dqn-minatar`` preset's network, a batch of 32: the online
network on the frames with gradients, on the next frames without, the target network on the next frames, the Huber
loss, clipping at 10) and PPO's minibatch step on CartPole (the ``ppo-cartpole`` preset's sizes: 64-64 tanh MLPs, 32
envs x 32 steps in 2 minibatches of 512, clipping at 0.5). Peak memory is the growth of the process's peak resident
set over the workload (the networks, the optimizers, the batches and the steps), after the imports.

Run: nice -n 5 python benchmarks/population.py --micro [--rounds 3] [--steps 200] [--members 5] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fresh import Config, add_arguments, measure_or_rounds, med_range, ratio, selected  # noqa: E402

WORKLOADS = ("DQN MinAtar Breakout batch 32", "PPO CartPole minibatch 512")
WAYS = ("solo x5", "vmap", "batched")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _timed(step, steps: int, warmup: int = 10) -> dict:
    """Milliseconds of thread CPU and of wall time per call of ``step``, over ``steps`` calls after ``warmup``."""
    for _ in range(warmup):
        step()
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        step()
    return {"cpu_ms": (time.thread_time() - c0) / steps * 1e3, "wall_ms": (time.perf_counter() - t0) / steps * 1e3}


def _dqn(way: str, n: int, steps: int) -> dict:
    import torch
    from torch.nn.utils import clip_grad_norm_

    from rlstruct.algos import EnvSpec
    from rlstruct.algos.dqn import dqn_loss
    from rlstruct.algos.harness import seeded_model
    from rlstruct.algos.networks import make_adam
    from rlstruct.algos.population import Population, PopulationAdam
    from rlstruct.algos.qnetworks import q_network

    torch.set_num_threads(1)
    before = _peak_mib()
    spec = EnvSpec((10, 10, 4), "bool", 3, 10_000)
    models = [seeded_model(s, q_network, spec, (64, 64)) for s in range(n)]
    targets = [seeded_model(s, q_network, spec, (64, 64)).requires_grad_(False) for s in range(n)]
    g = torch.Generator().manual_seed(0)
    obs, next_obs = (torch.rand(n, 32, 10, 10, 4, generator=g) < 0.1 for _ in range(2))
    action, ret = torch.randint(3, (n, 32), generator=g), torch.rand(n, 32, generator=g)
    discount = torch.full((n, 32), 0.99)

    def loss_of(q, a, r, d, q_online, q_target):
        return dqn_loss(q, a, r, d, q_online, q_target)[0]

    if way == "solo x5":
        optimizers = [make_adam(m, 2.5e-4, "cpu") for m in models]

        def step():
            for k, (m, t, opt) in enumerate(zip(models, targets, optimizers)):
                q = m(obs[k])
                with torch.no_grad():
                    q_online, q_target = m(next_obs[k]), t(next_obs[k])
                loss = loss_of(q, action[k], ret[k], discount[k], q_online, q_target)
                opt.zero_grad()
                loss.backward()
                clip_grad_norm_(list(m.parameters()), 10.0)
                opt.step()
    else:
        pop, target = Population(models, implementation=way), Population(targets, implementation=way)
        optimizer = PopulationAdam(pop, 2.5e-4)
        batch = {"obs": obs, "action": action, "ret": ret, "discount": discount, "next_obs": next_obs}

        def member_loss(m, b, q_target):
            q = m(b["obs"])
            with torch.no_grad():
                q_online = m(b["next_obs"])
            return loss_of(q, b["action"], b["ret"], b["discount"], q_online, q_target)

        def losses():
            with torch.no_grad():
                q_target = target(next_obs)
            if way == "vmap":
                return pop.map(member_loss, batch, q_target)
            q = pop(obs)
            with torch.no_grad():
                q_online = pop(next_obs)
            return torch.vmap(loss_of)(q, action, ret, discount, q_online, q_target)

        def step():
            loss = losses().sum()
            optimizer.zero_grad()
            loss.backward()
            pop.clip_grad_norms(10.0)
            optimizer.step()

    return {**_timed(step, steps), "peak_mib": _peak_mib() - before}


def _ppo(way: str, n: int, steps: int) -> dict:
    import functools

    import torch
    from torch.nn.utils import clip_grad_norm_

    from rlstruct.algos import EnvSpec
    from rlstruct.algos.harness import seeded_model
    from rlstruct.algos.networks import build_actor_critic, make_adam
    from rlstruct.algos.population import Population, PopulationAdam
    from rlstruct.algos.ppo import PPOConfig, ppo_loss, ppo_minibatch_loss

    torch.set_num_threads(1)
    before = _peak_mib()
    config = PPOConfig()
    rows = config.n_envs * config.n_steps // config.n_minibatches
    spec = EnvSpec((4,), "float32", 2, 500)
    models = [seeded_model(s, build_actor_critic, spec, config.hidden_sizes) for s in range(n)]
    g = torch.Generator().manual_seed(0)
    batch = {"frame": torch.randn(n, rows, 4, generator=g), "action": torch.randint(2, (n, rows), generator=g),
             "old_log_prob": torch.full((n, rows), -0.69), "advantage": torch.randn(n, rows, generator=g),
             "old_value": torch.randn(n, rows, generator=g), "mask": torch.ones(n, rows)}
    batch["returns"] = batch["advantage"] + batch["old_value"]
    settings = {"clip_coef": config.clip_coef, "value_clip": config.value_clip, "value_coef": config.value_coef,
                "entropy_coef": config.entropy_coef, "normalize_advantages": config.normalize_advantages}

    if way == "solo x5":
        optimizers = [make_adam(m, config.lr, "cpu", eps=config.adam_eps) for m in models]

        def step():
            for k, (m, opt) in enumerate(zip(models, optimizers)):
                loss, _ = ppo_minibatch_loss(m, config, {key: v[k] for key, v in batch.items()})
                opt.zero_grad()
                loss.backward()
                clip_grad_norm_(list(m.parameters()), config.max_grad_norm)
                opt.step()
    else:
        pop = Population(models, implementation=way)
        optimizer = PopulationAdam(pop, config.lr, eps=config.adam_eps)
        loss_of = functools.partial(ppo_loss, **settings)

        def losses():
            if way == "vmap":
                return pop.map(lambda m, b: ppo_minibatch_loss(m, config, b)[0], batch)
            dist, value = pop.call("policy_value", batch["frame"])
            return torch.vmap(lambda *x: loss_of(*x)[0])(
                dist.log_prob(batch["action"]), batch["old_log_prob"], batch["advantage"], value, batch["old_value"],
                batch["returns"], dist.entropy(), batch["mask"])

        def step():
            loss = losses().sum()
            optimizer.zero_grad()
            loss.backward()
            pop.clip_grad_norms(config.max_grad_norm)
            optimizer.step()

    return {**_timed(step, steps), "peak_mib": _peak_mib() - before}


def configs(args: argparse.Namespace) -> dict[str, Config]:
    """``WORKLOAD: WAY`` for both workloads and the three ways, each population compared with the solo steps."""
    measures = dict(zip(WORKLOADS, (_dqn, _ppo)))
    out = {}
    for workload, measure in measures.items():
        for way in WAYS:
            against = () if way == "solo x5" else (("faster than solo x5", f"{workload}: solo x5"),)
            out[f"{workload}: {way}"] = Config(
                lambda m=measure, w=way: m(w, args.members, args.steps), against=against)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--micro", action="store_true", help="the learner's step of five seeds, three ways")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per configuration (after 10 untimed)")
    parser.add_argument("--members", type=int, default=5, help="seeds in the population")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not args.micro:
        parser.error("only the learner's step is measured yet: pass --micro")
    chosen = selected(configs(args), args.only)
    results = measure_or_rounds(__file__, chosen, args, argv)
    if results is None:
        return
    print(f"\n| configuration | CPU ms per step of all {args.members}, median [min, max] | CPU time vs solo x5 "
          "(of medians) [same-round range] | wall ms per step | peak memory growth (MiB) |")
    print("|:--|--:|:--|--:|--:|")
    for name, runs in results.items():
        cpu = [r["cpu_ms"] for r in runs]
        vs = "; ".join(f"{ratio([r['cpu_ms'] for r in results[base]], cpu)} {label}"
                       for label, base in chosen[name].against if base in results)
        print(f"| {name} | {med_range(cpu, '{:.2f}')} | {vs} | {med_range([r['wall_ms'] for r in runs], '{:.2f}')} "
              f"| {med_range([r['peak_mib'] for r in runs], '{:.1f}')} |")


if __name__ == "__main__":
    main()
