"""What a worker carries from one acquisition to the next, kept at every boundary in memory its batcher owns, so that
the replacement of a failed worker restores it and collects the failed acquisition again, the same steps bit for bit.

The carried state: the env's (``get_state``), the observation the next step starts from, the running set, the agent
state, the agent's :meth:`~rlstruct.agents.RL_Agent.noise_state` and, in a worker process, torch's global CPU
generator. It is kept in two slots written in turn, each stamped last with the boundary it holds, so that a worker
killed while writing one leaves the other whole.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rlstruct.batchers._buffer import Specs, foreach_copy, share, specs_of
from rlstruct.structures import DictTensor

__all__ = ["Carried", "Carry", "allocate_carry", "carry_layout", "holds"]

class Carried(Protocol):
    """What a worker's acquisition loop (``rlstruct.batchers._acquire.Acquirer``) shows of the state it carries."""

    env: Any
    agent: Any
    specs: Specs
    device: torch.device
    ids: torch.Tensor
    ids_cpu: torch.Tensor
    observation: DictTensor
    state: DictTensor | None
    n_acquired: int


# header: [the boundary the slot holds (-1: none), whether an agent state is carried, acquisitions run]
_HEADER = "header"


def carry_layout(acq: Carried, *, rng: bool = True) -> Specs | None:
    """The per-row layout of what ``acq`` carries (``env/*``, ``observation/*``, ``agent_state/*``, ``running``) and
    of its whole-worker parts (``rng``, torch's global generator, unless ``rng`` is false; ``noise``: their full
    shapes), or ``None`` when it cannot be kept: the env has no ``get_state`` returning a DictTensor (a gymnasium
    adapter, a JAX env). Call it after the probe."""
    get_state = getattr(acq.env, "get_state", None)
    if not callable(get_state) or not callable(getattr(acq.env, "set_state", None)):
        return None
    state = get_state()
    if not isinstance(state, DictTensor):
        return None
    layout = specs_of(state, "env/")
    layout.update({k: v for k, v in acq.specs.items() if k.startswith(("observation/", "agent_state/"))})
    layout["running"] = ((), torch.bool)
    if rng:
        state = torch.get_rng_state()
        layout["rng"] = (tuple(state.shape), state.dtype)
    noise = acq.agent.noise_state()
    if noise is not None:
        layout["noise"] = (tuple(noise.shape), noise.dtype)
    return layout


def allocate_carry(layout: Specs, n_envs: int, shared: bool) -> list[dict[str, torch.Tensor]]:
    """Two zeroed CPU slots of ``layout`` for ``n_envs`` envs (in shared memory when ``shared``), holding no boundary.

    >>> slots = allocate_carry({"running": ((), torch.bool), "rng": ((8,), torch.uint8)}, 3, shared=False)
    >>> len(slots), slots[0]["running"].shape, slots[0]["rng"].shape, holds(slots, 0)
    (2, torch.Size([3]), torch.Size([8]), False)
    """
    slots = []
    for _ in range(2):
        slot = {k: torch.zeros(shape if k in ("rng", "noise") else (n_envs, *shape), dtype=dtype)
                for k, (shape, dtype) in layout.items()}
        slot[_HEADER] = torch.tensor([-1, 0, 0], dtype=torch.int64)
        if shared:
            share(slot.values(), "the workers' carried state")
        slots.append(slot)
    return slots


def holds(slots: list[dict[str, torch.Tensor]], boundary: int) -> bool:
    """Whether ``slots`` hold the state of ``boundary`` whole (read by the batcher once the worker is dead)."""
    return int(slots[boundary % 2][_HEADER][0]) == boundary


class Carry:
    """A worker's side of its carried state: writes it into ``slots`` at a boundary, restores it from them."""

    def __init__(self, slots: list[dict[str, torch.Tensor]]):
        self.slots = slots

    def write(self, acq: Carried, boundary: int) -> None:
        """Keeps ``acq``'s state as of the end of the call numbered ``boundary`` (a reset or an acquisition)."""
        slot = self.slots[boundary % 2]
        header = slot[_HEADER]
        header[0] = -1  # the slot holds nothing whole until the stamp below
        env_state = acq.env.get_state()
        ids = acq.ids
        n = int(ids.shape[0])
        dst, src = [], []
        for k, v in env_state.items():
            dst.append(slot["env/" + k])
            src.append(v)
        for k, v in acq.observation.items():
            dst.append(slot["observation/" + k][:n])
            src.append(v)
        if acq.state is not None:
            for k, v in acq.state.items():
                dst.append(slot["agent_state/" + k][:n])
                src.append(v)
        noise = acq.agent.noise_state()
        if noise is not None:
            dst.append(slot["noise"])
            src.append(noise)
        if "rng" in slot:
            dst.append(slot["rng"])
            src.append(torch.get_rng_state())
        foreach_copy(dst, [s.cpu() for s in src])
        slot["running"].zero_().index_fill_(0, ids.cpu(), True)
        header[1] = acq.state is not None
        header[2] = acq.n_acquired
        header[0] = boundary

    def restore(self, acq: Carried, boundary: int) -> None:
        """Puts ``acq`` back in the state kept at ``boundary`` (its ``agent_info`` and ``env_info`` set already)."""
        slot = self.slots[boundary % 2]
        device = acq.device
        acq.env.set_state(_rows(slot, "env/", None, torch.device("cpu")))
        ids_cpu = torch.nonzero(slot["running"]).squeeze(1)
        n = int(ids_cpu.shape[0])
        acq.ids, acq.ids_cpu = ids_cpu.to(device), ids_cpu
        acq.observation = _rows(slot, "observation/", n, device)
        acq.state = _rows(slot, "agent_state/", n, device) if bool(slot[_HEADER][1]) else None
        acq.n_acquired = int(slot[_HEADER][2])
        if "rng" in slot:
            torch.set_rng_state(slot["rng"].clone())
        if "noise" in slot:
            acq.agent.set_noise_state(slot["noise"].clone())


def _rows(slot: dict[str, torch.Tensor], prefix: str, n: int | None, device: torch.device) -> DictTensor:
    """Copies of the first ``n`` rows (``None``: all) of ``slot``'s keys under ``prefix``, on ``device``."""
    return DictTensor({k[len(prefix):]: v[:n].to(device, copy=True) for k, v in slot.items() if k.startswith(prefix)})
