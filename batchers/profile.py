"""Where the time of a training loop goes: collection phases from the batcher, learner phases from timers.

:func:`profile_training` runs a short collection + learning loop (an MLP policy trained by a plain
policy-gradient loss) and returns a :class:`ProfileReport`: seconds and shares of wall-clock time for
env step, agent forward, buffer writes, host–device copies, waiting on workers, loss, backward,
optimizer and weight updates. The collection phases come from :meth:`RL_Batcher.timings`; the learner
phases from :class:`PhaseTimer`, which synchronizes a GPU only at phase boundaries, so the numbers are
honest without slowing the phases themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlstruct.agents import RL_Agent
from rlstruct.devices import DeviceLike, as_device, check_device_exists
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor, Trajectories

from rlstruct.batchers._common import pyplot, save_png
from rlstruct.batchers.batcher import RL_Batcher

__all__ = [
    "PhaseTimer",
    "ProfileReport",
    "profile_training",
    "MLPAgent",
    "mlp_policy",
    "env_dims",
    "discounted_returns",
    "policy_gradient_loss",
    "WORKER_PHASES",
    "LEARNER_PHASES",
]

log = logging.getLogger(__name__)

#: Collection phases measured in the batcher's workers (see :meth:`RL_Batcher.timings`).
WORKER_PHASES = ("env_step", "agent_forward", "buffer_write", "copy", "graph_replay")
#: Learner phases of :func:`profile_training`, in loop order.
LEARNER_PHASES = ("to_learner", "loss", "backward", "optimizer", "update_weights")


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase.

    With ``sync=True`` on a CUDA device it calls ``torch.cuda.synchronize`` when a phase starts and when it
    ends, and nowhere else: the GPU work queued inside a phase is charged to it, and the phase itself runs
    unsynchronized.

    Args:
        device: the device whose queued work belongs to the phases (only CUDA is synchronized).
        sync: synchronize at phase boundaries (ignored off CUDA).

    >>> timer = PhaseTimer()
    >>> with timer("loss"):
    ...     _ = sum(range(1000))
    >>> with timer("loss"):
    ...     pass
    >>> list(timer.seconds), timer.counts["loss"]
    (['loss'], 2)
    """

    def __init__(self, device: DeviceLike = "cpu", *, sync: bool = True):
        self.device = as_device(device)
        self._sync = sync and self.device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def _tick(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = self._tick()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self._tick() - t0
            self.counts[name] = self.counts.get(name, 0) + 1

    def reset(self) -> None:
        """Forgets every phase."""
        self.seconds.clear()
        self.counts.clear()


# --------------------------------------------------------------------------- the policy
def mlp_policy(obs_dim: int, n_actions: int, hidden: int = 64, seed: int = 0) -> nn.Module:
    """An MLP ``obs_dim → hidden → hidden → n_actions`` (tanh), initialised from ``seed`` alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                             nn.Linear(hidden, n_actions))


class MLPAgent(RL_Agent):
    """Samples actions from the softmax of :func:`mlp_policy` over ``observation["frame"]``.

    Args:
        obs_dim: size of ``frame``.
        n_actions: number of discrete actions.
        hidden: hidden width.
        device: where the model and its outputs live.
        seed: initialises the weights (and the sampling generator until :meth:`seed`).
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, device: DeviceLike = "cpu", seed: int = 0):
        self.device = as_device(device)
        self.model = mlp_policy(obs_dim, n_actions, hidden, seed).to(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info, history=None):
        probs = torch.softmax(self.model(observation["frame"]), -1)
        action = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return DictTensor._trusted({"action": action}), state

    def update(self, state_dict) -> None:
        self.model.load_state_dict(state_dict)


def env_dims(env: str, backend: str = "torch") -> tuple[int, int]:
    """``(obs_dim, n_actions)`` of ``env``, read from a one-env CPU instance.

    Raises:
        SpaceError: the env's actions are not discrete or its observation is not a flat ``frame``.
    """
    from rlstruct.envs import make_env

    e = make_env(env, 1, backend=backend)
    try:
        obs_space, act_space = e.observation_space, e.action_space
    finally:
        e.close()
    if not hasattr(act_space, "n") or len(getattr(obs_space, "shape", ()) or ()) != 1:
        raise SpaceError(
            f"env must have discrete actions and a flat observation for the built-in MLP policy, got {env!r} with "
            f"action space {act_space} and observation space {obs_space}; use CartPole-v1, Acrobot-v1 or "
            "MountainCar-v0"
        )
    return int(obs_space.shape[0]), int(act_space.n)


# --------------------------------------------------------------------------- the loss
def discounted_returns(reward: torch.Tensor, done: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go within each trajectory, cut at episode ends.

    Args:
        reward: ``float [B, T]``, the reward received after step ``t``.
        done: ``bool [B, T]``, whether the episode ended at step ``t``.
        mask: ``float [B, T]``, 1 for steps within ``lengths``.
        gamma: discount.

    Returns:
        ``G [B, T]``: ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}``, 0 beyond ``lengths``
        (so the last step of a segment bootstraps with 0).

    >>> r = torch.ones(1, 3); d = torch.tensor([[False, True, False]])
    >>> discounted_returns(r, d, torch.ones(1, 3), 0.5)
    tensor([[1.5000, 1.0000, 1.0000]])
    """
    out = torch.zeros_like(reward)
    g = torch.zeros_like(reward[:, 0])
    keep = (~done).to(reward.dtype)
    for t in range(reward.shape[1] - 1, -1, -1):
        g = (reward[:, t] + gamma * keep[:, t] * g) * mask[:, t]
        out[:, t] = g
    return out


def policy_gradient_loss(model: nn.Module, trajectories: Trajectories, gamma: float = 0.99) -> torch.Tensor:
    """REINFORCE on reward-to-go with a mean baseline, over the valid steps of ``trajectories``."""
    tr = trajectories.trajectories
    mask = tr.mask().to(torch.float32)
    returns = discounted_returns(tr["_observation/reward"].float(), tr["_observation/done"], mask, gamma)
    logp = torch.log_softmax(model(tr["observation/frame"]), -1)
    logp_a = logp.gather(-1, tr["action/action"].unsqueeze(-1)).squeeze(-1)
    n = mask.sum().clamp(min=1.0)
    advantage = (returns - (returns * mask).sum() / n) * mask
    return -(logp_a * advantage).sum() / n


# --------------------------------------------------------------------------- the report
@dataclass
class ProfileReport:
    """Seconds per phase of a profiled loop; they add up to ``wall_s``.

    Attributes:
        seconds: phase → seconds, in display order: the worker phases (``env_step``, ``agent_forward``,
            ``buffer_write``, ``copy``, ``graph_replay``: the replayed steps with ``cuda_graph``; averaged over
            workers, and scaled down to the collection time when workers overlap), ``wait`` (collection time not spent in the workers' step loop: IPC, imbalance,
            start of the acquisition), ``gather`` (copy out of the batcher's buffer), the learner phases
            (``to_learner``: host–device copy of the trajectories, ``loss``, ``backward``, ``optimizer``,
            ``update_weights``), then ``other``.
        wall_s: wall-clock seconds of the profiled iterations.
        env_steps: env transitions collected.
        iterations: collection + learning iterations profiled.
        batcher_timings: the raw :meth:`RL_Batcher.timings` (summed over workers).
        config: the arguments of the run.
    """

    seconds: dict[str, float]
    wall_s: float
    env_steps: int
    iterations: int
    batcher_timings: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def shares(self) -> dict[str, float]:
        """Phase → fraction of ``wall_s``."""
        total = sum(self.seconds.values()) or 1.0
        return {k: v / total for k, v in self.seconds.items()}

    @property
    def steps_per_s(self) -> float:
        """Env transitions per wall-clock second, learning included."""
        return self.env_steps / self.wall_s if self.wall_s > 0 else 0.0

    def table(self) -> str:
        """A plain-text table: phase, seconds, share."""
        lines = [f"{'phase':<16}{'seconds':>10}{'share':>8}"]
        for (k, v), s in zip(self.seconds.items(), self.shares().values()):
            lines.append(f"{k:<16}{v:>10.4f}{100 * s:>7.1f}%")
        lines.append(f"{'total':<16}{sum(self.seconds.values()):>10.4f}{100.0:>7.1f}%")
        lines.append(f"{self.env_steps} env steps in {self.wall_s:.3f} s: {self.steps_per_s:,.0f} steps/s "
                     "(learning included)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: seconds, shares, wall_s, env_steps, steps_per_s, iterations, config."""
        return {"seconds": dict(self.seconds), "shares": self.shares(), "wall_s": self.wall_s,
                "env_steps": self.env_steps, "steps_per_s": self.steps_per_s, "iterations": self.iterations,
                "config": dict(self.config)}

    def plot(self, path: str | Path) -> Path:
        """Writes a horizontal bar chart of the seconds per phase (PNG, matplotlib Agg).

        Raises:
            MissingDependencyError: matplotlib is not installed.
        """
        plt = pyplot()
        names = list(self.seconds)[::-1]
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(names) + 1.2))
        bars = ax.barh(names, [self.seconds[k] for k in names], color="tab:blue")
        shares = self.shares()
        for bar, k in zip(bars, names):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {100 * shares[k]:.1f}%", va="center")
        ax.set_xlabel("seconds")
        ax.set_title(f"where the time goes ({self.steps_per_s:,.0f} env steps/s, learning included)")
        ax.margins(x=0.15)
        return save_png(plt, fig, path)


def split_collection(timings: dict[str, float], collect_s: float, n_workers: int) -> dict[str, float]:
    """Attributes ``collect_s`` seconds of driver time to the worker phases and ``wait``.

    The worker phases are averaged over workers (they run side by side); if they exceed ``collect_s``
    (a worker collected while the driver did something else), they are scaled down to it, and ``wait``
    is what remains.

    >>> split_collection({"env_step": 4.0, "agent_forward": 2.0, "buffer_write": 0.0, "copy": 0.0}, 4.0, 2)
    {'env_step': 2.0, 'agent_forward': 1.0, 'buffer_write': 0.0, 'copy': 0.0, 'graph_replay': 0.0, 'wait': 1.0}
    """
    per = {k: timings.get(k, 0.0) / max(n_workers, 1) for k in WORKER_PHASES}
    busy = sum(per.values())
    scale = min(1.0, collect_s / busy) if busy > 0 else 1.0
    out = {k: v * scale for k, v in per.items()}
    out["wait"] = max(collect_s - busy * scale, 0.0)
    return out


def profile_training(
    env: str = "CartPole-v1",
    *,
    n_envs: int = 256,
    n_processes: int = 0,
    n_timesteps: int = 32,
    iterations: int = 10,
    device: DeviceLike = "cpu",
    learner_device: DeviceLike | None = None,
    backend: str = "torch",
    hidden: int = 64,
    lr: float = 1e-3,
    gamma: float = 0.99,
    seed: int = 0,
    sync: bool = True,
    cuda_graph: bool = False,
    zero_copy: bool = False,
) -> ProfileReport:
    """Runs ``iterations`` of collect → learn and reports where the time goes.

    Each iteration: ``execute`` + ``get`` on an :class:`RL_Batcher` (``n_processes`` workers of ``n_envs``
    envs each on ``device``), the trajectories to ``learner_device``, a policy-gradient loss, backward, an
    Adam step, and ``update`` of the workers' weights. One warm-up iteration runs first and is not counted.

    Args:
        env: a gymnasium id with discrete actions (``CartPole-v1``, ``Acrobot-v1``, ``MountainCar-v0``).
        n_envs: envs per worker.
        n_processes: batcher worker processes (0: this process).
        n_timesteps: steps per acquisition.
        iterations: profiled iterations.
        device: the batcher's device (envs, agent, output).
        learner_device: where the loss runs (default ``device``).
        backend: env backend for :func:`~rlstruct.envs.make_env`.
        hidden: width of the MLP policy.
        lr: Adam learning rate.
        gamma: discount.
        seed: seeds the envs, the policy and the sampling.
        sync: synchronize a GPU at phase boundaries (the batcher's ``sync_timings`` and the
            :class:`PhaseTimer`), so that the split is exact; off, GPU phases show up where the work is
            waited for.
        cuda_graph: the batcher's ``cuda_graph`` (a GPU ``device``): its steps then show as ``graph_replay``.
            Two warm-up iterations run instead of one (the first acquisition is eager, the second captures).
        zero_copy: the batcher's ``zero_copy``: ``get`` returns views of its buffer, and ``gather`` shrinks to
            wrapping them (each iteration uses its trajectories before the next ``execute``).

    Returns:
        A :class:`ProfileReport`.

    Raises:
        ValueError: ``iterations``, ``n_envs`` or ``n_timesteps`` below 1.
        SpaceError: ``env`` does not have discrete actions.
        DeviceUnavailableError: a device this machine does not have.
        ValueError: ``cuda_graph`` with a ``device`` other than CUDA.

    >>> report = profile_training("CartPole-v1", n_envs=8, n_timesteps=4, iterations=2)
    >>> list(report.seconds)[:5], report.env_steps
    (['env_step', 'agent_forward', 'buffer_write', 'copy', 'graph_replay'], 64)
    >>> round(sum(report.shares().values()), 6)
    1.0
    """
    for name, value in (("iterations", iterations), ("n_envs", n_envs), ("n_timesteps", n_timesteps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(n_processes, int) or n_processes < 0:
        raise ValueError(f"n_processes must be an int >= 0 (0 runs in this process), got {n_processes!r}")
    dev = check_device_exists(device)
    ldev = dev if learner_device is None else check_device_exists(learner_device)
    obs_dim, n_actions = env_dims(env, backend)
    from rlstruct.envs import make_env

    n_workers = max(n_processes, 1)
    agent_args = {"obs_dim": obs_dim, "n_actions": n_actions, "hidden": hidden, "device": str(dev), "seed": seed}
    env_args = {"name": env, "n_envs": n_envs, "device": str(dev), "autoreset": True, "backend": backend}
    model = mlp_policy(obs_dim, n_actions, hidden, seed).to(ldev)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    timer = PhaseTimer(ldev, sync=sync)
    with RL_Batcher(n_timesteps, MLPAgent, agent_args, make_env, env_args, n_processes,
                    [seed + k for k in range(n_workers)], agent_seeds=[seed + 1000 + k for k in range(n_workers)],
                    device=dev, sync_timings=sync, cuda_graph=cuda_graph, zero_copy=zero_copy) as batcher:
        batcher.reset()

        def iteration() -> None:
            t0 = time.perf_counter()
            batcher.execute()  # in-process (n_processes=0), the whole acquisition runs here
            timer.seconds["_execute"] = timer.seconds.get("_execute", 0.0) + time.perf_counter() - t0
            traj, _ = batcher.get()
            with timer("to_learner"):
                traj = traj.to(ldev)
            with timer("loss"):
                loss = policy_gradient_loss(model, traj, gamma)
            with timer("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with timer("optimizer"):
                optimizer.step()
            with timer("update_weights"):
                batcher.update({k: v.detach().cpu() for k, v in model.state_dict().items()})

        for _ in range(2 if cuda_graph else 1):  # warm-up: allocator, lazy inits (and the graph's capture)
            iteration()
        batcher.reset_timings()
        timer.reset()
        if sync and dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(iterations):
            iteration()
        wall = time.perf_counter() - t0
        bt = batcher.timings()
    seconds = split_collection(bt, timer.seconds.pop("_execute", 0.0) + bt["wait"], n_workers)
    seconds["gather"] = bt["gather"]
    for k in LEARNER_PHASES:
        seconds[k] = timer.seconds.get(k, 0.0)
    seconds["other"] = max(wall - sum(seconds.values()), 0.0)
    config = {"env": env, "n_envs": n_envs, "n_processes": n_processes, "n_timesteps": n_timesteps,
              "iterations": iterations, "device": str(dev), "learner_device": str(ldev), "backend": backend,
              "hidden": hidden, "sync": sync, "cuda_graph": cuda_graph, "zero_copy": zero_copy}
    return ProfileReport(seconds, wall, int(bt["env_steps"]), iterations, bt, config)

