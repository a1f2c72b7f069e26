"""CUDA-graph capture of the step loop: ``n_timesteps`` steps of agent, env and buffer writes as one replay, and the
static tensors the replay reads and writes (:class:`StepGraph`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlstruct._accel import Accelerator, accelerator_for
from rlstruct.agents import RL_Agent
from rlstruct.batchers._buffer import foreach_copy
from rlstruct.errors import GraphCaptureError
from rlstruct.structures import DictTensor

__all__ = ["StepGraph", "load_env_state", "load_into"]

# The captured loop: (agent state, agent_info) -> the agent state after the last step.
Loop = Callable[[DictTensor, DictTensor], DictTensor]


class StepGraph:
    """The CUDA graph of one acquirer's full-row step loop, and the static tensors it reads.

    A replay reads and writes the very tensors the capture saw (the *statics*): the agent state, a pinned host copy
    of ``agent_info``, and the env's state as the env hands it out through the :class:`~rlstruct.envs.VecEnv`
    contract (``graph_state()``, ``set_graph_state(state)``); the buffer and its observation views are static
    already. Before each replay the current values are copied into the statics wherever they are other tensors
    (after a ``reset``, or an env or agent that rebinds); the captured loop ends by copying its last state back into
    them, so consecutive replays chain.

    Its streams, graph and synchronisation come from the accelerator of ``device``'s type
    (:func:`rlstruct._accel.accelerator_for`, resolved here once): CUDA's, or a test's recording fake.

    Args:
        env: the VecEnv; its ``graph_state()`` must not be ``None``.
        agent: the agent (its own CUDA generators are registered with the graph).
        device: the CUDA device the loop runs on.

    Raises:
        ValueError: ``device`` has no accelerator (it is not a CUDA device).
        GraphCaptureError: the env cannot be captured (``graph_state()`` is ``None`` or missing).
    """

    def __init__(self, env: Any, agent: RL_Agent, device: torch.device):
        accel = accelerator_for(device)
        if accel is None:
            raise ValueError(
                f"cuda_graph=True needs a CUDA device, this worker runs on {device}; "
                "place it on a GPU or pass cuda_graph=False"
            )
        graph_state = getattr(env, "graph_state", None)
        if not callable(graph_state) or graph_state() is None:
            raise GraphCaptureError(
                f"cuda_graph=True needs an env whose step can be captured, but {env!r} has no graph_state() "
                "(it syncs with the host, changes shapes, or keeps state off the GPU); use an auto-reset torch "
                "simulator on the GPU (e.g. make_env('CartPole-v1', n, device='cuda', autoreset=True)) or pass "
                "cuda_graph=False"
            )
        self.env, self.agent, self.device = env, agent, device
        self._accel: Accelerator = accel
        self.warm = False
        self._graph: Any = None
        self._env_state: dict[str, torch.Tensor] | None = None
        self._agent_state: DictTensor | None = None
        self._agent_info: DictTensor | None = None
        self._agent_info_source: DictTensor | None = None

    def warm_up(self, run: Callable[[], Any]) -> Any:
        """``run()`` eagerly on a side stream, as capture wants its warm-up (lazy initialisations happen there)."""
        accel = self._accel
        main = accel.current_stream(self.device)
        side = accel.new_stream(self.device)
        side.wait_stream(main)
        with accel.use_stream(side):
            out = run()
        main.wait_stream(side)
        self.warm = True
        return out

    def replay(self, loop: Loop, state: DictTensor, agent_info: DictTensor) -> DictTensor:
        """Loads ``state``, ``agent_info`` and the env's state into the statics, captures ``loop`` the first
        time, and replays it; returns the static agent state, which holds the state after the last step."""
        if self._agent_state is None:
            self._agent_state = DictTensor._trusted({k: v.clone() for k, v in state.items()})
            pinned = {k: self._accel.pin(v) for k, v in agent_info.items()}
            self._agent_info = DictTensor._trusted(pinned) if pinned else agent_info
            self._agent_info_source = agent_info
            self._env_state = {k: v.clone() for k, v in self.env.graph_state().items()}
        assert self._agent_info is not None and self._env_state is not None
        if agent_info is not self._agent_info_source:  # new agent_info, from reset or execute
            # The graph reads these pinned tensors: no replay may still be reading them while they change.
            self._accel.synchronize(self.device)
            load_into(self._agent_info, agent_info, "agent_info")
            self._agent_info_source = agent_info
        load_into(self._agent_state, state, "the agent state")
        load_env_state(self.env, self._env_state)
        if self._graph is None:
            self._graph = self._capture(loop)
        self._graph.replay()
        return self._agent_state

    def _capture(self, loop: Loop) -> Any:
        """Captures ``loop`` into one CUDA graph, ending with the copies that close it: the last agent state and env
        state back into the statics the first step reads."""
        graph = self._accel.new_graph()
        for name, gen in _cuda_generators(self.agent):
            # A replay draws from the generator's state at replay time, as the eager loop would.
            register = getattr(graph, "register_generator_state", None)
            if register is None:
                raise GraphCaptureError(
                    f"the agent draws from its own CUDA generator (attribute {name!r}), which this torch "
                    f"({torch.__version__}) cannot replay in a CUDA graph; draw from the default generator "
                    "(seeded by agent_seeds) or pass cuda_graph=False"
                )
            register(gen)
        statics, info, env_state = self._agent_state, self._agent_info, self._env_state
        assert statics is not None and info is not None and env_state is not None

        def captured() -> None:
            load_into(statics, loop(statics, info), "the agent state")
            _copy_env_state(self.env, env_state)

        # cuBLAS keeps one workspace per stream (made at the stream's first matrix product) and a graph that captures
        # a product bakes in the one kept then: every capture here runs on torch's one capture stream, so without
        # this the graph would write, at every replay, a workspace made in an earlier graph's memory pool (shared
        # with that graph; freed memory once it is released and the cache cleared, as the compiled update's graph
        # trees clear it). Cleared before, the capture makes its own in its pool; cleared after, no other bakes it in.
        self._accel.clear_blas_workspaces()
        try:
            self._accel.capture(graph, captured)
        except GraphCaptureError:
            raise
        except Exception as e:
            first = e  # the error that broke the capture, not the ones raised while ending it
            while first.__context__ is not None:
                first = first.__context__
            reason = str(first).strip().splitlines()[0] if str(first).strip() else ""
            raise GraphCaptureError(
                f"capturing the step loop in a CUDA graph failed ({type(first).__name__}: {reason}); with "
                "cuda_graph=True the agent and env must not synchronize with the host (no .item(), .cpu(), nonzero, "
                "printing tensors, blocking host copies: copy agent_info with .to(device, non_blocking=True)) and "
                "must keep their shapes; fix the step or pass cuda_graph=False"
            ) from e
        finally:
            self._accel.clear_blas_workspaces()
            self.env.set_graph_state(self._env_state)  # also when the capture failed half-way
        return graph

    def close(self) -> None:
        """Releases the graph and its memory pool now (not whenever the garbage collector gets to it)."""
        graph, self._graph = self._graph, None
        if graph is not None:
            graph.reset()


def _cuda_generators(agent: RL_Agent) -> list[tuple[str, torch.Generator]]:
    """``(attribute name, generator)`` for each CUDA ``torch.Generator`` held by ``agent`` or by an agent it wraps
    (e.g. :class:`~rlstruct.agents.RL_Agent_CheckDevice`): what a captured step may draw from."""
    found: dict[int, tuple[str, torch.Generator]] = {}
    seen: set[int] = set()
    todo: list[Any] = [agent]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for name, v in getattr(obj, "__dict__", {}).items():
            if isinstance(v, torch.Generator) and v.device.type == "cuda":
                found.setdefault(id(v), (name, v))
            elif isinstance(v, RL_Agent):
                todo.append(v)
    return list(found.values())


def _check_same_keys(static_keys: list[str], keys: list[str], what: str) -> None:
    if keys != static_keys:
        raise GraphCaptureError(
            f"with cuda_graph=True {what} must keep its keys at every step: {static_keys} at the start of "
            f"the loop, {keys} at its end; return the same keys (or pass cuda_graph=False)"
        )


def _check_same_layout(static: torch.Tensor, x: torch.Tensor, what: str) -> None:
    if x.shape != static.shape or x.dtype != static.dtype or x.device != static.device:
        raise GraphCaptureError(
            f"with cuda_graph=True {what} must keep its shape, dtype and device: {static.dtype} "
            f"{list(static.shape)} on {static.device} when captured, now {x.dtype} {list(x.shape)} on {x.device}; "
            "keep them fixed (or pass cuda_graph=False)"
        )


def _copy_into(statics: dict[str, torch.Tensor], values: dict[str, torch.Tensor], what: str) -> None:
    """``statics[k].copy_(values[k])`` for every key whose value is another tensor, each checked to keep its keys
    and layout (``what`` names them in the error)."""
    _check_same_keys(list(statics), list(values), what)
    pairs = [(statics[k], values[k], k) for k in statics if values[k] is not statics[k]]
    for s, v, k in pairs:
        _check_same_layout(s, v, f"{what} key {k!r}")
    foreach_copy([s for s, _, _ in pairs], [v for _, v, _ in pairs])


def load_into(static: DictTensor, d: DictTensor, what: str) -> None:
    """Copies ``d`` into the tensors of ``static`` (same keys and layouts), unless it is ``static`` itself.

    Raises:
        GraphCaptureError: ``d`` has other keys, or a tensor of another shape, dtype or device.

    >>> static = DictTensor({"h": torch.zeros(2)})
    >>> h = static["h"]
    >>> load_into(static, DictTensor({"h": torch.ones(2)}), "the agent state")
    >>> static["h"] is h, h.tolist()
    (True, [1.0, 1.0])
    """
    if d is static:
        return
    _copy_into(dict(static.items()), dict(d.items()), what)


def _copy_env_state(env: Any, statics: dict[str, torch.Tensor]) -> None:
    _copy_into(statics, env.graph_state(), "the env state (graph_state())")


def load_env_state(env: Any, statics: dict[str, torch.Tensor]) -> None:
    """Copies the env's current state (``env.graph_state()``) into ``statics`` and makes those the env's state
    (``env.set_graph_state``), so that the next step, or replay, reads them.

    Raises:
        GraphCaptureError: the env's state changed keys, or a tensor its shape, dtype or device.
    """
    _copy_env_state(env, statics)
    env.set_graph_state(statics)
