"""The arguments RL_Batcher and RayBatcher share, checked once: :class:`BatcherArgs` and the checks behind it."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from rlstruct._accel import accelerator_for
from rlstruct.agents import RL_Agent
from rlstruct.batchers._placement import WorkerPlacement
from rlstruct.devices import DeviceLike, as_device, check_device_exists
from rlstruct.envs import VecEnv
from rlstruct.errors import BatchSizeError, ConfigError, DeviceMismatchError
from rlstruct.seeding import check_env_index, check_seed
from rlstruct.structures import DictTensor

__all__ = ["DEFAULT_START_TIMEOUT", "BatcherArgs", "check_cpu", "check_cpu_state_dict"]

#: seconds a batcher's start may last by default, at least: a worker process imports torch and builds its env.
DEFAULT_START_TIMEOUT = 120.0


def check_cpu(d: DictTensor | None, name: str) -> DictTensor:
    """``d`` (or an empty DictTensor for ``None``), checked to be a DictTensor of rows (at least one, each tensor
    with a batch dimension) on the CPU."""
    if d is None:
        return DictTensor({})
    if not isinstance(d, DictTensor):
        raise TypeError(f"{name} must be a DictTensor, got {type(d).__name__}; wrap it with DictTensor({{...}})")
    dev = d.device()
    if dev is not None and dev.type != "cpu":
        raise DeviceMismatchError(f"{name} must be on the CPU, got {dev}; build {name} on the CPU (.to('cpu'))")
    for k, v in d.items():
        # A 0-d tensor has no row to repeat or split over the envs; 0 rows leave no example row for reset's default.
        if v.dim() == 0:
            raise BatchSizeError(
                f"{name} must hold rows [B, ...], but key {k!r} is 0-d (shape ()); give it a batch dimension, "
                f"e.g. {name}=DictTensor({{{k!r}: x.unsqueeze(0)}})"
            )
        if v.shape[0] == 0:
            raise BatchSizeError(
                f"{name} must hold at least one row, but key {k!r} has shape {tuple(v.shape)} (0 rows); pass one "
                f"example row (shape (1, ...)), or an empty DictTensor for no {name}"
            )
    return d


def check_cpu_state_dict(state_dict: Any) -> None:
    """Raises DeviceMismatchError when a tensor of ``state_dict`` (given to ``update``) is not on the CPU."""
    if isinstance(state_dict, dict):
        for k, v in state_dict.items():
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                raise DeviceMismatchError(
                    f"update() takes a CPU state dict, but {k!r} is on {v.device}; "
                    "send {k: v.cpu() for k, v in model.state_dict().items()}"
                )


def _seed_list(seeds: object, name: str, n_seeds: int, per: str) -> list:
    """``seeds`` as a list, or TypeError naming ``name`` when it is not a sequence of seeds."""
    message = (
        f"{name} must be a sequence of ints, one per {per} ({n_seeds}), got {type(seeds).__name__} {seeds!r}; "
        f"pass e.g. {name}={list(range(n_seeds))!r}"
    )
    # A str is iterable too, but never a list of seeds.
    if seeds is None or isinstance(seeds, (str, bytes)):
        raise TypeError(message)
    try:
        return list(seeds)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(message) from None


def _check_seeds(seeds: Any, agent_seeds: Any, n_seeds: int, per: str, count: str, hint: str) -> list[int]:
    """``seeds`` as a list of ints, checked with ``agent_seeds`` to hold ``n_seeds`` seeds, one ``per`` unit
    (``count`` says how their number is computed, ``hint`` how they are used)."""
    seeds = _seed_list(seeds, "seeds", n_seeds, per)
    if len(seeds) != n_seeds:
        raise ConfigError(
            f"seeds must hold one seed per {per}, {count} = {n_seeds}, got {len(seeds)} ({seeds!r}); {hint}"
        )
    if agent_seeds is not None:
        agent_seeds = _seed_list(agent_seeds, "agent_seeds", n_seeds, per)
        if len(agent_seeds) != n_seeds:
            raise ConfigError(
                f"agent_seeds must hold one seed per {per} ({n_seeds}), got {len(agent_seeds)}; or pass None"
            )
    for k, s in enumerate(seeds):
        check_seed(s, argument=f"seeds[{k}]")
    first: dict[int, int] = {}
    for k, s in enumerate(seeds):
        if int(s) in first:
            # Two workers on one seed see the same frames and take the same actions: half the compute is spent
            # on copies, and the statistics count one run twice.
            raise ConfigError(
                f"seeds must be distinct, one per {per}, but seeds[{first[int(s)]}] and seeds[{k}] are both {s!r} "
                f"(got {seeds!r}): those workers would step identical envs; pass distinct seeds, e.g. "
                f"seeds={list(range(n_seeds))!r}"
            )
        first[int(s)] = k
    for k, s in enumerate(agent_seeds or []):
        check_seed(s, argument=f"agent_seeds[{k}]")
    return [int(s) for s in seeds]


def _one_seed(seeds: Any, agent_seeds: Any, create_env: Callable[..., Any],
              env_args: Mapping[str, Any]) -> tuple[int, int | None, int]:
    """The batcher's one seed, its one agent seed (or ``None``) and the envs per worker (``env_args["n_envs"]``)
    when ``seeds`` is one int: every worker seeds its envs by their global index, which ``create_env`` must take."""
    seed = check_seed(seeds, argument="seeds")
    if agent_seeds is not None:
        if isinstance(agent_seeds, bool) or not isinstance(agent_seeds, (int, np.integer)):
            raise TypeError(
                f"agent_seeds must be one int (or None) when seeds is one int, got {type(agent_seeds).__name__} "
                f"{agent_seeds!r}; pass e.g. seeds=0, agent_seeds=1"
            )
        agent_seeds = check_seed(agent_seeds, argument="agent_seeds")
    n_envs = env_args.get("n_envs")
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ConfigError(
            f"with one seed (seeds={seed}) env_args must hold 'n_envs', the envs of each worker, an int >= 1, got "
            f"{n_envs!r}: worker k's envs are the envs k * n_envs, ... of the batcher; add it, or pass one seed per "
            "worker"
        )
    if not _takes(create_env, "env_index"):
        name = getattr(create_env, "__qualname__", "create_env")
        raise TypeError(
            f"with one seed (seeds={seed}) each worker calls create_env(**env_args, seed=..., env_index=i), i the "
            f"global index of its first env, but {name} takes no env_index; add an env_index=0 parameter (env k is "
            "env env_index + k of the seed), or pass one seed per worker, seeds=[s0, s1, ...]"
        )
    return seed, agent_seeds, n_envs


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` (a function or a class) takes the keyword ``name`` (or any keyword); ``True`` when its signature
    cannot be read."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _check_factories(create_agent: Any, agent_args: Any, create_env: Any, env_args: Any) -> None:
    """Refuses what cannot build a worker's agent and env, before any worker starts."""
    if isinstance(create_agent, RL_Agent) or not callable(create_agent):
        raise TypeError(
            "create_agent must be a class or function that builds the agent, called as create_agent(**agent_args) "
            f"in each worker, got {_what(create_agent)}; pass the class, "
            f"create_agent={_name(create_agent, 'MyAgent')}, and its arguments in agent_args={{...}}"
        )
    if isinstance(create_env, VecEnv) or not callable(create_env) or _is_gymnasium_env(create_env):
        raise TypeError(
            f"create_env must be a class or function that builds a VecEnv, called as "
            f"create_env(**env_args, seed=...) in each worker, got {_what(create_env)}; pass the class, "
            f"create_env={_name(create_env, 'MyEnv')}, and its arguments in env_args={{...}}, or for a gymnasium id "
            "create_env=make_env, env_args={'name': 'CartPole-v1', 'n_envs': 8, 'backend': 'gymnasium'}"
        )
    for name, value in (("agent_args", agent_args), ("env_args", env_args)):
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{name} must be a dict of keyword arguments, got {_what(value)}; pass {name}={{}} for none"
            )


def _what(x: Any) -> str:
    return f"{x!r}" if x is None else f"an instance of {type(x).__name__}"


def _name(x: Any, default: str) -> str:
    """The class to name instead of the instance ``x``: its own for an rlstruct agent or env, else ``default``."""
    return type(x).__name__ if isinstance(x, (RL_Agent, VecEnv)) else default


def _is_gymnasium_env(x: Any) -> bool:
    """True for a gymnasium env (``gym.make(...)``, wrapped or not), told by its type's module without importing
    gymnasium."""
    return any(c.__module__.split(".")[0] == "gymnasium" and c.__name__ in ("Env", "VectorEnv")
               for c in type(x).__mro__)


def _check_numbers(n_timesteps: Any, timeout: Any, start_timeout: Any, restart_workers: Any) -> None:
    # bool is an int subclass: True would pass as 1 and later fail far from here.
    if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int):
        raise TypeError(
            f"n_timesteps must be an int >= 1, got {type(n_timesteps).__name__} {n_timesteps!r}; pass e.g. "
            "n_timesteps=16"
        )
    if n_timesteps < 1:
        raise ValueError(f"n_timesteps must be an int >= 1, got {n_timesteps!r}; pass e.g. n_timesteps=16")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds > 0, got {type(timeout).__name__} {timeout!r}; every wait on "
            "a worker has a limit, so pass e.g. timeout=120 (math.inf to wait forever)"
        )
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}; pass e.g. timeout=120")
    if start_timeout is not None:
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float)):
            raise TypeError(
                f"start_timeout must be a number of seconds > 0 or None, got {type(start_timeout).__name__} "
                f"{start_timeout!r}; pass e.g. start_timeout=300, or None for max(timeout, {DEFAULT_START_TIMEOUT:g})"
            )
        if math.isnan(start_timeout) or start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0 seconds or None, got {start_timeout!r}; pass e.g. "
                             "start_timeout=300")
    if isinstance(restart_workers, bool) or not isinstance(restart_workers, int) or restart_workers < 0:
        raise ValueError(
            f"restart_workers must be an int >= 0 (how many failed workers may be replaced; 0 fails at the first), "
            f"got {restart_workers!r}; pass e.g. restart_workers=3"
        )


@dataclass(frozen=True)
class BatcherArgs:
    """The arguments RL_Batcher and RayBatcher share, checked (see :class:`~rlstruct.batchers.RL_Batcher` for each).

    An RL_Batcher is built from them; a RayBatcher gives each actor a copy with the actor's own seeds and device
    (:meth:`for_actor`), from which the actor builds its RL_Batcher.
    """

    n_timesteps: int
    create_agent: Callable[..., Any]
    agent_args: dict
    create_env: Callable[..., Any]
    env_args: dict
    n_processes: int
    seeds: list[int]
    agent_info: DictTensor
    env_info: DictTensor
    agent_seeds: list[int] | None
    device: torch.device
    worker_placements: list[WorkerPlacement] | None
    timeout: float
    start_timeout: float
    sync_timings: bool
    cuda_graph: bool
    zero_copy: bool
    restart_workers: int
    #: the batcher's one seed (``seeds`` given as an int), ``None`` for one seed per worker
    seed: int | None = None
    #: with one seed: the envs of each worker, and the global index of the batcher's first env
    envs_per_worker: int = 0
    env_index: int = 0

    @classmethod
    def check(
        cls, n_timesteps: int, create_agent: Callable[..., Any], agent_args: dict, create_env: Callable[..., Any],
        env_args: dict, n_processes: int, seeds: Sequence[int], agent_info: DictTensor | None,
        env_info: DictTensor | None, agent_seeds: Sequence[int] | None, device: DeviceLike,
        worker_placements: Sequence[WorkerPlacement] | None, timeout: float, sync_timings: bool, cuda_graph: bool,
        zero_copy: bool, restart_workers: int, *, start_timeout: float | None = None, n_actors: int | None = None,
        env_index: int = 0,
    ) -> BatcherArgs:
        """The arguments, checked; ``n_actors``: the RayBatcher's actor count (``None`` for an RL_Batcher), which
        sets how many seeds are expected and how messages put it. ``start_timeout=None`` becomes
        ``max(timeout, DEFAULT_START_TIMEOUT)``. ``seeds`` one int (and ``agent_seeds`` one int or ``None``): every
        worker gets these seeds and the global index of its first env, ``env_index + k * env_args["n_envs"]``.

        Raises:
            TypeError: ``n_timesteps`` not an int (a bool included), ``timeout`` or ``start_timeout`` not a
                number, ``seeds`` or ``agent_seeds`` not a sequence, ``agent_info``/``env_info`` not a DictTensor,
                ``create_agent`` or ``create_env`` not a class or function (an agent or env instance, a gymnasium
                env), ``agent_args``/``env_args`` not a mapping.
            ValueError: ``n_processes < 0``, ``n_timesteps < 1``, ``timeout <= 0``, ``start_timeout <= 0`` or
                ``restart_workers < 0``.
            ConfigError: ``seeds`` or ``agent_seeds`` does not hold one seed per worker, or ``seeds`` repeats one;
                ``seeds`` one int and ``env_args`` without an int ``n_envs``.
            SeedError: a seed is not an int in ``[0, 2**31)``.
            DeviceMismatchError: ``agent_info``/``env_info`` not on the CPU.
            BatchSizeError: ``agent_info``/``env_info`` with a 0-d tensor or no row.
        """
        if not isinstance(n_processes, int) or n_processes < 0:
            what = "0 runs in this process" if n_actors is None else "worker processes per actor; 0 runs in the actor"
            raise ValueError(f"n_processes must be an int >= 0 ({what}), got {n_processes!r}")
        _check_numbers(n_timesteps, timeout, start_timeout, restart_workers)
        _check_factories(create_agent, agent_args, create_env, env_args)
        per_unit = max(n_processes, 1)
        env_index = check_env_index(env_index)
        one_seed, envs_per_worker = None, 0
        if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
            one_seed, agent_seed, envs_per_worker = _one_seed(seeds, agent_seeds, create_env, env_args)
            n_units = per_unit * (n_actors or 1)
            seeds = [one_seed] * n_units
            agent_seeds = None if agent_seed is None else [agent_seed] * n_units
        elif n_actors is None:
            seeds = _check_seeds(seeds, agent_seeds, per_unit, "worker", "max(n_processes, 1)",
                                 "with n_processes=0 the one seed is the in-process env's")
        else:
            seeds = _check_seeds(seeds, agent_seeds, n_actors * per_unit, "worker of every actor",
                                 "n_actors * max(n_processes, 1)",
                                 f"actor k takes seeds[k * {per_unit}:(k + 1) * {per_unit}]")
        return cls(
            n_timesteps, create_agent, dict(agent_args), create_env, dict(env_args), n_processes, seeds,
            check_cpu(agent_info, "agent_info"), check_cpu(env_info, "env_info"),
            None if agent_seeds is None else list(agent_seeds), as_device(device),
            None if worker_placements is None else list(worker_placements), float(timeout),
            max(float(timeout), DEFAULT_START_TIMEOUT) if start_timeout is None else float(start_timeout),
            bool(sync_timings),
            bool(cuda_graph), bool(zero_copy), restart_workers, one_seed, envs_per_worker, env_index,
        )

    def check_placements(self, placements: list[WorkerPlacement], unit: str, fix: str) -> None:
        """Checks the ``placements`` of the units (workers, actors) against ``cuda_graph`` and ``device`` itself.

        Raises:
            ValueError: ``cuda_graph=True`` with a ``unit`` not on a CUDA device (``fix`` says how to put it on one).
            DeviceUnavailableError: ``device`` does not exist on this machine.
        """
        if self.cuda_graph:
            off_gpu = [k for k, p in enumerate(placements) if accelerator_for(p.device) is None]
            if off_gpu:
                raise ValueError(
                    f"cuda_graph=True needs every {unit} on a CUDA device, but {unit} {off_gpu[0]} runs on "
                    f"{placements[off_gpu[0]].device}; {fix}, or cuda_graph=False"
                )
        # Here rather than when a worker first touches it: a missing GPU otherwise surfaces as a worker's
        # "Torch not compiled with CUDA enabled". Asks the driver for its device count only, no CUDA context.
        check_device_exists(self.device, argument="device")

    def worker_env_index(self, k: int) -> int | None:
        """The global index of worker ``k``'s first env with one seed, ``None`` with one seed per worker."""
        return None if self.seed is None else self.env_index + k * self.envs_per_worker

    def first_seeds(self, n_units: int) -> list[tuple[int, int | None]]:
        """The first ``(env seed, agent seed)`` of each of ``n_units`` units that share the seeds in order."""
        per = len(self.seeds) // n_units
        agent = self.agent_seeds
        return [(self.seeds[k * per], None if agent is None else int(agent[k * per])) for k in range(n_units)]

    def for_actor(self, k: int, n_actors: int, device: torch.device) -> dict[str, Any]:
        """The keyword arguments of actor ``k``'s RL_Batcher: its slice of the seeds, on ``device``."""
        per = len(self.seeds) // n_actors
        w = slice(k * per, (k + 1) * per)
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.seed is None:
            kwargs.update(seeds=self.seeds[w], agent_seeds=None if self.agent_seeds is None else self.agent_seeds[w])
        else:
            kwargs.update(seeds=self.seed, agent_seeds=None if self.agent_seeds is None else self.agent_seeds[0],
                          env_index=self.env_index + k * per * self.envs_per_worker)
        kwargs.update(device=device)
        for name in ("seed", "envs_per_worker"):
            del kwargs[name]
        return kwargs
