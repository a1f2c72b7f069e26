"""What a run announces as it goes, to the functions that subscribed: an :class:`Event`, and the payload of a run's
evaluation event (:class:`Evaluated`), to which its videos and a sweep's pruning subscribe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Evaluated", "Event"]

News = TypeVar("News")


class Event(Generic[News]):
    """One kind of news of a run and the functions that listen to it: :meth:`publish` calls each, in the order they
    subscribed, with the news. An exception a listener raises reaches the publisher (a sweep's pruned trial ends the
    run so) and the listeners after it are not called.

    Args:
        listeners: the first listeners, in order.

    >>> seen = []
    >>> event = Event([seen.append])
    >>> event.subscribe(lambda news: seen.append(news.upper()))
    >>> event.publish("evaluated")
    >>> seen
    ['evaluated', 'EVALUATED']
    """

    def __init__(self, listeners: Iterable[Callable[[News], None]] = ()):
        self._listeners = list(listeners)

    def subscribe(self, listener: Callable[[News], None]) -> None:
        """Calls ``listener`` with each news published from now on, after the listeners before it."""
        self._listeners.append(listener)

    def publish(self, news: News) -> None:
        """Calls every listener with ``news``."""
        for listener in self._listeners:
            listener(news)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evaluated:
    """An evaluation of the trained weights whose result came back during training: the news of a run's
    evaluation event (:attr:`~.log.Run.evaluated`). A target's confirmation, which evaluates weights already
    announced again, and the evaluations run after training stopped are not announced.

    Attributes:
        row: the evaluation's statistics, as ``progress.csv``'s row of it holds them beside the counters:
            ``eval/return``, ``eval/launch_env_steps`` (the env steps at which its weights were taken), and the rest.
        env_steps: the run's env steps when the result came back.
        weights: gives the CPU state dict of the weights the loop holds then (a video of the policy records them).
    """

    row: Mapping[str, float]
    env_steps: int
    weights: Callable[[], Mapping[str, Any]]
