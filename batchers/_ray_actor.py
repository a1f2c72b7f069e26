"""The Ray side of RayBatcher: the actor that hosts one RL_Batcher, and the teardown of the actors."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from rlstruct._determinism import apply_from_environment
from rlstruct.batchers._lifecycle import close_all_at_exit
from rlstruct.batchers._restart import restart_seeds
from rlstruct.batchers._wire import from_wire, trajectories_to_wire
from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.errors import BatcherWorkerError, MissingDependencyError
from rlstruct.structures import DictTensor

__all__ = ["BatcherActor", "StaleActorError", "close_actors", "import_ray", "release_actors"]

log = logging.getLogger(__name__)

_CUDA_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


class StaleActorError(RuntimeError):
    """Raised in an actor asked to collect with weights or a reset it has not applied (it restarted since)."""


class BatcherActor:
    """The Ray actor: one local RL_Batcher, its weights version and its reset epoch.

    Every acquisition carries the weights version and the reset epoch the driver expects; an actor holding anything
    else (Ray restarted it since) raises :class:`StaleActorError` instead of acting on stale weights or a lost env
    state, and the driver restores it (:meth:`restore`).
    """

    def __init__(self, actor_id: int, environ: dict[str, str], num_threads: int | None, batcher_kwargs: dict):
        # Before anything touches CUDA: Ray may have set CUDA_VISIBLE_DEVICES for its own GPU choice, and an
        # explicit placement (a MIG slice, or none for a CPU actor) overrides it.
        os.environ.update(environ)
        apply_from_environment()  # a deterministic run's actor (its runtime_env says so), before its first kernel
        self._environ_keys = (*_CUDA_KEYS, *(k for k in environ if k not in _CUDA_KEYS))
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.actor_id = actor_id
        self.version = 0
        self.epoch = 0
        self._kwargs = batcher_kwargs
        self.batcher = RL_Batcher(**batcher_kwargs)
        self.n_running = 0

    def info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        report = {
            "actor_id": self.actor_id,
            "pid": os.getpid(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ctx.get_node_id(),
            "accelerator_ids": ctx.get_accelerator_ids(),
            "environ": {k: os.environ.get(k) for k in self._environ_keys},
            "cuda_initialized": torch.cuda.is_initialized(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "workers": self.batcher.worker_reports(),
        }
        return {"n_envs": self.batcher.n_elems(), "specs": self.batcher._specs, "report": report}

    def _apply(self, version: int, weights: Any) -> None:
        if weights is not None:  # a new version rides on this call, as a reference resolved by Ray
            try:
                self.batcher.update(from_wire(weights))
            except Exception as e:
                raise BatcherWorkerError(
                    f"applying the weights of update() (version {version}) failed: {e}", worker_id=self.actor_id
                ) from e
            self.version = version

    def reset(self, version: int, weights: Any, epoch: int, agent_info: DictTensor | None,
              env_info: DictTensor | None) -> None:
        self._apply(version, weights)
        self.batcher.reset(agent_info, env_info)
        self.epoch = epoch
        self.n_running = self.batcher.n_elems()

    def restore(self, restart: int, version: int, weights: Any, epoch: int, agent_info: DictTensor | None,
                env_info: DictTensor | None) -> None:
        """After Ray restarted this actor (its constructor ran again with its first seeds): rebuilds its
        RL_Batcher with the seeds of its ``restart``-th restart (:func:`~rlstruct.batchers.restart_seed`), then resets
        it."""
        kw = self._kwargs
        self.batcher.close()
        self.batcher = RL_Batcher(**{**kw, "seeds": restart_seeds(kw["seeds"], restart),
                                     "agent_seeds": restart_seeds(kw["agent_seeds"], restart)})
        self.reset(version, weights, epoch, agent_info, env_info)

    def acquire(self, version: int, weights: Any, epoch: int, agent_info: DictTensor | None) -> dict[str, Any] | None:
        self._apply(version, weights)
        if (self.version, self.epoch) != (version, epoch):
            raise StaleActorError(
                f"actor {self.actor_id} holds weights version {self.version} and reset epoch {self.epoch}, the "
                f"acquisition expects version {version} and epoch {epoch} (the actor restarted since)"
            )
        if self.n_running == 0:  # every env of this actor finished: it yields no rows until the next reset
            return None
        self.batcher.execute(agent_info)
        traj, self.n_running = self.batcher.get()
        return {"wire": trajectories_to_wire(traj), "n_running": self.n_running, "timings": self.batcher.timings()}

    def close(self) -> None:
        """Closes the batcher, then does what this process's exit would for its worker processes' helpers, as
        :func:`close_actors` kills it next and a killed process runs no exit hook: multiprocessing's finalizers
        (the fork server's socket folder in the node's temp folder), its fork server and resource tracker ended."""
        self.batcher.close()
        close_all_at_exit()


def import_ray() -> Any:
    """``import ray``, or MissingDependencyError saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise MissingDependencyError(
            "RayBatcher needs Ray, which is not installed; install it with `pip install 'rlstruct[ray]'` "
            "(or `pip install 'ray>=2.30'`), or use RL_Batcher"
        ) from e
    return ray


def close_actors(ray: Any, actors: list, pg: Any, busy: bool) -> None:
    """Closes every actor's RL_Batcher (waiting less for ``busy`` ones), kills them and removes ``pg``."""
    live = list(actors)
    actors.clear()  # the batcher's own list, also the finalizer's: nothing is closed twice
    try:
        connected = ray is not None and ray.is_initialized()
    except Exception:  # the interpreter is shutting down
        connected = False
    if not connected:
        # Without a connection there is nothing to kill: Ray ends a job's actors when its driver disconnects.
        return
    if live:
        # An actor busy in an acquisition (or hung) cannot run close() soon: do not wait long for it.
        grace = 1.0 if busy else 5.0
        try:
            ray.wait([a.close.remote() for a in live], num_returns=len(live), timeout=grace)
        except Exception as e:  # dead actors: they are killed below all the same
            log.debug("errors while closing actors: %s", e)
        for a in live:
            try:
                ray.kill(a, no_restart=True)
            except Exception as e:
                log.warning("could not kill actor %s: %s", a, e)
    if pg is not None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(pg)
        except Exception as e:
            log.warning("could not remove the placement group: %s", e)


def release_actors(ray: Any, held: dict[str, Any]) -> None:
    """Closes the actors of a RayBatcher its program did not close (see ``_lifecycle``)."""
    close_actors(ray, held["actors"], held["pg"], held["busy"])
    held["pg"] = None
