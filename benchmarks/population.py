"""Five seeds as one population against five solo runs: the learner's step (``--micro``) and whole runs
(``--runs``).

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

``--runs`` measures whole training runs end to end, with the ``rlstruct`` command in subprocesses: a five-seed
population (``rlstruct train ALGO --seeds 0,1,2,3,4``, one process) against the same five seeds as solo runs
(``--seed S``) one after another and two at a time (two processes at once: a 2-core machine's parallelism), every
run at the preset's settings, one torch thread (``--torch-threads 1``), a fixed env-step budget a seed
(``--no-stop-at-reward-threshold``: every run spends it) and the preset's evaluations. Each configuration is one
fresh process of this script that launches its runs (``benchmarks/_fresh.py``'s rotation over rounds) and reports:

* the wall time from the first launch to the last run's end, and the env steps per second of all seeds together
  (the env steps the runs' ``summary.json`` files count, over that wall time);
* the runs' CPU time (user and system, ``wait4``'s, their workers' included) and env steps per CPU second: on a
  machine that other processes load, a process waits for a core, and CPU time does not count the wait;
* the peak memory: the largest sum of the resident sets of the processes alive at once (each run's process and its
  workers, sampled every 0.1 s), and the largest resident set of one process (``wait4``'s ``ru_maxrss``).

Workloads (``--workloads``): ``ppo-cartpole`` (CartPole-v1, 51,200 env steps a seed), ``ppo-minatar`` (MinAtar
Breakout, 65,536), ``dqn-minatar`` (MinAtar Breakout, 15,000, of which the first 5,000 fill the buffer before any
gradient step) and ``sac-mujoco`` (Hopper-v5, 10,000; the population's envs in five worker processes,
``--n-processes 5``, each solo run's in one); ``--budget-scale`` multiplies the budgets.

Run: nice -n 5 python benchmarks/population.py --micro [--rounds 3] [--steps 200] [--members 5] [--only NAME,...]
     nice -n 5 python benchmarks/population.py --runs [--workloads ppo-cartpole,...] [--rounds 2] [--budget-scale 1]
     nice -n 5 python benchmarks/population.py --scores ROOT [--workloads ppo-cartpole,dqn-cartpole,sac-pendulum]
     nice -n 5 python benchmarks/population.py --phases ppo --preset ppo-cartpole --seeds 0,1,2,3,4 ...

``--scores ROOT`` trains, at the settings a user gets by naming the env (the preset, its budget and its stop at the
target), five seeds as one population and the same five seeds as solo runs (two at a time), for PPO CartPole, DQN
CartPole (its batched gradient step, the default: rows equal to float32 rounding, not bitwise, so the runs part) and
SAC Pendulum, into ``ROOT/<preset>/population`` and ``ROOT/<preset>/solo``, then compares their final evaluation
returns with ``rlstruct compare`` (the IQM with its 95% stratified bootstrap interval, the probability of improvement):
the issue's claim that a member's final score is its solo run's, over seeds. A run whose folder holds a
``summary.json`` is kept (the command resumes where it stopped); ``--workloads`` narrows it.

``--phases ALGO FLAGS`` runs one training run (``rlstruct train ALGO FLAGS``, solo or a population) in this process
with timers around the training loop's phases and prints their exclusive wall and CPU time (see ``_phases``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fresh import (  # noqa: E402
    Config,
    add_arguments,
    forwarded,
    load_average,
    machine,
    measure_or_rounds,
    med_range,
    ratio,
    run_one,
    selected,
)

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


@dataclass(frozen=True)
class Workload:
    """One ``--runs`` workload: ``rlstruct train ALGO --preset PRESET --env ENV`` at ``budget`` env steps a seed,
    with ``population`` flags added to the population's command and ``solo`` flags to each solo run's."""

    label: str
    algo: str
    preset: str
    env: str
    budget: int
    population: tuple[str, ...] = ()
    solo: tuple[str, ...] = ()


RUN_WORKLOADS = {w.preset: w for w in (
    Workload("PPO CartPole", "ppo", "ppo-cartpole", "CartPole-v1", 51_200),
    Workload("PPO MinAtar Breakout", "ppo", "ppo-minatar", "MinAtar/Breakout-v1", 65_536),
    Workload("DQN MinAtar Breakout", "dqn", "dqn-minatar", "MinAtar/Breakout-v1", 15_000),
    Workload("SAC Hopper", "sac", "sac-mujoco", "Hopper-v5", 10_000, ("--n-processes", "5"), ("--n-processes", "1")),
)}
RUN_WAYS = ("population", "solo x5 one after another", "solo x5 two at a time")


def _rlstruct() -> str:
    """The ``rlstruct`` command beside this interpreter (a virtual environment's), else the one on ``PATH``."""
    beside = Path(sys.executable).with_name("rlstruct")
    found = str(beside) if beside.exists() else shutil.which("rlstruct")
    if found is None:
        raise RuntimeError("no rlstruct command beside the interpreter or on PATH; pip install -e . first")
    return found


class _TreeMemory:
    """The largest sum of the resident sets of this process's descendants, sampled every ``every`` seconds on a
    thread (the runs' processes and their workers; this process itself is not counted)."""

    def __init__(self, every: float = 0.1):
        self.peak, self._stop = 0, threading.Event()
        try:
            import psutil
        except ImportError:  # no sampling: the peak is NaN, and ``ru_maxrss`` still gives the largest process
            self.peak, self._thread = math.nan, None
            return
        me = psutil.Process()

        def sample() -> None:
            while not self._stop.wait(every):
                total = 0
                for child in me.children(recursive=True):
                    try:
                        total += child.memory_info().rss
                    except psutil.Error:  # ended between the listing and the read
                        pass
                self.peak = max(self.peak, total)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Stops sampling; the peak in MiB."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak / 2**20


def _launch(commands: list[list[str]], parallel: int, logs: Path) -> tuple[float, float, float]:
    """Runs ``commands``, ``parallel`` at a time, each as soon as a slot is free; returns the wall time from the
    first launch to the last end, their CPU time (user and system, with their workers') and the largest
    ``ru_maxrss`` of one of them (MiB).

    Raises:
        RuntimeError: a command failed (its stderr's tail is in the message).
    """
    pending, running, peak_one, cpu = list(enumerate(commands)), {}, 0.0, 0.0
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < parallel:
            k, cmd = pending.pop(0)
            with open(logs / f"{k}.err", "wb") as err:
                running[subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err).pid] = (k, cmd)
        pid, status, usage = os.wait4(-1, 0)
        k, cmd = running.pop(pid)
        peak_one = max(peak_one, usage.ru_maxrss / 1024)  # KiB on Linux
        cpu += usage.ru_utime + usage.ru_stime
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {os.waitstatus_to_exitcode(status)}: "
                               f"{(logs / f'{k}.err').read_text()[-2000:]}")
    return time.perf_counter() - t0, cpu, peak_one


def _run_way(workload: Workload, way: str, members: int, budget: int) -> dict:
    """Trains ``members`` seeds of ``workload`` one ``way`` (:data:`RUN_WAYS`) in subprocesses and measures it."""
    seeds = list(range(members))
    common = [_rlstruct(), "train", workload.algo, "--preset", workload.preset, "--env", workload.env,
              "--max-env-steps", str(budget), "--no-stop-at-reward-threshold", "--torch-threads", "1",
              "--no-progress"]
    root = Path(tempfile.mkdtemp(prefix="population-runs-"))
    try:
        if way == "population":
            commands = [[*common, *workload.population, "--seeds", ",".join(map(str, seeds)),
                         "--logdir", str(root / "population")]]
            folders = [root / "population" / f"seed-{s}" for s in seeds]
        else:
            folders = [root / f"solo-{s}" for s in seeds]
            commands = [[*common, *workload.solo, "--seed", str(s), "--logdir", str(f)] for s, f in zip(seeds, folders)]
        load_start = os.getloadavg()[0]
        memory = _TreeMemory()
        try:
            wall, cpu, peak_one = _launch(commands, 2 if way.endswith("two at a time") else 1, root)
        finally:
            peak_sum = memory.stop()
        env_steps = sum(json.loads((f / "summary.json").read_text())["env_steps"] for f in folders)
        return {"wall_s": wall, "steps_per_s": env_steps / wall, "env_steps": env_steps, "cpu_s": cpu,
                "steps_per_cpu_s": env_steps / cpu, "peak_sum_mib": peak_sum,
                "peak_one_mib": peak_one, "load_start": load_start, "load_end": os.getloadavg()[0]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_configs(args: argparse.Namespace) -> dict[str, Config]:
    """``WORKLOAD: WAY`` for the chosen workloads and the three ways, the population compared with both solo ways."""
    out = {}
    for key in args.workloads.split(","):
        if key not in RUN_WORKLOADS:
            raise SystemExit(f"--workloads: unknown workload {key!r}; choose from {', '.join(RUN_WORKLOADS)}")
        w = RUN_WORKLOADS[key]
        budget = int(w.budget * args.budget_scale)
        names = {way: f"{w.label}, {budget:,} env steps a seed: {way}" for way in RUN_WAYS}
        for way in RUN_WAYS:
            against = {"population": ((names[RUN_WAYS[1]], "vs one after another"),
                                      (names[RUN_WAYS[2]], "vs two at a time")),
                       RUN_WAYS[2]: ((names[RUN_WAYS[1]], "vs one after another"),)}.get(way, ())
            out[names[way]] = Config(lambda w=w, way=way, budget=budget: _run_way(w, way, args.members, budget),
                                     against=tuple((label, name) for name, label in against))
    return out


def _runs_table(results: dict[str, list[dict]], configs: dict[str, Config]) -> None:
    """Prints the ``--runs`` table: wall time, env steps per second of all seeds and its ratios, peak memory."""
    print("\n| configuration | wall time (s), median [min, max] | env steps/s of all seeds, median [min, max] "
          "| speed-up (of medians) [same-round range] | env steps per CPU second | CPU-time speed-up "
          "| peak memory, sum of the processes alive at once (MiB) | largest process (MiB) |")
    print("|:--|--:|--:|:--|--:|:--|--:|--:|")
    for name, runs in results.items():
        speed = [r["steps_per_s"] for r in runs]
        vs = "; ".join(f"{ratio(speed, [r['steps_per_s'] for r in results[base]])} {label}"
                       for label, base in configs[name].against if base in results)
        per_cpu = [r["steps_per_cpu_s"] for r in runs]
        vs_cpu = "; ".join(f"{ratio(per_cpu, [r['steps_per_cpu_s'] for r in results[base]])} {label}"
                           for label, base in configs[name].against if base in results)
        print(f"| {name} | {med_range([r['wall_s'] for r in runs], '{:.1f}')} | {med_range(speed)} | {vs} "
              f"| {med_range(per_cpu)} | {vs_cpu} | {med_range([r['peak_sum_mib'] for r in runs])} "
              f"| {med_range([r['peak_one_mib'] for r in runs])} |")


def _runs(args: argparse.Namespace, argv: list[str]) -> None:
    """``--runs``: each workload's three ways, ``args.rounds`` rounds, each configuration a fresh process of this
    script (the order rotated from round to round within a workload), then the table."""
    configs = run_configs(args)
    if args.one is not None:
        print(json.dumps(configs[args.one].measure()), flush=True)
        return
    print(f"python benchmarks/population.py {' '.join(argv)}".rstrip())
    print(f"# {machine()}")
    print(f"# load average at the start: {load_average()}", flush=True)
    names = list(configs)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for start in range(0, len(names), len(RUN_WAYS)):
        group = names[start:start + len(RUN_WAYS)]
        for r in range(args.rounds):
            for name in group[r % len(group):] + group[:r % len(group)]:
                # five solo runs one after another may take many minutes on a busy machine: a generous timeout
                results[name].append(run_one(__file__, name, forwarded(argv), timeout=args.run_timeout))
                print(f"  round {r + 1}/{args.rounds} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    print(f"# load average at the end: {load_average()}")
    _runs_table({n: v for n, v in results.items() if v}, configs)


SCORE_WORKLOADS = {"ppo-cartpole": ("ppo", "CartPole-v1"), "dqn-cartpole": ("dqn", "CartPole-v1"),
                   "sac-pendulum": ("sac", "Pendulum-v1")}


def _scores(root: Path, workloads: list[str], members: int) -> None:
    """``--scores``: each workload's population and solo runs (those not finished yet), then ``rlstruct compare``'s
    statistics of the two groups, a table row a workload."""
    seeds = list(range(members))
    for key in workloads:
        if key not in SCORE_WORKLOADS:
            raise SystemExit(f"--workloads: unknown workload {key!r} for --scores; choose from "
                             f"{', '.join(SCORE_WORKLOADS)}")
        algo, env = SCORE_WORKLOADS[key]
        base = [_rlstruct(), "train", algo, "--preset", key, "--env", env, "--torch-threads", "1", "--no-progress"]
        pop, solo = root / key / "population", root / key / "solo"
        commands = []
        if not all((pop / f"seed-{s}" / "summary.json").exists() for s in seeds):
            resume = ["--resume", str(pop)] if (pop / "population.json").exists() else ["--logdir", str(pop)]
            commands.append([*base, "--seeds", ",".join(map(str, seeds)), *resume])
        for s in seeds:
            folder = solo / f"seed-{s}"
            if not (folder / "summary.json").exists():
                resume = ["--resume", str(folder)] if (folder / "config.json").exists() else ["--logdir", str(folder)]
                commands.append([*base, "--seed", str(s), *resume])
        logs = root / key / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if commands:
            wall, cpu, _ = _launch(commands, 2, logs)
            print(f"# {key}: {len(commands)} runs in {wall:.0f} s ({cpu:.0f} CPU s)", file=sys.stderr, flush=True)
        result = subprocess.run([_rlstruct(), "compare", f"population={pop}", f"solo={solo}", "--json"],
                                capture_output=True, text=True, check=True)
        stats = json.loads(result.stdout)
        groups = stats["groups"]
        p, q = groups["population"]["iqm"], groups["solo"]["iqm"]
        overlap = p["low"] <= q["high"] and q["low"] <= p["high"]
        better = next(i for i in stats["improvement"] if i["x"] == "population")
        scores = {g: [round(v, 2) for vs in groups[g]["scores"].values() for v in vs] for g in groups}
        print(f"| {key} | {p['value']:.1f} [{p['low']:.1f}, {p['high']:.1f}] | {q['value']:.1f} [{q['low']:.1f}, "
              f"{q['high']:.1f}] | {'yes' if overlap else 'NO'} | {better['value']:.2f} | {scores['population']} "
              f"| {scores['solo']} |", flush=True)


def _phases(train_argv: list[str]) -> None:
    """``--phases``: runs ``rlstruct train *train_argv`` in this process with timers around the training loop's
    phases and prints each phase's exclusive wall and CPU time (of this thread) as one JSON line, ``PHASES {...}``.

    The phases are the methods the solo and the population loops both call: the collection
    (:class:`~rlstruct.batchers.Pipeline`'s ``next``), the weights sent to the batcher (``updated``), each member's
    learn step (``learn_from``: the push and gradient steps of an off-policy learner, the minibatch epochs of an
    on-policy one), the record, the evaluations (the evaluator's ``launch``, ``_advance`` and ``final``) and the end
    (``finish``: the final evaluation and the checkpoint). A phase's time excludes the phases timed inside it.
    """
    import functools
    from collections import defaultdict

    from rlstruct.algos._train import loops
    from rlstruct.algos._train.cli import main as cli_main
    from rlstruct.algos._train.evaluation import Evaluator
    from rlstruct.batchers.pipeline import Pipeline

    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    open_phases: list[list] = []  # [name, wall at the start, cpu at the start, inner wall, inner cpu]

    def timed(name_of, fn):
        @functools.wraps(fn)
        def wrapper(self, *a, **k):
            open_phases.append([name_of(self), time.perf_counter(), time.thread_time(), 0.0, 0.0])
            try:
                return fn(self, *a, **k)
            finally:
                name, w0, c0, inner_w, inner_c = open_phases.pop()
                dw, dc = time.perf_counter() - w0, time.thread_time() - c0
                wall[name] += dw - inner_w
                cpu[name] += dc - inner_c
                calls[name] += 1
                if open_phases:
                    open_phases[-1][3] += dw
                    open_phases[-1][4] += dc
        return wrapper

    def named(name):
        return lambda _: name

    Pipeline.next = timed(named("collect"), Pipeline.next)
    Pipeline.updated = timed(named("weights to the batcher"), Pipeline.updated)
    for cls in (loops.OnPolicyLearning, loops.OffPolicyLearning):
        cls.learn_from = timed(lambda self: f"learn (seed {self.run.seed})", cls.learn_from)
        cls.record = timed(named("record"), cls.record)
        cls.finish = timed(named("finish (final evaluation, checkpoint)"), cls.finish)
    loops.OnPolicyLearning.after_update = timed(named("return statistics"), loops.OnPolicyLearning.after_update)
    for method in ("launch", "_advance", "final"):
        setattr(Evaluator, method, timed(named("evaluations"), getattr(Evaluator, method)))
    t0, c0 = time.perf_counter(), time.thread_time()
    sys.argv = ["rlstruct", "train", *train_argv]
    try:
        cli_main()
    except SystemExit:
        pass
    print("PHASES " + json.dumps({"total_wall": time.perf_counter() - t0, "total_cpu": time.thread_time() - c0,
                                  "wall": wall, "cpu": cpu, "calls": calls}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--micro", action="store_true", help="the learner's step of five seeds, three ways")
    parser.add_argument("--runs", action="store_true",
                        help="whole runs: a population against five solo runs one after another and two at a time")
    parser.add_argument("--phases", nargs=argparse.REMAINDER, default=None, metavar="ALGO FLAGS",
                        help="times the phases of one run: the rest of the line is rlstruct train's (ALGO and flags)")
    parser.add_argument("--scores", type=Path, default=None, metavar="ROOT",
                        help="final scores: a population and five solo runs a workload, into ROOT, compared")
    parser.add_argument("--workloads", default=None,
                        help=f"--runs: comma-separated presets among {', '.join(RUN_WORKLOADS)} (default: "
                             f"ppo-cartpole,ppo-minatar,dqn-minatar); --scores: among {', '.join(SCORE_WORKLOADS)} "
                             "(default: all)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="--runs: multiplies each workload's budget")
    parser.add_argument("--run-timeout", type=float, default=3600.0,
                        help="--runs: seconds one configuration (all its runs) may take")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per configuration (after 10 untimed)")
    parser.add_argument("--members", type=int, default=5, help="seeds in the population")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.phases is not None:
        _phases(args.phases)
        return
    if args.scores is not None:
        print(f"python benchmarks/population.py {' '.join(sys.argv[1:] if argv is None else argv)}")
        print(f"# {machine()}\n# load average at the start: {load_average()}")
        print("\n| workload | population: IQM [95% CI] | solo runs: IQM [95% CI] | intervals overlap "
              "| P(population > solo) | population's scores | solo scores |\n|:--|--:|--:|:--|--:|:--|:--|", flush=True)
        _scores(args.scores, (args.workloads or ",".join(SCORE_WORKLOADS)).split(","), args.members)
        print(f"# load average at the end: {load_average()}")
        return
    args.workloads = args.workloads or "ppo-cartpole,ppo-minatar,dqn-minatar"
    if args.micro == args.runs:
        parser.error("pass one of --micro (the learner's step), --runs (whole runs), --scores ROOT and "
                     "--phases ALGO FLAGS")
    if args.runs:
        _runs(args, sys.argv[1:] if argv is None else argv)
        return
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
