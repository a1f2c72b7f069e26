"""Evaluation of a policy: the asynchronous evaluation of a training run's weights (:class:`Evaluator`), one
episode per env in chunks of bounded memory, and the evaluation agent of a saved run (:func:`evaluation_agent`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlstruct.algos._env_spec import EnvSpec, create_env, saved_evaluation_env_kwargs
from rlstruct.algos._train.checkpoints import does_not_fit, load_checkpoint, stepped_backend
from rlstruct.algos._train.config import RunConfig, set_torch_threads
from rlstruct.algos._train.registry import algorithm, check_run_code, saved_algorithm
from rlstruct.algos._train.seeds import evaluation_seeds
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import check_device_exists
from rlstruct.errors import CheckpointError, RLStructError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["EpisodeTally", "Evaluator", "agent_info_row", "evaluate_checkpoint", "evaluation_agent", "run_episodes"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Launch:
    """An evaluation to run: the weights, the iteration and env steps at which they were taken, and whether it
    confirms an earlier evaluation of the same weights."""

    weights: dict[str, torch.Tensor]
    iteration: int
    env_steps: int
    confirmation: bool


class EpisodeTally:
    """Per-env undiscounted returns and lengths of one episode per env, summed over consecutive acquisitions.

    An episodic batcher carries its envs from one ``execute`` to the next until ``reset``, and each ``get`` holds
    one row per env running when the acquisition started, in env order. :meth:`add` adds such an acquisition to
    the sums of the envs it covers (no frame is kept), so that episodes of any length run in acquisitions of a
    bounded number of steps, in bounded memory. Steps past ``max_steps`` do not count: an episode still running
    there is cut, and its return is partial.

    An auto-reset batcher's acquisitions hold every env's row, and its envs start new episodes after their first
    one ends: only each env's first episode counts (the steps up to its first ``done``), which is what the
    episodic batcher gives from the same reset (a captured evaluation, see :func:`~.session.open_batchers`).

    Args:
        n_envs: the batcher's ``n_elems()``.
        max_steps: steps per episode at most.
        device: where the sums live (the batcher's device).

    >>> tally = EpisodeTally(2, 10, "cpu")
    >>> tally.returns.tolist(), tally.lengths.tolist(), tally.finished
    ([0.0, 0.0], [0, 0], False)
    """

    def __init__(self, n_envs: int, max_steps: int, device: torch.device | str):
        self.max_steps = max_steps
        self.returns = torch.zeros(n_envs, device=device)
        self.lengths = torch.zeros(n_envs, dtype=torch.int64, device=device)
        self.running = torch.ones(n_envs, dtype=torch.bool, device=device)
        #: steps taken so far by the envs still running
        self.steps = 0
        #: whether every episode ended or ``max_steps`` was reached
        self.finished = False

    def add(self, trajectories: Trajectories, n_running: int) -> bool:
        """Adds one acquisition of the running envs; returns :attr:`finished`.

        Args:
            trajectories: ``[B, T]`` rows of the envs running when the acquisition started, in env order, with
                ``_observation/reward float [B, T]`` and ``_observation/done bool [B, T]``.
            n_running: the envs still running after it (``get``'s second value).
        """
        tt = trajectories.trajectories
        T = tt.temporal_size()
        done = tt["_observation/done"].bool()
        step = self.steps + torch.arange(T, device=self.returns.device)
        # Each row's steps up to its first end (an episodic row's mask already stops there; an auto-reset row
        # goes on into its next episode).
        first = (torch.cumsum(done, 1) - done.long()) == 0
        valid = tt.mask().bool() & (step < self.max_steps) & first
        every_env = tt.n_elems() == self.running.shape[0]
        if every_env:  # auto-reset rows, or episodic ones before any episode ended: the running envs count
            valid &= self.running.unsqueeze(1)
        returns = (tt["_observation/reward"] * valid.float()).sum(1)
        lengths, ended = valid.sum(1), (done & valid).any(1)
        if every_env:
            self.returns += returns
            self.lengths += lengths
            self.running &= ~ended
        else:
            rows = torch.nonzero(self.running, as_tuple=False).squeeze(1)
            assert rows.shape[0] == tt.n_elems(), "an acquisition must hold one row per running env, or every env's"
            self.returns.index_add_(0, rows, returns)
            self.lengths.index_add_(0, rows, lengths)
            self.running.index_fill_(0, rows[ended], False)
        self.steps += T
        # An auto-reset batcher never reports its envs finished: ask the tally (one host sync an acquisition).
        self.finished = (n_running == 0 or self.steps >= self.max_steps
                         or (every_env and not bool(self.running.any())))
        return self.finished


def run_episodes(batcher: RL_Batcher, max_steps: int, agent_info: DictTensor | None = None) -> EpisodeTally:
    """Runs one episode on every env of an episodic ``batcher`` (blocking), ``batcher.n_timesteps`` steps per
    acquisition, and returns their sums.

    Args:
        batcher: an episodic batcher, weights already sent.
        max_steps: steps per episode at most (an episode still running there is cut).
        agent_info: ``reset``'s agent_info (``None``: the batcher's default).

    Returns:
        The finished :class:`EpisodeTally` (``returns float [B]``, ``lengths int64 [B]``, ``running bool [B]``).
    """
    batcher.reset(agent_info=agent_info)
    tally = EpisodeTally(batcher.n_elems(), max_steps, batcher.device)
    while not tally.finished:
        batcher.execute()
        traj, n_running = batcher.get()
        tally.add(traj, n_running)
    return tally


class Evaluator:
    """Asynchronous evaluation with an episodic batcher, in bounded memory, on a schedule that does not depend on time.

    An evaluation runs one episode per env, ``batcher.n_timesteps`` steps per acquisition: each acquisition's rewards
    and lengths are added to per-env sums (:class:`EpisodeTally`) and the next acquisition continues the same
    episodes, until every episode has ended or ``max_steps`` steps were taken. The batcher's buffer thus holds
    ``n_timesteps`` steps whatever the episodes' length (Atari's 27,000 steps of frames would not fit), and the result
    is the one a single acquisition of ``max_steps`` steps gives.

    Evaluations are due every ``every`` iterations from the first one scheduled (:meth:`schedule`; when one starts
    never moves the schedule): a due evaluation is queued with its weights and its launch step, and the queue runs
    in order, one evaluation at a time, a confirmation (:meth:`confirm`) going
    first. Which evaluations run, in which order, and so which episodes each one gets (the evaluation envs' streams
    go on from one evaluation to the next) depend on the iterations only, never on how fast the evaluation runs: the
    same seed gives the same evaluations on an idle machine and a loaded one, in process and with worker processes.

    With worker processes the evaluation runs while training goes on: each :meth:`collect` collects the acquisitions
    that finished and launches the next, so an evaluation advances by at least one acquisition per call (a larger
    ``n_timesteps`` takes fewer calls and more memory). When more than ``max_queued`` evaluations wait, the next
    :meth:`schedule` waits for the one under way (the queue holds a copy of the weights per evaluation). In process
    (``n_processes=0``), ``execute`` runs the acquisition before it returns, so :meth:`launch` runs the whole
    evaluation. :meth:`final` evaluates the final weights, blocking, over ``final_episodes`` episodes: as many rounds
    of one episode per env as that takes, each from the envs' next reset.

    Args:
        batcher: an episodic batcher (``autoreset=False``), or an auto-reset one, whose envs' first episodes count
            (what a CUDA-graph batcher needs: its loop cannot stop early).
        agent_info: the evaluation's agent_info (CPU, one row per env), e.g. ``stochastic=False``.
        every: iterations between two scheduled evaluations.
        max_steps: steps per episode at most (the env's time limit); ``None``: ``batcher.n_timesteps`` (one
            acquisition per evaluation).
        max_queued: evaluations that may wait behind the one under way.
        final_episodes: the episodes of :meth:`final` (``None``: ``batcher.n_elems()``, one per env, as every
            evaluation).

    Raises:
        ValueError: ``max_steps < 1``, ``max_queued < 1`` or ``final_episodes < 1``.
    """

    def __init__(self, batcher: RL_Batcher, agent_info: DictTensor, every: int, *, max_steps: int | None = None,
                 max_queued: int = 4, final_episodes: int | None = None):
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 step or None (one acquisition), got {max_steps!r}")
        if max_queued < 1:
            raise ValueError(f"max_queued must be >= 1 evaluation, got {max_queued!r}")
        if final_episodes is not None and final_episodes < 1:
            raise ValueError(f"final_episodes must be >= 1 episode or None (one per env), got {final_episodes!r}")
        self.final_episodes = batcher.n_elems() if final_episodes is None else final_episodes
        self.batcher = batcher
        self.agent_info = agent_info
        self.every = every
        self.max_steps = batcher.n_timesteps if max_steps is None else max_steps
        self.max_queued = max_queued
        #: an evaluation is under way or finished and not yet collected
        self.pending = False
        #: the iteration of the last evaluation scheduled (due then, whenever it starts)
        self.last_launch: int | None = None
        self._queue: collections.deque[_Launch] = collections.deque()
        self._current: _Launch | None = None
        self._tally: EpisodeTally | None = None
        self._executing = False  # an execute awaits its get
        self._blocked = 0.0  # seconds the caller spent in this evaluation's calls so far
        #: the weights of the last evaluation collected (what its result is about)
        self.evaluated_weights: dict[str, torch.Tensor] | None = None

    @property
    def queued(self) -> int:
        """Evaluations waiting behind the one under way."""
        return len(self._queue)

    def launch(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int, *,
               confirmation: bool = False) -> None:
        """Sends ``weights`` and starts an evaluation of ``batcher.n_elems()`` episodes now (none may be pending)."""
        assert not self.pending, "one evaluation at a time: queue it (schedule, confirm)"
        t0 = time.perf_counter()
        self._blocked = 0.0
        self.batcher.update(weights)
        self.batcher.reset(agent_info=self.agent_info)
        self._tally = EpisodeTally(self.batcher.n_elems(), self.max_steps, self.batcher.device)
        self.batcher.execute()
        self._executing = True
        self.pending = True
        self._current = _Launch(weights, iteration, env_steps, confirmation)
        self._advance(blocking=False, since=t0)

    def schedule(self, weights: Callable[[], dict[str, torch.Tensor]], iteration: int, env_steps: int) -> None:
        """Queues an evaluation of ``weights()`` when one is due at ``iteration``, and starts the next queued one
        when none is under way.

        Args:
            weights: called only when an evaluation is due (so that the CPU copy is made only then).
            iteration: the current training iteration.
            env_steps: the current training env steps (the evaluation's launch step).
        """
        if self.last_launch is None or iteration - self.last_launch >= self.every:
            self._queue.append(_Launch(weights(), iteration, env_steps, False))
            self.last_launch = iteration
        if self.pending and len(self._queue) > self.max_queued:  # bounded memory: wait (the results do not change)
            self._advance(blocking=True)
        self._start_next()

    def confirm(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int) -> None:
        """Queues a confirmation of ``weights`` (those of an evaluation collected, launched at ``env_steps``) ahead
        of every other queued evaluation: the next evaluation that starts, on fresh episodes."""
        self._queue.appendleft(_Launch(weights, iteration, env_steps, True))

    def _start_next(self) -> None:
        if not self.pending and self._queue:
            nxt = self._queue.popleft()
            self.launch(nxt.weights, nxt.iteration, nxt.env_steps, confirmation=nxt.confirmation)

    def _advance(self, blocking: bool, *, since: float | None = None) -> bool:
        """Collects the acquisitions that are ready, launching the next while episodes run on; returns whether the
        evaluation has finished. Without ``blocking`` it never waits for a worker. The time from ``since`` (default:
        this call's start) to the return counts as the caller's time in this evaluation."""
        assert self._tally is not None
        t0 = time.perf_counter() if since is None else since
        try:
            while self._executing:
                traj, n_running = self.batcher.get(blocking=blocking)
                if traj is None:
                    return False
                self._executing = False
                if not self._tally.add(traj, n_running):
                    self.batcher.execute()
                    self._executing = True
            return True
        finally:
            self._blocked += time.perf_counter() - t0

    def collect(self) -> dict[str, float] | None:
        """The result of a pending evaluation if it has finished (never waits, launches nothing), else ``None``."""
        if not self.pending or not self._advance(blocking=False):
            return None
        return self._summarise()

    def next_result(self) -> dict[str, float]:
        """Waits for the evaluation under way, or starts the next queued one and waits for it (blocking): its
        result (one must be under way or queued). A confirmation queued from it (:meth:`confirm`) is the next to
        start, as during training."""
        assert self.pending or self._queue, "nothing under way or queued: check pending and queued first"
        self._start_next()
        self._advance(blocking=True)
        return self._summarise()

    def drain(self) -> list[dict[str, float]]:
        """Waits for the evaluation under way and runs every queued one (blocking); their results, in order."""
        results = []
        while self.pending or self._queue:
            results.append(self.next_result())
        return results

    def final(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int) -> tuple[list[dict], dict]:
        """Runs the pending and queued evaluations (:meth:`drain`), then evaluates ``weights`` (blocking, fresh
        episodes) over ``final_episodes`` episodes: rounds of one episode per env, each launched from the envs'
        next reset, the first ``final_episodes`` in round and env order kept.

        Returns:
            ``(the pending and queued evaluations' results, the final result)``.
        """
        previous = self.drain()
        tallies: list[EpisodeTally] = []
        blocked = 0.0
        while sum(t.returns.shape[0] for t in tallies) < self.final_episodes:
            self.launch(weights, iteration, env_steps)
            self._advance(blocking=True)
            blocked += self._blocked
            tally, launch = self._take()
            tallies.append(tally)
        return previous, self._result(tallies, launch, blocked, episodes=self.final_episodes)

    def _take(self) -> tuple[EpisodeTally, _Launch]:
        """The finished evaluation's tally and launch; the evaluator is free for the next."""
        assert self._tally is not None and self._tally.finished
        assert self._current is not None
        tally, self._tally = self._tally, None
        launch, self._current = self._current, None
        self.pending = False
        self.evaluated_weights = launch.weights
        return tally, launch

    def _summarise(self) -> dict[str, float]:
        tally, launch = self._take()
        return self._result([tally], launch, self._blocked)

    def _result(self, tallies: list[EpisodeTally], launch: _Launch, blocked: float, *,
                episodes: int | None = None) -> dict[str, float]:
        """The row of an evaluation of ``launch``'s weights: the first ``episodes`` episodes of ``tallies`` (all:
        ``None``), with ``blocked`` seconds of the caller's time."""
        returns = torch.cat([t.returns for t in tallies])[:episodes]
        lengths = torch.cat([t.lengths for t in tallies])[:episodes]
        n_running = int(torch.cat([t.running for t in tallies])[:episodes].sum())
        if n_running:
            log.warning("%d evaluation episodes did not finish within %d steps; their returns are partial",
                        n_running, self.max_steps)
        return {
            "eval/return": float(returns.mean()),
            "eval/return_min": float(returns.min()),
            "eval/return_max": float(returns.max()),
            "eval/length": float(lengths.float().mean()),
            "eval/episodes": float(returns.shape[0]),
            "eval/launch_env_steps": float(launch.env_steps),
            "eval/confirmation": float(launch.confirmation),
            "eval/blocked_s": blocked,
        }

    def close(self) -> None:
        """Collects a pending acquisition (a worker must not be closed mid-acquisition) and closes the batcher."""
        try:
            if self._executing:
                self.batcher.get()
        except RLStructError as e:  # a failed batcher has nothing to collect; the original error is what matters
            log.debug("evaluation batcher: %s", e)
        finally:
            self._executing = False
            self.pending = False
            self._queue.clear()
            self.batcher.close()


def evaluation_agent(algo: str, config: Mapping[str, Any], spec: EnvSpec, device: str = "cpu", *,
                     policy: str | None = None) -> tuple[Callable[..., Any], dict[str, Any], DictTensor]:
    """The evaluation agent of a saved run of ``algo`` (its source, :func:`~.registry.saved_algorithm`) from its
    checkpoint's ``config``: the agent factory, its keyword arguments for an env of ``spec`` on ``device``, and its
    ``agent_info`` (one row; greedy unless ``policy``, or the run's ``evaluation_policy``, is ``"sample"``).

    Raises:
        AlgorithmSourceError: ``algo`` names no algorithm this process can import.
        ValueError: ``policy`` is not greedy or sample.

    >>> spec = EnvSpec((4,), "float32", 2, 500)
    >>> create, kwargs, info = evaluation_agent("ppo", {"hidden_sizes": [8]}, spec)
    >>> create.func.__name__, kwargs["hidden_sizes"], list(info.keys())
    ('create_policy_agent', (8,), ['stochastic'])
    """
    description = algorithm(algo)
    kwargs: dict[str, Any] = {"spec": spec, "hidden_sizes": tuple(config["hidden_sizes"]), "device": device}
    if config.get("normalize_observations"):  # the network has the normalizer whose statistics the checkpoint holds
        kwargs["normalize_observations"] = True
    if config.get("network"):  # the factory the run trained with (--network), imported again here
        kwargs["network"] = config["network"]
    info = agent_info_row(description.evaluation_agent_info(config, policy))
    return description.agent(config), kwargs, info


def agent_info_row(values: Mapping[str, bool | float]) -> DictTensor:
    """An ``agent_info`` of one row from one value per key.

    >>> agent_info_row({"stochastic": True, "epsilon": 0.05})["epsilon"]
    tensor([0.0500])
    """
    return DictTensor({key: torch.tensor([value]) for key, value in values.items()})


def check_model_fits(create_agent: Any, agent_args: dict[str, Any], model: dict[str, Any], path: str) -> None:
    """Loads a checkpoint's ``model`` into its agent built on the CPU, before any worker starts.

    Raises:
        CheckpointError: the weights do not fit the network the checkpoint's config describes (missing or unexpected
            keys, other shapes: a damaged file).
    """
    try:
        create_agent(**{**agent_args, "device": "cpu"}).update(model)
    except (RuntimeError, KeyError, TypeError) as e:
        raise does_not_fit(f"{str(path)!r} holds weights that do not fit the network its config describes", e,
                           "pass an undamaged checkpoint.pt written by rlstruct train", error=CheckpointError) from e


def evaluate_checkpoint(
    path: str,
    *,
    episodes: int = 16,
    device: str = "cpu",
    backend: str | None = None,
    seed: int = 12345,
    n_processes: int = 0,
    max_steps: int | None = None,
    policy: str | None = None,
    returns: bool = False,
    trust_code: bool = False,
) -> dict[str, Any]:
    """Rebuilds the agent of a checkpoint and runs ``episodes`` episodes of its evaluation policy, with torch at
    the run's ``torch_threads`` (the process's count restored after).

    The episodes run in acquisitions of the training run's ``evaluation_chunk_steps`` steps (see
    :class:`~rlstruct.algos._train.evaluation.Evaluator`), up to the env's time limit.

    Args:
        path: a ``checkpoint.pt`` written by ``train``.
        episodes: episodes to run (one env each, per worker).
        device: where the evaluation envs and agent run.
        backend: env backend (default: the training run's); the run's evaluation env arguments
            (``evaluation_env_kwargs``) apply on its own backend only.
        seed: the seed of the envs and agents, as a training run's evaluation takes it
            (:func:`~.seeds.evaluation_seeds`).
        n_processes: evaluation worker processes (0: this process).
        max_steps: steps per episode at most (``None``: the env's time limit); an episode cut there counts its
            partial return.
        policy: ``"greedy"`` or ``"sample"`` (``None``: the run's ``evaluation_policy``).
        returns: also give each episode's return, in env order (``"returns"``): the spread the mean hides, e.g.
            the episodes where a HalfCheetah policy flips over.
        trust_code: import the code the run names (its algorithm, network or env module) also when it is neither
            rlstruct's nor an installed package's (:func:`~.registry.check_run_code`): a run's own code runs.

    Returns:
        ``{"eval_return", "return_min", "return_max", "episodes", "policy", "env", "algo", "checkpoint"}``, and
        ``"returns"`` (a list of floats) with ``returns``.

    Raises:
        DeviceUnavailableError: ``device`` does not exist here.
        CheckpointError: ``path`` is missing, unreadable, not an rlstruct checkpoint, or a damaged one.
        UntrustedCodeError: the run names code that is not trusted, and not ``trust_code``.
        ValueError: ``episodes < 1``, ``max_steps < 1`` or an unknown ``policy``.
    """
    check_device_exists(device, argument="device")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 or None (the env's time limit), got {max_steps}")
    ckpt = load_checkpoint(path, argument="checkpoint")
    check_run_code(ckpt, path, trust_code=trust_code)
    cfg, spec = ckpt["config"], ckpt["env_spec"]
    create_agent, agent_args, agent_info = evaluation_agent(saved_algorithm(ckpt), cfg, EnvSpec.from_dict(spec),
                                                            device, policy=policy)
    check_model_fits(create_agent, agent_args, ckpt["model"], path)
    n_workers = max(n_processes, 1)
    per_worker = -(-episodes // n_workers)
    env_args = {"name": cfg["env"], "n_envs": per_worker, "backend": backend or stepped_backend(ckpt),
                "max_episode_steps": spec["max_episode_steps"], "autoreset": False, "device": device,
                "env_kwargs": saved_evaluation_env_kwargs(cfg, backend)}
    if max_steps is None or max_steps > spec["max_episode_steps"]:
        max_steps = spec["max_episode_steps"]
    chunk = min(max_steps, cfg.get("evaluation_chunk_steps", RunConfig.evaluation_chunk_steps))
    env_seeds, agent_seeds = evaluation_seeds(seed, n_workers)
    # The run's torch threads (1 by default), as its training and its in-run evaluations had them: with torch's
    # default of one a core, a small model's forward passes on a busy machine spend more CPU time spinning the other
    # threads than computing (32 CartPole episodes: 10.9 CPU s, 3.7 with one thread, on two busy cores).
    previous = set_torch_threads(int(cfg.get("torch_threads", RunConfig.torch_threads)))
    try:
        with RL_Batcher(chunk, create_agent, agent_args, create_env, env_args, n_processes, env_seeds,
                        agent_info=agent_info, agent_seeds=agent_seeds, device=device) as batcher:
            batcher.update(ckpt["model"])
            tally = run_episodes(batcher, max_steps)
    finally:
        set_torch_threads(previous)
    episode_returns = tally.returns[:episodes]
    result = {
        "eval_return": float(episode_returns.mean()),
        "return_min": float(episode_returns.min()),
        "return_max": float(episode_returns.max()),
        "episodes": int(episode_returns.shape[0]),
        "policy": policy or cfg.get("evaluation_policy", "greedy"),
        "env": cfg["env"],
        "algo": ckpt["algo"],
        "checkpoint": str(path),
    }
    if returns:
        result["returns"] = episode_returns.tolist()
    return result
