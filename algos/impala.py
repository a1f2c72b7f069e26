"""IMPALA: an actor-learner whose actors collect while the learner trains, corrected by V-trace (Espeholt et al. 2018).

The actors are the training batcher (worker processes, or this process): acquisition ``i`` acts with the weights of
update ``max(0, i - max_lag)``, pushed before it is launched, so that which policy acts on which batch is a schedule,
not a race, and a seed gives the same run at any process count and any load. With ``max_lag`` 0 the loop is
synchronous (collect, learn, push); from 1 on, acquisition ``i + 1`` runs while the learner trains on acquisition
``i``. The learner corrects the gap between the policy that acted and its own with V-trace's clipped importance
weights (``rho_bar``, ``c_bar``). The file reads top to bottom: the config, the learn step, the loop and
``ALGORITHM``; docs/algorithms/impala.md tells the rest. Run it with ``rlstruct train rlstruct.algos.impala:ALGORITHM``
or ``python -m rlstruct.algos.impala``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from rlstruct.algos import TrainResult
from rlstruct.algos.harness import (
    ACTOR_CRITIC,
    ActorCriticPart,
    Algorithm,
    EnvSpec,
    LearnerState,
    RunConfig,
    Setup,
    TrainingEpisodes,
    check_actor_critic_network,
    default,
    finish_diverged,
    finish_training,
    load_state,
    main,
    open_batchers,
    open_run,
    record_iteration,
    seeded_model,
    setting,
    trainer,
    until_a_worker_fails,
)
from rlstruct.algos.losses import vtrace_policy_value_loss
from rlstruct.algos.networks import Adam, make_adam
from rlstruct.algos.policies import trajectory_outputs
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import cpu_state_dict
from rlstruct.errors import ConfigError
from rlstruct.structures import Trajectories

if TYPE_CHECKING:  # the profiler stays out of a training run's imports
    from rlstruct.batchers.profile import LoopTimer

__all__ = ["ALGORITHM", "IMPALAConfig", "train"]


@dataclasses.dataclass
class IMPALAConfig(ActorCriticPart, RunConfig):
    """IMPALA's settings (each one's help is beside it; the policy's are :class:`ActorCriticPart`'s)."""

    n_envs: int = default(32)
    max_env_steps: int | None = default(500_000)
    lr: float = default(3e-3)
    eval_every: int = default(25)
    n_steps: int = setting(16, "steps of every env per acquisition (auto-reset envs)", least=1)
    max_lag: int = setting(1, "acquisition i acts with the weights of update max(0, i - max_lag) (0: synchronous)")
    gamma: float = setting(0.99, "discount factor", within="[0, 1]")
    rho_bar: float = setting(1.0, "V-trace: clip of the importance weights (sets the value's fixed point)")
    c_bar: float = setting(1.0, "V-trace: clip of the trace coefficients, at most rho_bar (sets the speed)")
    vtrace_lambda: float = setting(0.95, "V-trace: decay of the traces (1: the paper's, 0: one-step targets)",
                                   within="[0, 1]")
    value_coef: float = setting(0.5, "weight of the value loss")
    entropy_coef: float = setting(0.0, "weight of the entropy bonus")
    reward_scale: float = setting(0.1, "multiply rewards by this in the loss")
    max_grad_norm: float = setting(0.5, "clip the global gradient norm to this (0: no clipping)", least=0.0)
    anneal_lr: bool = setting(True, "decay the learning rate linearly to 0 over max_env_steps")

    #: the ring of weights a checkpoint keeps holds max_lag + 1 versions: another lag cannot continue the schedule
    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("max_lag",)


def check_config(config: IMPALAConfig) -> None:
    """Raises on a setting of IMPALA's own out of range.

    Raises:
        ValueError: ``max_lag < 0``.
        ConfigError: ``c_bar > rho_bar`` (V-trace's contraction assumes ``c_bar <= rho_bar``), ``rho_bar <= 0``, or
            ``normalize_observations``, which this loop does not update.
    """
    if config.max_lag < 0:
        raise ValueError(f"max_lag must be >= 0 (the updates an acquisition's weights may lag the learner's), got "
                         f"{config.max_lag!r}; pass --max-lag 0 for the synchronous loop, or more")
    if not config.rho_bar > 0:
        raise ConfigError(f"rho_bar must be > 0 (the clip of V-trace's importance weights), got {config.rho_bar!r}; "
                          "pass e.g. --rho-bar 1.0")
    if not 0 <= config.c_bar <= config.rho_bar:
        raise ConfigError(f"c_bar must be in [0, rho_bar] (V-trace assumes c_bar <= rho_bar), got "
                          f"c_bar={config.c_bar!r} with rho_bar={config.rho_bar!r}; lower --c-bar or raise --rho-bar")
    if config.anneal_lr and config.max_env_steps is None:
        raise ConfigError("anneal_lr decays the learning rate over the step budget max_env_steps, got "
                          "max_env_steps=None; pass --max-env-steps N, or --no-anneal-lr")
    if config.normalize_observations:
        raise ConfigError("normalize_observations=True is not supported by IMPALA (its loop keeps no observation "
                          "statistics), got normalize_observations=True; drop --normalize-observations")


def check_env(config: IMPALAConfig, spec: EnvSpec) -> None:
    """The actor-critic's network settings against the env (:func:`check_actor_critic_network`)."""
    if spec.pixels:
        spec.require("IMPALA on images", config.env, discrete=True)
    check_actor_critic_network(config, spec, title="IMPALA")


def acting_version(acquisition: int, max_lag: int) -> int:
    """The update whose weights act on ``acquisition`` (counted from 0): ``max(0, acquisition - max_lag)``.

    >>> [acting_version(i, 2) for i in range(5)]
    [0, 0, 0, 1, 2]
    """
    return max(0, acquisition - max_lag)


class WeightRing:
    """The learner's last ``size`` weights by version (the number of updates they hold), CPU copies: what the next
    acquisitions act with. A checkpoint keeps it (``state_dict``), so that a resumed run pushes the versions the
    uninterrupted run would have.

    >>> ring = WeightRing(2)
    >>> for version in range(4):
    ...     ring.add(version, {"w": torch.tensor(float(version))})
    >>> sorted(ring.versions), float(ring[3]["w"])
    ([2, 3], 3.0)
    """

    def __init__(self, size: int):
        self.size = size
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def add(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Keeps ``weights`` as ``version``, forgetting the versions older than the last ``size``."""
        self.versions[version] = weights
        for old in [v for v in self.versions if v <= version - self.size]:
            del self.versions[old]

    def __getitem__(self, version: int) -> dict[str, torch.Tensor]:
        return self.versions[version]

    def state_dict(self) -> dict[str, Any]:
        """``{"versions": [...], "weights": [...]}``, oldest first."""
        return {"versions": list(self.versions), "weights": list(self.versions.values())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`; raises ``ValueError`` for one of a larger ring."""
        if len(state["versions"]) != len(state["weights"]) or len(state["versions"]) > self.size:
            raise ValueError(f"{len(state['versions'])} versions for a ring of {self.size}")
        self.versions = dict(zip((int(v) for v in state["versions"]), state["weights"]))


def learn_step(config: IMPALAConfig, model: nn.Module,
               optimizer: Adam) -> Callable[[Trajectories], dict[str, torch.Tensor]]:
    """IMPALA's learn step: one update on a whole acquisition, the loss
    :func:`~rlstruct.algos.losses.vtrace_policy_value_loss` of the learner's policy against the log-probabilities
    recorded by the policy that acted (``action/log_prob``). The learner's outputs are one pass of its network over
    the frames acted on and its critic on the few next frames that are not the next step's
    (:func:`~rlstruct.algos.policies.trajectory_outputs`)."""

    def learn(traj: Trajectories) -> dict[str, torch.Tensor]:
        tt = traj.trajectories
        out = trajectory_outputs(model, tt)
        loss, terms = vtrace_policy_value_loss(
            out["log_prob"], out["entropy"], out["value"], tt["action/log_prob"],
            tt["_observation/reward"] * config.reward_scale, out["next_value"],
            tt["_observation/terminated"], tt["_observation/done"], tt.mask(), gamma=config.gamma,
            value_coef=config.value_coef, entropy_coef=config.entropy_coef, rho_bar=config.rho_bar,
            c_bar=config.c_bar, lambda_=config.vtrace_lambda)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats = {f"loss/{k}" if k in ("policy", "value", "entropy") else f"vtrace/{k}": v for k, v in terms.items()}
        if config.max_grad_norm > 0:
            stats["grad_norm"] = nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        return stats

    return learn


class _Actors:
    """The training batcher on the schedule: :meth:`launch` pushes the version an acquisition acts with (unless the
    batcher's agent holds it already) and starts it; :meth:`collect` waits for it."""

    def __init__(self, batcher: RL_Batcher, ring: WeightRing):
        self.batcher, self.ring = batcher, ring
        self.pushed: int | None = None
        self.pending: int | None = None  # the version acting on the acquisition under way

    def launch(self, version: int) -> None:
        if version != self.pushed:
            self.batcher.update(self.ring[version])
            self.pushed = version
        self.batcher.execute()
        self.pending = version

    def collect(self) -> tuple[Trajectories, int]:
        # Nothing is pending once get() is called, even if it raises: a batcher whose worker failed answers no
        # second get(), and close() must not ask for one.
        version, self.pending = self.pending, None
        assert version is not None, "collect follows a launch"
        traj, _ = self.batcher.get()
        return traj, version

    def close(self) -> None:
        """Waits for an acquisition launched during the last update: the batcher then closes with nothing
        pending."""
        if self.pending is not None:
            self.collect()


def train_impala(setup: Setup, *, timer: LoopTimer | None = None) -> TrainResult:
    """IMPALA's training loop (a ``TrainingLoop``). Iteration ``i`` collects acquisition ``i`` (acted on by version
    :func:`acting_version` of the weights), launches acquisition ``i + 1`` as soon as its version exists (before the
    update with ``max_lag >= 1``, after it with 0), updates the learner once (version ``i + 1``) and records the row,
    with ``impala/policy_version`` and ``impala/policy_lag`` (``i`` minus the version). The checkpoint's learner
    state holds the optimizer and the ring of the last ``max_lag + 1`` versions: a resumed run acts on its first
    acquisitions with the versions the uninterrupted run would have. A worker of the actors that fails with no restart
    left ends the run as a signal does (:func:`~rlstruct.algos.harness.until_a_worker_fails`): checkpoint, summary,
    stop reason ``"worker_failed"``."""
    algo, config, spec, resume, device = (setup.algorithm, setup.config, setup.spec, setup.resume,
                                          setup.learner_device)
    if setup.world.size > 1:
        raise ConfigError(f"IMPALA trains on one rank, got WORLD_SIZE={setup.world.size}; run it without torchrun")
    phase = timer if timer is not None else (lambda name: contextlib.nullcontext())
    lag = config.max_lag
    with open_run(setup) as (run, stack):
        model = seeded_model(config.seed, ACTOR_CRITIC.build, config, spec)
        if resume is not None:
            load_state(model, resume.model, "the model", resume.path)
        agent_kwargs, model_kwargs = ACTOR_CRITIC.agent_kwargs(config)
        # Batchers first, the model to the learner's device after: no CUDA in this process before workers spawn.
        batcher, evaluator = open_batchers(stack, config, spec, algo.agent(config.to_dict()),
                                           n_timesteps=config.n_steps, autoreset=True,
                                           explore=ACTOR_CRITIC.explore(config),
                                           evaluate=algo.evaluation_agent_info(config.to_dict()),
                                           agent_kwargs=agent_kwargs, model_kwargs=model_kwargs, seed=run.seed,
                                           run=run, sync_timings=timer is not None and timer.sync)
        model.to(device)
        run.stop_rule.guard.watch(model.state_dict)
        optimizer = make_adam(model, config.lr, device, eps=config.adam_eps)
        ring = WeightRing(lag + 1)
        owned = LearnerState(optimizer=optimizer, weights=ring)
        if resume is not None:
            owned.load_state_dict(resume.learner, path=resume.path)
        else:
            ring.add(0, cpu_state_dict(model))
        learn = learn_step(config, model, optimizer)
        B = batcher.n_elems()
        episodes = TrainingEpisodes(B, device)

        actors = _Actors(batcher, ring)
        stack.callback(actors.close)  # before the batcher's own close: the stack closes in reverse order
        if timer is not None:
            timer.watch(batcher)
        if run.logger:
            evaluator.schedule(lambda: cpu_state_dict(model), run.iteration, run.env_steps)
        batcher.reset()
        actors.launch(acting_version(run.iteration, lag))
        while not run.should_stop():
            # A worker that fails with no restart left stops the run as a signal does: in the collection, the
            # iteration goes unrecorded; in the launch of the next acquisition, the update is made and recorded.
            with until_a_worker_fails(run.stop_rule):
                i = run.iteration  # the acquisition collected now; the learner holds version i
                with phase("collect"):
                    traj, version = actors.collect()
                if lag >= 1:  # version i + 1 - lag <= i exists: the next acquisition runs during the update
                    with phase("update_weights"), until_a_worker_fails(run.stop_rule):
                        actors.launch(acting_version(i + 1, lag))
                with phase("to_learner"):
                    traj = traj.to(device)
                if config.anneal_lr:  # by the env steps, not the clock: a schedule every rerun repeats
                    optimizer.param_groups[0]["lr"] = config.lr * (1.0 - run.budget_used())
                with phase("learn"):
                    stats: dict[str, Any] = learn(traj)
                ring.add(i + 1, cpu_state_dict(model))
                if lag == 0:
                    with phase("update_weights"), until_a_worker_fails(run.stop_rule):
                        actors.launch(i + 1)
                with phase("record"):
                    tt = traj.trajectories
                    episodes.add(tt, stats)
                    stats.update({"impala/policy_version": float(version), "impala/policy_lag": float(i - version)})
                    record_iteration(run, evaluator, B * tt.temporal_size(), stats, model=model,
                                     learner=owned.state_dict)
        actors.close()
        return finish_training(run, evaluator, model, spec, title=algo.title, learner=owned.state_dict())
    return finish_diverged(run, title=algo.title)  # the loop raised, and the divergence found explains it


#: what ``rlstruct sweep impala`` searches by default (V-trace's clips stay at 1: a trial must keep c_bar <= rho_bar)
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 1e-2, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "n_steps": {"choices": [8, 16, 32, 64]}, "vtrace_lambda": {"low": 0.8, "high": 1.0},
                "entropy_coef": {"low": 0.0, "high": 0.05}, "value_coef": {"low": 0.25, "high": 1.0},
                "max_grad_norm": {"low": 0.3, "high": 5.0, "log": True}}

ALGORITHM = Algorithm(name="impala", title="IMPALA", config_cls=IMPALAConfig, description=__doc__.splitlines()[0],
                      agent=ACTOR_CRITIC.agent, evaluation_info=ACTOR_CRITIC.evaluation_info, check_config=check_config,
                      check_env=check_env, loop=train_impala, steps_setting="n_steps",
                      search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main(ALGORITHM))
