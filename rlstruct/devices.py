"""Device normalisation and comparison.

A device is normalised once, with :func:`as_device`, and compared with
:func:`same_device` (by type and index, never by object identity): ``"cpu"``,
``torch.device("cpu")`` and ``"cpu:0"`` are the same device, and so are
``"cuda"`` and ``"cuda:0"``.

Nothing in this module initialises CUDA: normalising ``"cuda"`` does not ask the
driver which device is current, it means ``cuda:0`` (the first visible device,
which is also what a worker pinned through ``CUDA_VISIBLE_DEVICES`` sees).
"""

from __future__ import annotations

from typing import Any, Union

import torch
from torch import nn
from torch.utils import _pytree as pytree

from rlstruct.errors import DeviceUnavailableError

__all__ = [
    "DeviceLike",
    "as_device",
    "same_device",
    "available_devices",
    "check_device_exists",
    "tree_copy",
    "cpu_state_dict",
]

DeviceLike = Union[str, int, torch.device]


def as_device(device: DeviceLike, *, argument: str = "device") -> torch.device:
    """Returns ``device`` as a ``torch.device`` whose index is explicit for CUDA.

    Args:
        device: a ``torch.device``, a string such as ``"cpu"`` or ``"cuda:1"``, or an
            int (a CUDA index).
        argument: the argument's name, for the error messages.

    Returns:
        The normalised device: ``cpu`` (no index) or ``<type>:<index>`` for indexed types.

    Raises:
        TypeError: when ``device`` is not one of the accepted types.
        DeviceUnavailableError: a string that names no device type torch knows (``"tpu"``, ``"cuda:x"``).

    >>> as_device("cuda")
    device(type='cuda', index=0)
    >>> as_device("cpu:0")
    device(type='cpu')
    """
    if isinstance(device, torch.device):
        d = device
    elif isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            d = torch.device(device) if isinstance(device, str) else torch.device("cuda", device)
        except (RuntimeError, ValueError) as e:
            raise DeviceUnavailableError(
                f"{argument}={device!r} is not a device torch knows ({str(e).splitlines()[0][:120]}); "
                "pass e.g. 'cpu', 'cuda' or 'cuda:1'"
            ) from None
    else:
        raise TypeError(
            f"{argument} must be a str, int or torch.device, got {type(device).__name__} {device!r}; "
            "pass e.g. 'cpu' or 'cuda:0'"
        )
    if d.type == "cpu":
        return _CPU
    if d.index is None and d.type in ("cuda", "xpu", "mps"):
        return torch.device(d.type, 0)
    return d


_CPU = torch.device("cpu")


def same_device(a: DeviceLike | None, b: DeviceLike | None) -> bool:
    """True when ``a`` and ``b`` name the same device (``None`` only equals ``None``).

    >>> same_device("cpu", torch.device("cpu"))
    True
    >>> same_device("cuda", "cuda:0")
    True
    """
    if a is None or b is None:
        return a is None and b is None
    return as_device(a) == as_device(b)


def available_devices() -> list[str]:
    """Names of the devices this process can use, e.g. ``['cpu', 'cuda:0', 'cuda:1']``.

    This asks the CUDA driver how many devices there are, so call it in the
    process that will use them, not in a parent before it spawns workers.
    """
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return names


def check_device_exists(device: DeviceLike, *, argument: str = "device") -> torch.device:
    """Normalises ``device`` and raises when this machine does not have it.

    Raises:
        DeviceUnavailableError: the message names the argument and the devices that exist.

    >>> check_device_exists("cpu")
    device(type='cpu')
    """
    d = as_device(device, argument=argument)
    if d.type == "cpu" or d.type == "meta":
        return d
    existing = available_devices()
    if str(d) not in existing:
        raise DeviceUnavailableError(
            f"{argument}={str(d)!r} does not exist on this machine; available devices: {', '.join(existing)}"
        )
    return d


def tree_copy(tree: Any, device: DeviceLike = "cpu") -> Any:
    """``tree`` (dicts, lists and tuples of values and tensors) with every tensor detached and copied to ``device``.

    Always a copy, also where a tensor is already on ``device`` (``.to`` would alias it): the copy keeps its values
    while the original goes on being updated in place (a learner's weights, an optimizer's state).

    >>> tree_copy({"state": {0: {"step": torch.tensor(3.0)}}, "betas": (0.9, 0.999)})
    {'state': {0: {'step': tensor(3.)}}, 'betas': (0.9, 0.999)}
    """
    device = as_device(device)
    return pytree.tree_map(lambda x: x.detach().to(device, copy=True) if isinstance(x, torch.Tensor) else x, tree)


def cpu_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s weights on the CPU: what ``RL_Batcher.update`` and ``RL_Agent.update`` take.

    >>> sorted(cpu_state_dict(torch.nn.Linear(2, 1)))
    ['bias', 'weight']
    """
    return tree_copy(model.state_dict(), "cpu")
