"""What a learner owns that a checkpoint keeps: :class:`LearnerState`, the declaration by name of its networks,
optimizers, tensors of state and counters, from which the harness writes a checkpoint's ``learner`` and restores it on
``--resume``, the same way for every family.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from rlstruct.algos._train.checkpoints import does_not_fit, load_state, restore_optimizer
from rlstruct.errors import ConfigError

__all__ = ["LearnerState", "Stateful"]

_FIX = "pass an undamaged checkpoint of the same settings, or start a new run without --resume"


@runtime_checkable
class Stateful(Protocol):
    """What has a state that a checkpoint keeps: torch's convention, ``state_dict()`` (plain types and tensors) and
    ``load_state_dict(state)`` (raising on a state that does not fit)."""

    def state_dict(self) -> Any:
        ...

    def load_state_dict(self, state: Any) -> Any:
        ...


class _Counter:
    """A plain number held in an attribute of a learner (a count of updates): saved as it is, set back."""

    def __init__(self, owner: object, name: str):
        self.owner, self.name = owner, name

    def state_dict(self) -> int | float:
        return getattr(self.owner, self.name)

    def load_state_dict(self, state: Any) -> None:
        kind = type(getattr(self.owner, self.name))
        if isinstance(state, bool) or not isinstance(state, (int, float)):
            raise TypeError(f"expected a number, got {type(state).__name__}")
        setattr(self.owner, self.name, kind(state))


def _is_optimizer(entry: object) -> bool:
    return isinstance(entry, torch.optim.Optimizer) or (
        isinstance(entry, Stateful) and isinstance(getattr(entry, "param_groups", None), list))


class LearnerState:
    """The state a learner owns, by name: what a checkpoint's ``learner`` holds and ``--resume`` restores. The harness
    writes and reads it from this declaration alone, so that no learner saves or restores by hand, and a state added by
    a learn step written outside the package (an adaptive coefficient) survives ``--resume`` as a built-in one does.

    An entry is one of:

    - a network (``nn.Module``): its ``state_dict``, loaded back with ``load_state_dict``;
    - an optimizer (``torch.optim.Optimizer``, or a fused one with ``param_groups``): its state, loaded back onto its
      parameters' device, every group keeping the learning rate it was built with (the new command's ``lr``, which a
      schedule then rescales);
    - a tensor (an adaptive coefficient, a log temperature): its value, copied back in place (keep the tensor and
      update it in place: ``kl_coef.mul_(1.5)``, not ``kl_coef = kl_coef * 1.5``);
    - anything else with ``state_dict()`` and ``load_state_dict(state)`` (:class:`Stateful`, e.g. a return
      normaliser);
    - a counter: a number held in an attribute of the learner (:meth:`counters`).

    The checkpoint's ``learner`` is ``{name: state}`` in the order declared. A name declared and missing from a
    resumed checkpoint is an error (another version of the learner wrote it); a name the checkpoint holds and nothing
    declares is left out.

    Args:
        entries: the entries by name.

    Raises:
        TypeError: an entry of none of those kinds.

    >>> coef = torch.tensor(1.0)
    >>> owned = LearnerState(kl_coef=coef)
    >>> saved = {name: state.clone() for name, state in owned.state_dict().items()}
    >>> _ = coef.mul_(4.0)
    >>> owned.load_state_dict(saved)
    >>> float(coef), list(saved)
    (1.0, ['kl_coef'])
    """

    def __init__(self, **entries: nn.Module | torch.optim.Optimizer | torch.Tensor | Stateful):
        self._entries: dict[str, Any] = {}
        self.add(**entries)

    def add(self, **entries: nn.Module | torch.optim.Optimizer | torch.Tensor | Stateful) -> None:
        """Declares more entries (see the class).

        Raises:
            ValueError: a name declared already.
            TypeError: an entry of no known kind.
        """
        for name, entry in entries.items():
            self._check_new(name)
            if not isinstance(entry, (nn.Module, torch.Tensor, Stateful)):
                raise TypeError(f"LearnerState entry {name!r} must be an nn.Module, an optimizer, a tensor or have "
                                f"state_dict() and load_state_dict(), got {type(entry).__name__}; declare a number "
                                "held in an attribute with counters(owner, name)")
            self._entries[name] = entry

    def counters(self, owner: object, *names: str) -> None:
        """Declares the numbers held in ``owner``'s attributes ``names`` (counts of updates), saved as they are and set
        back with their type.

        Raises:
            ValueError: a name declared already.
            TypeError: an attribute that does not hold an ``int`` or a ``float``.

        >>> class Learner:
        ...     n_updates = 7
        >>> learner = Learner()
        >>> owned = LearnerState()
        >>> owned.counters(learner, "n_updates")
        >>> saved = owned.state_dict(); learner.n_updates = 0
        >>> owned.load_state_dict(saved); learner.n_updates
        7
        """
        for name in names:
            self._check_new(name)
            value = getattr(owner, name, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"counters() takes attributes that hold an int or a float, got {name}={value!r} "
                                f"({type(value).__name__}); declare a tensor or a Stateful with add()")
            self._entries[name] = _Counter(owner, name)

    def _check_new(self, name: str) -> None:
        if name in self._entries:
            raise ValueError(f"LearnerState entry {name!r} is declared already; give each entry its own name")

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __repr__(self) -> str:
        return f"LearnerState({', '.join(f'{k}={type(v).__name__}' for k, v in self._entries.items())})"

    def state_dict(self) -> dict[str, Any]:
        """``{name: state}`` of every entry: a network's or an optimizer's ``state_dict``, a tensor detached, a
        counter's number. Tensors are the entries' own, as torch's ``state_dict`` gives them: the checkpoint copies
        them to the CPU as it writes."""
        return {name: entry.detach() if isinstance(entry, torch.Tensor) else entry.state_dict()
                for name, entry in self._entries.items()}

    def load_state_dict(self, state: Mapping[str, Any], *, path: str | os.PathLike = "the checkpoint") -> None:
        """Restores every entry from ``state`` (a :meth:`state_dict`, a resumed checkpoint's ``learner``); ``path``
        names the checkpoint in the errors.

        Raises:
            ConfigError: an entry missing from ``state``, or a state that does not fit its entry (missing or
                unexpected keys, other shapes: a checkpoint of other settings, or a damaged one).
        """
        for name, entry in self._entries.items():
            if name not in state:
                raise ConfigError(f"resume={str(path)!r}: the checkpoint's learner state has no {name!r}, which this "
                                  f"learner owns (it holds {sorted(state)}): a run of another version of the "
                                  "algorithm; resume it with that version, or start a new run without --resume")
            what = f"the learner's {name!r}"
            if isinstance(entry, nn.Module):
                load_state(entry, state[name], what, path)
                continue
            try:
                if isinstance(entry, torch.Tensor):
                    saved = torch.as_tensor(state[name])
                    if saved.shape != entry.shape:
                        raise ValueError(f"shape {tuple(saved.shape)} against {tuple(entry.shape)}")
                    with torch.no_grad():
                        entry.copy_(saved)
                elif _is_optimizer(entry):
                    rates = [group["lr"] for group in entry.param_groups]
                    restore_optimizer(entry, state[name], rates[0])
                    for group, lr in zip(entry.param_groups, rates):
                        group["lr"] = lr
                else:
                    entry.load_state_dict(state[name])
            except ConfigError:
                raise
            except (RuntimeError, KeyError, ValueError, TypeError) as e:
                raise does_not_fit(f"resume={str(path)!r}: {what} in the checkpoint does not fit this run's", e,
                                   _FIX) from e
