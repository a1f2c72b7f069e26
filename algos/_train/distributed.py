"""Data-parallel learners on ``torch.distributed``: the rank's view of the world, its process group, its seeds and
the averaging of its gradients (one all-reduce per backward pass). A plain run is one rank of a world of one, with
no process group. The design is in docs/concepts/training.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME
from rlstruct.errors import ConfigError, RankLostError

__all__ = [
    "World",
    "all_ranks_stop",
    "announce",
    "average_gradients",
    "broadcast_parameters",
    "check_models_agree",
    "collective",
    "effective_batch",
    "fewest_over_ranks",
    "global_sum",
    "init_process_group",
    "learner_seed",
    "mean_over_ranks",
    "models_agree",
    "process_group_backend",
    "rank_device",
    "restart_resume",
    "sum_over_ranks",
    "torchrun_restarts",
    "world_from_environment",
]



@dataclasses.dataclass(frozen=True)
class World:
    """One rank's view of a data-parallel run.

    Attributes:
        rank: this process's rank, in ``[0, size)``.
        size: the number of ranks (1 for a plain run).
        local_rank: this process's rank on its node (its GPU index when there are GPUs).
        local_size: the ranks on this node (torchrun's ``LOCAL_WORLD_SIZE``).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def distributed(self) -> bool:
        """Whether there is more than one rank (and so a process group to use)."""
        return self.size > 1

    @property
    def is_logger(self) -> bool:
        """Whether this rank evaluates, records and checkpoints (rank 0 alone)."""
        return self.rank == 0


def _int_variable(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be a non-negative integer, got {raw!r}; "
                          f"launch with torchrun, which sets it, or unset it for a single-process run") from None


def world_from_environment(env: Mapping[str, str] | None = None) -> World:
    """Read this rank's world from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

    With no ``WORLD_SIZE`` (a plain run) the world is one rank and nothing else is read.

    Args:
        env: the environment to read; ``os.environ`` when ``None``.

    Returns:
        the :class:`World`.

    Raises:
        ConfigError: a variable is not an integer, ``RANK`` is missing or outside ``[0, WORLD_SIZE)``, or
            ``WORLD_SIZE`` is below 1.

    >>> world_from_environment({})
    World(rank=0, size=1, local_rank=0, local_size=1)
    >>> world_from_environment({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}).is_logger
    False
    """
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return World()
    size = _int_variable(env, "WORLD_SIZE")
    if size < 1:
        raise ConfigError(f"environment variable WORLD_SIZE must be at least 1, got {size}; launch with torchrun")
    if "RANK" not in env:
        raise ConfigError(f"environment variable RANK must be set when WORLD_SIZE is ({size}), got nothing; "
                          f"launch with torchrun, which sets both")
    rank = _int_variable(env, "RANK")
    if not 0 <= rank < size:
        raise ConfigError(f"environment variable RANK must be in [0, {size}), got {rank}; launch with torchrun")
    local_rank = _int_variable(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    local_size = _int_variable(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else size
    return World(rank=rank, size=size, local_rank=local_rank, local_size=local_size)


def torchrun_restarts(env: Mapping[str, str] | None = None) -> int | None:
    """How many times ``torchrun --max-restarts N`` restarted this process's group (0: its first attempt), or None
    when torchrun did not launch it (``TORCHELASTIC_RESTART_COUNT`` unset).

    >>> torchrun_restarts({}), torchrun_restarts({"TORCHELASTIC_RESTART_COUNT": "1"})
    (None, 1)
    """
    env = os.environ if env is None else env
    restarts = env.get("TORCHELASTIC_RESTART_COUNT")
    return int(restarts) if restarts is not None and restarts.isdigit() else None


def restart_resume(resume: str | None, logdir: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The run that a group restarted by ``torchrun --max-restarts N`` continues: ``logdir``, when torchrun says
    this is a restart (``TORCHELASTIC_RESTART_COUNT`` above 0), no ``resume`` was given, and ``logdir`` holds a
    checkpoint (rank 0's last periodic one, ``--checkpoint-every``); else ``None`` (a first launch, or nothing to
    continue: the group starts over).

    >>> restart_resume(None, "runs/x", {})  # a first launch
    """
    if resume is not None or logdir is None or not torchrun_restarts(env):
        return None
    return logdir if (Path(logdir) / CHECKPOINT_NAME).is_file() else None


@contextlib.contextmanager
def collective(world: World, what: str) -> Iterator[None]:
    """Turns the failure of a collective inside (``gloo``'s connection reset by a rank that died, a timeout) into
    :class:`~rlstruct.errors.RankLostError`, naming this rank, the collective and the fix.

    >>> with collective(World(rank=1, size=2, local_rank=1), "the stop vote"):
    ...     raise RuntimeError("Connection reset by peer")
    Traceback (most recent call last):
    ...
    rlstruct.errors.RankLostError: rank 1 of 2: the stop vote failed: another rank of the run died, left or did not \
answer within the timeout (Connection reset by peer); see that rank's output for why it stopped, and restart the \
run (torchrun --max-restarts N --logdir DIR resumes from its last checkpoint)
    """
    try:
        yield
    except RankLostError:
        raise
    except (RuntimeError, dist.DistError) as e:
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RankLostError(f"rank {world.rank} of {world.size}: {what} failed: another rank of the run died, left or "
                            f"did not answer within the timeout ({cause}); see that rank's output for why it stopped, "
                            "and restart the run (torchrun --max-restarts N --logdir DIR resumes from its last "
                            "checkpoint)", world.rank, world.size) from e


def rank_device(device: str, world: World, n_gpus: int) -> str:
    """This rank's device for a device setting: ``"cuda"`` without an index becomes ``cuda:LOCAL_RANK`` (modulo the
    node's ``n_gpus``, so that more ranks than GPUs share them: MPS, or MIG slices); an explicit index, the CPU, or
    a world of one keep the setting as given.

    >>> rank_device("cuda", World(rank=5, size=8, local_rank=1, local_size=4), n_gpus=2)
    'cuda:1'
    >>> rank_device("cuda", World(rank=3, size=4, local_rank=3, local_size=4), n_gpus=2)
    'cuda:1'
    >>> rank_device("cuda:0", World(1, 2, 1, 2), n_gpus=2), rank_device("cpu", World(), n_gpus=0)
    ('cuda:0', 'cpu')
    """
    if not world.distributed or device != "cuda" or n_gpus < 1:
        return device
    return f"cuda:{world.local_rank % n_gpus}"


def process_group_backend(device: torch.device, world: World, n_gpus: int) -> str:
    """``nccl`` when the learners are on GPUs, one rank per GPU; ``gloo`` on the CPU, and when ranks share a GPU
    (NCCL refuses two ranks on one device; gloo all-reduces CUDA tensors through the host).

    >>> process_group_backend(torch.device("cuda", 1), World(1, 2, 1, 2), n_gpus=2)
    'nccl'
    >>> process_group_backend(torch.device("cuda", 0), World(1, 4, 1, 4), n_gpus=1)
    'gloo'
    """
    return "nccl" if device.type == "cuda" and world.local_size <= n_gpus else "gloo"


def init_process_group(world: World, device: torch.device, *, timeout_s: float = 300.0,
                       stack: contextlib.ExitStack | None = None) -> None:
    """Join the run's process group (:func:`process_group_backend`); nothing for a world of one.

    The rendezvous reads ``MASTER_ADDR`` and ``MASTER_PORT`` from the environment (torchrun sets them).
    ``timeout_s`` bounds the rendezvous and every collective, so that a rank that died or hangs makes the others
    fail (:class:`~rlstruct.errors.RankLostError`) instead of waiting. With ``stack``, the group is destroyed when
    the stack closes.
    """
    if not world.distributed or dist.is_initialized():
        return
    backend = process_group_backend(device, world, torch.cuda.device_count() if device.type == "cuda" else 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    with collective(world, "joining the process group"):
        dist.init_process_group(backend, store=_attempt_store(world, timeout), rank=world.rank,
                                world_size=world.size, timeout=timeout)
    if stack is not None:
        stack.callback(dist.destroy_process_group)


def _attempt_store(world: World, timeout: datetime.timedelta) -> dist.Store | None:
    """Under torchrun, the rendezvous store with keys of this attempt only (``TORCHELASTIC_RESTART_COUNT``); None
    (``env://``) otherwise.

    torchrun's static rendezvous (``--master-port``) keeps one store across the restarts of ``--max-restarts``, and
    ``env://`` reads it without a per-attempt prefix: a restarted rank can read a dead rank's address from the first
    attempt and fail to connect. A prefix of the attempt keeps each group's keys apart.
    """
    attempt, env = os.environ.get("TORCHELASTIC_RESTART_COUNT"), os.environ
    if attempt is None or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    hosted_by_agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts it
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world.size,
                          is_master=not hosted_by_agent and world.rank == 0, timeout=timeout)
    return dist.PrefixStore(f"rlstruct/attempt_{attempt}", store)


def sum_over_ranks(world: World) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The function that sums a tensor over the ranks (in place, and returns it), for the statistics that every
    rank must hold alike (:mod:`~rlstruct.algos._normalization`); ``None`` for a world of one (nothing to sum).

    >>> sum_over_ranks(World()) is None
    True
    """
    if not world.distributed:
        return None

    def total(tensor: torch.Tensor) -> torch.Tensor:
        with collective(world, "the sum of the normalisation statistics"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    return total


def mean_over_ranks(value: torch.Tensor, world: World) -> torch.Tensor:
    """The mean of ``value`` (a tensor of the same shape on every rank) over the ranks, as a new tensor; ``value``
    for a world of one. For the decisions every rank must take alike from its own share, e.g. PPO's early stop on
    the approximate KL.

    >>> mean_over_ranks(torch.tensor(0.5), World())
    tensor(0.5000)
    """
    if not world.distributed:
        return value
    total = value.detach().clone()
    with collective(world, "the mean over the ranks"):
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / world.size


def effective_batch(rows_per_rank: int, steps_per_row: int, world: World) -> int:
    """The env steps one update learns from, over all ranks (``--n-envs`` is per rank).

    >>> effective_batch(8, 128, World(rank=0, size=2, local_rank=0))
    2048
    """
    return rows_per_rank * steps_per_row * world.size


def announce(world: World, what: str, per_rank: int, lr: float) -> None:
    """Rank 0 of a data-parallel run says, on stderr, what one update learns from over all ranks (``what`` of
    ``per_rank`` each: e.g. the env steps of a collection, a replay minibatch) and that the learning rate is used as
    given; nothing in a world of one.

    >>> announce(World(), "env steps per collection", 2048, 3e-4)
    """
    if world.distributed and world.is_logger:
        print(f"data-parallel: {world.size} ranks x {per_rank:,} {what} = {per_rank * world.size:,} per update "
              f"(the settings are per rank); gradients averaged over the ranks, lr {lr:g} as given", file=sys.stderr)


def _tensors(state: nn.Module | Iterable[torch.Tensor], *, buffers: bool = True) -> list[torch.Tensor]:
    """A module's parameters (and buffers), or the tensors given."""
    if isinstance(state, nn.Module):
        return [*state.parameters(), *(state.buffers() if buffers else ())]
    return list(state)


def broadcast_parameters(state: nn.Module | Iterable[torch.Tensor], world: World) -> None:
    """Copy rank 0's parameters and buffers (of a module, or the tensors given) to every rank, in place; nothing for
    a world of one."""
    if not world.distributed:
        return
    with torch.no_grad(), collective(world, "the broadcast of rank 0's weights"):
        for tensor in _tensors(state):
            dist.broadcast(tensor.data, src=0)


def average_gradients(state: nn.Module | Iterable[torch.Tensor],
                      world: World) -> list[torch.utils.hooks.RemovableHandle]:
    """Average the trained tensors' gradients across the ranks at the end of every backward pass: one all-reduce of
    the gradients that pass produced, flattened into one buffer (``gloo`` has no ``AVG``: a sum, then a division by
    the world size), so that the clipping and the optimizer step that follow see the mean gradient. Nothing is
    registered for a world of one.

    Args:
        state: the learner's model (its parameters that require a gradient), or the tensors it trains, identical
            on every rank (those that do not require a gradient are skipped).
        world: this rank's world.

    Returns:
        the hooks' handles (``handle.remove()`` undoes them).
    """
    if not world.distributed:
        return []
    scale = 1.0 / world.size
    ready: list[torch.Tensor] = []  # the tensors whose gradient this backward pass accumulated, in autograd's order

    def average() -> None:
        grads = [p.grad for p in ready]
        ready.clear()
        flat = torch.cat([g.reshape(-1) for g in grads])
        with collective(world, "the average of the gradients"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.mul_(scale)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def hook(parameter: torch.Tensor) -> None:
        if not ready:  # the first gradient of this backward: average them all once it has finished
            torch.autograd.Variable._execution_engine.queue_callback(average)
        ready.append(parameter)

    return [p.register_post_accumulate_grad_hook(hook) for p in _tensors(state, buffers=False) if p.requires_grad]


def all_ranks_stop(stop: bool | torch.Tensor, world: World) -> bool:
    """Whether any rank wants to stop (time limit, target, step budget, a signal): one small all-reduce, so that
    every rank leaves the loop at the same iteration and none waits in a collective for one that left.

    >>> all_ranks_stop(True, World())
    True
    """
    flag = torch.as_tensor(stop, dtype=torch.int32).reshape(1).cpu()
    if world.distributed:
        with collective(world, "the stop vote"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag[0])


def global_sum(value: int, world: World) -> int:
    """``value`` summed over the ranks (env steps of an iteration, whose count may differ by rank: whole episodes);
    ``value`` for a world of one.

    >>> global_sum(128, World())
    128
    """
    return _reduce_int(value, world, "SUM", "the sum of the env steps")


def fewest_over_ranks(value: int, world: World) -> int:
    """The smallest ``value`` over the ranks (e.g. the gradient steps every rank can take: each rank's replay
    buffer fills at its own pace, and a step that one rank skipped would leave the others waiting in its
    all-reduce); ``value`` for a world of one.

    >>> fewest_over_ranks(3, World())
    3
    """
    return _reduce_int(value, world, "MIN", "the count of gradient steps")


def _reduce_int(value: int, world: World, op: str, what: str) -> int:
    """``value`` reduced over the ranks by ``dist.ReduceOp.<op>`` (one int64 all-reduce named ``what`` in a lost
    rank's error); ``value`` for a world of one."""
    if not world.distributed:
        return value
    out = torch.tensor([value], dtype=torch.int64)
    with collective(world, what):
        dist.all_reduce(out, op=getattr(dist.ReduceOp, op))
    return int(out[0])


def learner_seed(seed: int, world: World) -> int:
    """The seed of a rank's own draws in the learner (replay minibatches, SAC's noise), in ``[0, 2**31)``: ``seed``
    on rank 0 (a plain run is unchanged), drawn from ``(seed, rank)`` elsewhere, so that the ranks sample apart.

    >>> learner_seed(7, World()), learner_seed(7, World(rank=1, size=2, local_rank=1)) != 7
    (7, True)
    """
    if world.rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, world.rank]).generate_state(1)[0]) % 2**31


def models_agree(state: nn.Module | Iterable[torch.Tensor], world: World) -> bool:
    """Whether every rank holds the same parameters (of a module, or the tensors given; compared by a checksum of
    each tensor: one all-reduce of the largest and one of the smallest); True for a world of one."""
    if not world.distributed:
        return True
    with torch.no_grad():
        sums = torch.stack([p.detach().double().sum() for p in _tensors(state, buffers=False)]).cpu()
    high, low = sums.clone(), sums.clone()
    with collective(world, "the comparison of the ranks' models"):
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return bool(torch.equal(high, low))


def check_models_agree(state: nn.Module | Iterable[torch.Tensor], world: World) -> None:
    """Raises ``RuntimeError`` when the ranks' parameters differ (:func:`models_agree`): the end-of-run check of a
    data-parallel run, whose ranks must have taken the same steps."""
    if not models_agree(state, world):
        raise RuntimeError("the ranks' models differ after training: a rank took another step (a bug: report it)")
