"""The step loop shared by every batcher mode: one agent, one VecEnv, one block of buffer rows.

The same :class:`Acquirer` runs inside a worker process or in the calling
process. It writes into a preallocated block of the trajectory buffer, whose
row ``i`` belongs to env ``i`` of its VecEnv. Per-step work is over whole
batches: no Python loop over envs, no ``.item()``, and no host–device sync
unless envs finished during the step (episodic envs), which the env itself
already paid for when it shrank its running set. An auto-reset env that writes
in place (``VecEnv.writes_in_place``) fills the buffer itself through
``step_into``: the agent then reads its observations from the buffer, and only
the actions are copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from rlstruct.devices import as_device
from rlstruct.errors import BatchSizeError, DeviceMismatchError, GraphCaptureError
from rlstruct.structures import DictTensor, TemporalDictTensor

from rlstruct.agents import RL_Agent

__all__ = [
    "Acquirer", "Specs", "PHASES", "allocate_block", "rows_of", "copy_batch_major", "TEMPORAL_PREFIXES", "INFO_PREFIXES"
]

# name -> (per-row shape, dtype)
Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

TEMPORAL_PREFIXES = ("observation/", "action/", "_observation/")
INFO_PREFIXES = ("agent_info/", "env_info/", "agent_state/")
PHASES = ("agent_forward", "env_step", "buffer_write", "copy")


def _specs_of(d: DictTensor, prefix: str) -> Specs:
    return {prefix + k: (tuple(v.shape[1:]), v.dtype) for k, v in d.items()}


def allocate_block(specs: Specs, n_rows: int, n_timesteps: int, device: torch.device, shared: bool) -> dict[str, torch.Tensor]:
    """Zero buffers for one worker: ``[n_timesteps, n_rows, ...]`` per temporal key, ``[n_rows, ...]`` per info
    key, and ``lengths: int64 [n_rows]``; in shared memory when ``shared`` (CPU).

    Temporal buffers are time-major so that the write of one step is one contiguous block (batch-major
    storage would scatter every step over ``n_rows`` cache lines per key); ``get`` transposes once.
    """
    block: dict[str, torch.Tensor] = {}
    for name, (shape, dtype) in specs.items():
        lead = (n_timesteps, n_rows) if name.startswith(TEMPORAL_PREFIXES) else (n_rows,)
        block[name] = torch.zeros(lead + tuple(shape), dtype=dtype, device=device)
    block["lengths"] = torch.zeros(n_rows, dtype=torch.int64, device=device)
    if shared:
        for v in block.values():
            v.share_memory_()
    return block


def rows_of(block: dict[str, torch.Tensor], start: int, n: int) -> dict[str, torch.Tensor]:
    """Rows ``start:start + n`` of every buffer of ``block`` (views: dim 1 of temporal keys, dim 0 of the others)."""
    return {k: v[:, start : start + n] if k.startswith(TEMPORAL_PREFIXES) else v[start : start + n] for k, v in block.items()}


# Word types to move whole rows with, widest first (copies only: no arithmetic touches the bits).
_WORDS = ((16, torch.complex128), (8, torch.int64), (4, torch.int32), (2, torch.int16))


def _rows_as_words(x: torch.Tensor, lead: int) -> torch.Tensor | None:
    """``x`` viewed as ``[*x.shape[:lead], W]`` of the widest word type that tiles a row's bytes, squeezed to
    ``x.shape[:lead]`` when one word holds a row; ``None`` when that would not move fewer, wider elements.
    The dims from ``lead`` on must be contiguous."""
    k = x.shape[lead:].numel()
    row = k * x.element_size()
    for size, word in _WORDS:
        if row % size == 0:
            if size <= x.element_size() or k == 0:
                return None
            words = x.reshape(x.shape[:lead] + (k,)).view(torch.uint8).view(word)
            return words.squeeze(-1) if row == size else words
    return None


def copy_batch_major(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[b, t] = src[t, b]``: a time-major ``[T, B, ...]`` buffer into a contiguous ``[B, T, ...]`` tensor.

    A step's row of several small elements (``src[t, b]``, e.g. a frame of four float32) moves as one or a few
    machine words: the transposition of ``[T, B]`` words is 2x faster than an element-wise copy of ``[T, B, 4]``
    (and the same bits: nothing is computed). Rows of one element are copied as they are.
    """
    if src.dim() > 2 and src.is_contiguous() and dst.is_contiguous() and src.dtype == dst.dtype:
        src_words, dst_words = _rows_as_words(src, 2), _rows_as_words(dst, 2)
        if src_words is not None and dst_words is not None:
            src, dst = src_words, dst_words
    dst.copy_(src.transpose(0, 1))


def _foreach_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``d.copy_(s)`` for every pair, in one call where torch has ``_foreach_copy_``."""
    if not dst:
        return
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def _add_lengths(lengths: torch.Tensor, rows: slice | torch.Tensor, n: int) -> None:
    """``lengths[rows] += n``: ``rows`` is ``slice(None)`` or an index tensor."""
    if isinstance(rows, slice):
        lengths.add_(n)
    else:
        lengths.index_add_(0, rows, torch.full_like(rows, n))


def _rows_to_cpu(d: DictTensor, n: int, what: str) -> DictTensor:
    if d.empty():
        return d
    dev = d.device()
    if dev is not None and dev.type != "cpu":
        raise DeviceMismatchError(f"{what} must be on the CPU, got {dev}; build it on the CPU")
    if d.n_elems() != n:
        raise BatchSizeError(f"{what} must have {n} rows (one per env) or be empty, got {d.n_elems()}")
    return d


class Acquirer:
    """Collects ``n_timesteps`` steps of ``agent`` on ``env`` into a buffer block.

    Args:
        env: the VecEnv (its observations on ``device``).
        agent: the agent (its state and outputs on ``device``).
        n_timesteps: steps per acquisition.
        device: where env observations, agent state and the buffer block live.
        agent_seed: passed to ``agent.seed`` after the probe call, when given.
        sync_timings: synchronize the device at phase boundaries so that timings are exact on a GPU
            (costs one sync per phase; off by default).
        cuda_graph: replay the whole step loop (agent, env step and buffer writes, ``n_timesteps`` steps) as
            one CUDA graph: the first acquisition runs eagerly (lazy initialisations happen there), the second
            captures the loop, every later one is one ``replay``. Needs a CUDA ``device`` and an env whose
            :meth:`~rlstruct.envs.VecEnv.graph_state` names its state (the auto-reset torch simulators). Only
            device work is replayed: what the agent computes on the host is frozen at capture, its weights must
            be updated in place (``load_state_dict`` does), and ``agent_info`` reaches it as pinned host
            tensors updated in place (copy them to the device with ``non_blocking=True``).

    Raises:
        ValueError: ``cuda_graph`` on a device other than CUDA.
        GraphCaptureError: ``cuda_graph`` with an env that cannot be captured.
    """

    def __init__(
        self,
        env,
        agent: RL_Agent,
        n_timesteps: int,
        device: torch.device,
        *,
        agent_seed: int | None = None,
        sync_timings: bool = False,
        cuda_graph: bool = False,
    ):
        self.env = env
        self.agent_seed = agent_seed
        self.agent = agent
        self.n_timesteps = n_timesteps
        self.device = as_device(device)
        self.n_envs = env.n_envs()
        self.block: dict[str, torch.Tensor] | None = None
        self.specs: Specs | None = None
        self.timings = {p: 0.0 for p in PHASES}
        self.timings["graph_replay"] = 0.0  # cuda_graph: the agent, env and buffer-write phases of replayed steps
        self.timings["steps"] = 0.0
        self.timings["env_steps"] = 0.0
        self._sync = sync_timings and self.device.type == "cuda"
        self._started = False
        self._needs_history = bool(agent.require_history())
        self.cuda_graph = bool(cuda_graph)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_warm = False
        self._graph_env: list[torch.Tensor] | None = None  # the env state tensors the graph reads (made once)
        if self.cuda_graph:
            if self.device.type != "cuda":
                raise ValueError(
                    f"cuda_graph=True needs a CUDA device, this worker runs on {self.device}; "
                    "place it on a GPU or pass cuda_graph=False"
                )
            graph_state = getattr(env, "graph_state", None)
            attrs = graph_state() if callable(graph_state) else None
            if attrs is None:
                raise GraphCaptureError(
                    f"cuda_graph=True needs an env whose step can be captured, but {env!r} has no graph_state() "
                    "(it syncs with the host, changes shapes, or keeps state off the GPU); use an auto-reset torch "
                    "simulator on the GPU (e.g. make_env('CartPole-v1', n, device='cuda', autoreset=True)) or pass "
                    "cuda_graph=False"
                )
            self._graph_attrs = tuple(attrs)

    # ----------------------------------------------------------------- setup
    def probe(self, agent_info: DictTensor, env_info: DictTensor) -> Specs:
        """Resets the env and calls the agent once to learn every buffer key's shape and dtype.

        The global torch RNG is restored afterwards, so the probe does not change what follows.
        """
        agent_info = _rows_to_cpu(agent_info, self.n_envs, "agent_info")
        env_info = _rows_to_cpu(env_info, self.n_envs, "env_info")
        devices = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            obs, ids = self.env.reset(env_info)
            self._check_obs_device(obs, "reset")
            state = self.agent.initial_state(agent_info, self.n_envs)
            history = self._history_at(0, slice(None), obs) if self._needs_history else None
            action, new_state = self.agent(state, obs, agent_info, history)
        if "action" not in action:
            raise KeyError(f"the agent output must hold the key 'action', got keys {list(action.keys())}")
        specs: Specs = {}
        specs.update(_specs_of(obs, "observation/"))
        specs.update(_specs_of(action, "action/"))
        specs.update(_specs_of(obs, "_observation/"))
        specs.update(_specs_of(agent_info, "agent_info/"))
        specs.update(_specs_of(env_info, "env_info/"))
        specs.update(_specs_of(new_state, "agent_state/"))
        self.specs = specs
        # Seeded after the probe call, so that the agent's own generator starts fresh for the first acquisition.
        if self.agent_seed is not None:
            self.agent.seed(self.agent_seed)
        return specs

    def _history_at(self, t: int, rows, obs: DictTensor) -> TemporalDictTensor:
        if self.block is None:  # probe: an empty history of the right batch size
            v = {"observation/" + k: x.unsqueeze(1)[:, :0] for k, x in obs.items()}
            return TemporalDictTensor(v, torch.zeros(obs.n_elems(), dtype=torch.int64, device=self.device))
        v = {k: self.block[k][:t, rows].transpose(0, 1) for k in self._temporal_keys}
        n = obs.n_elems()
        return TemporalDictTensor._trusted(v, torch.full((n,), t, dtype=torch.int64, device=self.device))

    def bind(self, blocks: list[dict[str, torch.Tensor]]) -> None:
        """Attaches the buffer blocks this acquirer writes into: one per slot (two when the batcher hands its
        buffers out as views, so that an acquisition never writes into the one being read); ``acquire`` says
        which.

        The per-step destinations are made here once per slot: ``views[t]`` lists, for every key the step writes
        (observation, action, next observation), the view ``buffer[t]``, so that a step's writes are one
        ``_foreach_copy_`` call (one dispatch, and fused kernels on a GPU) instead of one indexed assignment per
        key.
        """
        block = blocks[0]
        self._temporal_keys = [k for k in block if k.startswith(TEMPORAL_PREFIXES)]
        self._write_keys = [
            (prefix, k[len(prefix):]) for prefix in TEMPORAL_PREFIXES for k in block if k.startswith(prefix)
        ]
        self._slots = [(b, self._step_views_of(b)) for b in blocks]
        self.block, self._step_views = self._slots[0]
        # An env that writes its observations in place (writes_in_place) fills the buffer itself: per slot, the
        # destinations of every step, and a scratch for the running observation after the last one.
        self._slot = 0
        writes_in_place = getattr(self.env, "writes_in_place", None)  # envs that only duck-type VecEnv lack it
        self._in_place = callable(writes_in_place) and bool(writes_in_place()) and not self.cuda_graph
        if self._in_place:
            self._obs_keys = [k for p, k in self._write_keys if p == "observation/"]
            self._action_keys = [k for p, k in self._write_keys if p == "action/"]
            scratch = DictTensor._trusted({k: torch.empty_like(block["observation/" + k][0]) for k in self._obs_keys})
            self._in_place_views = [self._in_place_views_of(b, scratch) for b in blocks]

    def _in_place_views_of(self, block: dict[str, torch.Tensor], scratch: DictTensor) -> tuple[list, list, list]:
        """``(next[t], running[t], actions[t])``: ``_observation/*[t]`` and ``observation/*[t]`` as DictTensors
        (``running[T]`` is ``scratch``), and the list of ``action/*[t]``."""
        per_key = {k: block["observation/" + k].unbind(0) for k in self._obs_keys}
        running = [DictTensor._trusted({k: v[t] for k, v in per_key.items()}) for t in range(self.n_timesteps)]
        per_key = {k: block["_observation/" + k].unbind(0) for k in self._obs_keys}
        nxt = [DictTensor._trusted({k: v[t] for k, v in per_key.items()}) for t in range(self.n_timesteps)]
        actions = [list(step) for step in zip(*[block["action/" + k].unbind(0) for k in self._action_keys])]
        return nxt, running + [scratch], actions

    def _step_views_of(self, block: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
        """``views[t][i]``: step ``t`` of the ``i``-th written key's buffer (``unbind``: one call per key)."""
        per_key = [block[p + k].unbind(0) for p, k in self._write_keys]
        return [list(step) for step in zip(*per_key)]

    def _check_obs_device(self, obs: DictTensor, where: str) -> None:
        for k, v in obs.items():
            if v.device != self.device:
                raise DeviceMismatchError(
                    f"env.{where} returned observation key {k!r} on {v.device}, the batcher device is "
                    f"{self.device}; wrap the env in DeviceEnv(env, from_device, {str(self.device)!r})"
                )

    # ----------------------------------------------------------------- protocol
    def reset(self, agent_info: DictTensor, env_info: DictTensor) -> None:
        """Restarts every env and forgets the carried agent state."""
        self.agent_info = _rows_to_cpu(agent_info, self.n_envs, "agent_info")
        self.env_info = _rows_to_cpu(env_info, self.n_envs, "env_info")
        self._env_info_dev = self.env_info.to(self.device)
        with torch.no_grad():
            obs, ids = self.env.reset(self.env_info)
        self._check_obs_device(obs, "reset")
        self.observation = obs
        self.ids = ids
        self.ids_cpu = torch.arange(self.n_envs)
        self.state: DictTensor | None = None
        self._started = True

    def set_agent_info(self, agent_info: DictTensor) -> None:
        """Replaces the per-env agent_info used from the next acquisition on (one row per env)."""
        self.agent_info = _rows_to_cpu(agent_info, self.n_envs, "agent_info")

    def acquire(self, agent_info: DictTensor | None = None, slot: int = 0) -> dict[str, Any]:
        """Runs one acquisition into block ``slot`` (see :meth:`bind`).

        Returns:
            ``{"n_start": envs running at the start, "n_running": envs still running, "steps": steps taken,
            "timings": cumulative phase seconds}``.
        """
        if agent_info is not None and not agent_info.empty():
            self.set_agent_info(agent_info)
        if not 0 <= slot < len(self._slots):
            raise ValueError(f"slot must be in [0, {len(self._slots)}) (the blocks bound), got {slot}")
        self.block, self._step_views = self._slots[slot]
        self._slot = slot
        with torch.no_grad():
            if self.cuda_graph:
                return self._acquire_graphed()
            return self._acquire()

    def _tick(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _acquire(self) -> dict[str, Any]:
        block, dev, tm = self.block, self.device, self.timings
        assert block is not None and self._started
        ids = self.ids
        B = ids.shape[0]
        n_start = B
        if B == 0:
            return {"n_start": 0, "n_running": 0, "steps": 0, "timings": dict(tm)}
        full = B == self.n_envs
        rows: slice | torch.Tensor = slice(None) if full else ids
        t0 = self._tick()
        ai = self.agent_info if full else self.agent_info.index(self.ids_cpu)
        state = self.state if self.state is not None else self.agent.initial_state(ai, B)
        lengths = block["lengths"]
        lengths.zero_()
        ei = self._env_info_dev if full else self._env_info_dev.index(ids)
        self._write_info(rows, ai, ei, state)
        keys = self._write_keys
        in_place = self._in_place and full
        if in_place:  # the first observation, where the loop reads it
            first = self._in_place_views[self._slot][1][0]
            _foreach_copy([first[k] for k in self._obs_keys], [self.observation[k] for k in self._obs_keys])
        t1 = self._tick()
        tm["copy"] += t1 - t0
        if in_place:
            state, obs = self._loop_in_place(state, ai)
            _add_lengths(lengths, rows, self.n_timesteps)
            tm["steps"] += self.n_timesteps
            self.state, self.observation = state, obs
            return {"n_start": n_start, "n_running": n_start, "steps": self.n_timesteps, "timings": dict(tm)}
        obs = self.observation
        steps = 0
        # Rows running since step `counted` have not had their lengths updated yet: lengths are added when the
        # running set changes and at the end, not at every step.
        counted = 0
        for t in range(self.n_timesteps):
            ta = self._tick()
            history = self._history_at(t, rows, obs) if self._needs_history else None
            action, new_state = self.agent(state, obs, ai, history)
            tb = self._tick()
            (obs_next, _), (obs_running, ids_running) = self.env.step(action)
            tc = self._tick()
            if t == 0:
                self._check_step_outputs(action, obs_next)
            sources = {"observation/": obs, "action/": action, "_observation/": obs_next}
            values = [sources[p][k] for p, k in keys]
            if full:
                _foreach_copy(self._step_views[t], values)
            else:
                for dst, v in zip(self._step_views[t], values):
                    dst[rows] = v
            td = self._tick()
            tm["agent_forward"] += tb - ta
            tm["env_step"] += tc - tb
            tm["buffer_write"] += td - tc
            steps = t + 1
            tm["env_steps"] += B
            n_next = ids_running.shape[0]
            if n_next != B:
                # Episodic envs dropped finished rows; their order is kept, so the survivors' positions in the
                # previous running set are found without leaving the device (the env already synced once).
                _add_lengths(lengths, rows, steps - counted)
                counted = steps
                if n_next == 0:
                    ids, state, obs = ids_running, new_state, obs_running
                    break
                pos = torch.searchsorted(ids, ids_running)
                new_state = new_state.index(pos)
                ids = ids_running
                self.ids_cpu = ids.cpu()
                if not ai.empty():
                    ai = self.agent_info.index(self.ids_cpu)
                B = n_next
                rows = ids
                full = False
            ids, state, obs = ids_running, new_state, obs_running
        if ids.shape[0] > 0:
            _add_lengths(lengths, rows, steps - counted)
        tm["steps"] += steps
        self.ids, self.state, self.observation = ids, state, obs
        if ids.shape[0] == 0:
            self.state = None
        return {"n_start": n_start, "n_running": int(ids.shape[0]), "steps": steps, "timings": dict(tm)}

    def _loop_in_place(self, state: DictTensor, ai: DictTensor) -> tuple[DictTensor, DictTensor]:
        """The step loop with an env that writes in place (every env running): the agent reads step ``t`` from the
        buffer, the env writes ``_observation/*[t]`` and ``observation/*[t+1]`` there (the last running
        observation into a scratch), and only the actions are copied. Returns the last state and observation."""
        tm, B = self.timings, self.n_envs
        nxt, running, actions = self._in_place_views[self._slot]
        keys = self._action_keys
        obs = running[0]
        for t in range(self.n_timesteps):
            ta = self._tick()
            history = self._history_at(t, slice(None), obs) if self._needs_history else None
            action, state = self.agent(state, obs, ai, history)
            tb = self._tick()
            if t == 0:
                self._check_action(action)
            self.env.step_into(action, nxt[t], running[t + 1])
            tc = self._tick()
            _foreach_copy(actions[t], [action[k] for k in keys])
            td = self._tick()
            tm["agent_forward"] += tb - ta
            tm["env_step"] += tc - tb
            tm["buffer_write"] += td - tc
            tm["env_steps"] += B
            obs = running[t + 1]
        return state, obs

    def _write_info(self, rows: slice | torch.Tensor, agent_info: DictTensor, env_info: DictTensor,
                    state: DictTensor) -> None:
        """The acquisition's per-row columns: its agent_info, env_info (on the device) and starting agent state."""
        assert self.block is not None
        for prefix, d in (("agent_info/", agent_info), ("env_info/", env_info), ("agent_state/", state)):
            for k, v in d.items():
                self.block[prefix + k][rows] = v

    # ----------------------------------------------------------------- CUDA graph
    def _acquire_graphed(self) -> dict[str, Any]:
        """One acquisition with ``cuda_graph``: eager the first time (on a side stream, as capture wants its
        warm-up), captured the second time, then replayed."""
        if not self._graph_warm:
            main = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                out = self._acquire()
            main.wait_stream(side)
            self._graph_warm = True
            return out
        block, tm, n = self.block, self.timings, self.n_envs
        assert block is not None and self._started
        t0 = self._tick()
        state = self.state if self.state is not None else self.agent.initial_state(self.agent_info, n)
        self._load_graph_inputs(state)
        self._write_info(slice(None), self.agent_info, self._env_info_dev, state)
        block["lengths"].fill_(self.n_timesteps)
        t1 = self._tick()
        if self._graph is None:
            self._capture()
        assert self._graph is not None
        self._graph.replay()
        t2 = self._tick()
        tm["copy"] += t1 - t0
        tm["graph_replay"] += t2 - t1
        tm["steps"] += self.n_timesteps
        tm["env_steps"] += n * self.n_timesteps
        self.observation, self.state = self._graph_obs, self._graph_agent_state
        return {"n_start": n, "n_running": n, "steps": self.n_timesteps, "timings": dict(tm)}

    def _load_graph_inputs(self, state: DictTensor) -> None:
        """Puts the current observation, agent state and env state into the tensors the graph reads (made at the
        first call), wherever they are other tensors: after a ``reset``, or an env or agent that rebinds."""
        env = self.env
        if self._graph_env is None:
            self._graph_obs = DictTensor._trusted({k: v.clone() for k, v in self.observation.items()})
            self._graph_agent_state = DictTensor._trusted({k: v.clone() for k, v in state.items()})
            self._graph_env = [getattr(env, a).clone() for a in self._graph_attrs]
            ai = self.agent_info
            self._graph_ai = DictTensor._trusted({k: v.pin_memory() for k, v in ai.items()}) if not ai.empty() else ai
            self._graph_ai_source = ai
        if self.agent_info is not self._graph_ai_source:  # new agent_info, from reset or execute
            # The graph reads these pinned tensors: no replay may still be reading them while they change.
            torch.cuda.synchronize(self.device)
            _load_into(self._graph_ai, self.agent_info, "agent_info")
            self._graph_ai_source = self.agent_info
        _load_into(self._graph_obs, self.observation, "the observation")
        _load_into(self._graph_agent_state, state, "the agent state")
        self._load_env_state()

    def _load_env_state(self) -> None:
        """Copies the env's state tensors into the graph's and points the env's attributes at those."""
        env, names = self.env, self._graph_attrs
        _copy_into(self._graph_env, [getattr(env, a) for a in names], [f"env attribute {a!r}" for a in names])
        for a, static in zip(names, self._graph_env):
            setattr(env, a, static)

    def _capture(self) -> None:
        """Captures ``n_timesteps`` steps into one CUDA graph, ending with the copies that close the loop: the last
        observation, agent state and env state back into the tensors the first step reads."""
        graph = torch.cuda.CUDAGraph()
        env, keys = self.env, self._write_keys
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
        try:
            with torch.cuda.graph(graph):
                obs, state, ai = self._graph_obs, self._graph_agent_state, self._graph_ai
                for t in range(self.n_timesteps):
                    history = self._history_at(t, slice(None), obs) if self._needs_history else None
                    action, state = self.agent(state, obs, ai, history)
                    (obs_next, _), (obs_running, _) = env.step(action)
                    sources = {"observation/": obs, "action/": action, "_observation/": obs_next}
                    _foreach_copy(self._step_views[t], [sources[p][k] for p, k in keys])
                    obs = obs_running
                # Close the loop: the next replay starts from where this one ends.
                _load_into(self._graph_obs, obs, "the observation")
                _load_into(self._graph_agent_state, state, "the agent state")
                self._load_env_state()
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
            for a, static in zip(self._graph_attrs, self._graph_env):  # also when the capture failed half-way
                setattr(env, a, static)
        self._graph = graph

    def _check_step_outputs(self, action: DictTensor, obs_next: DictTensor) -> None:
        self._check_action(action)
        self._check_obs_device(obs_next, "step")

    def _check_action(self, action: DictTensor) -> None:
        expected = [k[len("action/"):] for k in self.block if k.startswith("action/")]
        if list(action.keys()) != expected:
            raise KeyError(
                f"the agent returned keys {list(action.keys())}, but the buffer was sized for {expected} "
                "(from the probe call); return the same keys at every step"
            )
        for k, v in action.items():
            if v.device != self.device:
                raise DeviceMismatchError(
                    f"the agent returned action key {k!r} on {v.device}, the batcher device is {self.device}; "
                    "compute the action on the batcher device (wrap the agent in RL_Agent_CheckDevice to find where)"
                )

    def close(self) -> None:
        self._graph = None
        try:
            self.env.close()
        finally:
            self.agent.close()


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


def _check_same_keys(static: DictTensor, d: DictTensor, what: str) -> None:
    if list(d.keys()) != list(static.keys()):
        raise GraphCaptureError(
            f"with cuda_graph=True {what} must keep its keys at every step: {list(static.keys())} at the start of "
            f"the loop, {list(d.keys())} at its end; return the same keys (or pass cuda_graph=False)"
        )


def _check_same_layout(static: torch.Tensor, x: torch.Tensor, what: str) -> None:
    if x.shape != static.shape or x.dtype != static.dtype or x.device != static.device:
        raise GraphCaptureError(
            f"with cuda_graph=True {what} must keep its shape, dtype and device: {static.dtype} "
            f"{list(static.shape)} on {static.device} when captured, now {x.dtype} {list(x.shape)} on {x.device}; "
            "keep them fixed (or pass cuda_graph=False)"
        )


def _copy_into(statics: list[torch.Tensor], values: list[torch.Tensor], names: list[str]) -> None:
    """``statics[i].copy_(values[i])`` wherever ``values[i]`` is another tensor, each checked to keep its layout
    (``names[i]`` says which in the error)."""
    pairs = [(s, v, name) for s, v, name in zip(statics, values, names) if v is not s]
    for s, v, name in pairs:
        _check_same_layout(s, v, name)
    _foreach_copy([s for s, _, _ in pairs], [v for _, v, _ in pairs])


def _load_into(static: DictTensor, d: DictTensor, what: str) -> None:
    """Copies ``d`` into the tensors of ``static`` (same keys and layouts), unless it is ``static`` itself."""
    if d is static:
        return
    _check_same_keys(static, d, what)
    keys = list(static.keys())
    _copy_into([static[k] for k in keys], [d[k] for k in keys], [f"{what} key {k!r}" for k in keys])


def build_acquirer(
    create_env: Callable[..., Any],
    env_args: dict,
    seed: int,
    create_agent: Callable[..., RL_Agent],
    agent_args: dict,
    agent_seed: int | None,
    n_timesteps: int,
    device: torch.device,
    check_device: bool,
    sync_timings: bool = False,
    cuda_graph: bool = False,
) -> Acquirer:
    """Builds the env and agent of one worker (``create_env(**env_args, seed=seed)``) and their acquirer."""
    from rlstruct.agents import RL_Agent_CheckDevice

    env = create_env(**{**env_args, "seed": seed})
    try:
        agent = create_agent(**agent_args)
        if check_device:
            agent = RL_Agent_CheckDevice(agent, device)
    except BaseException:
        env.close()
        raise
    try:
        return Acquirer(env, agent, n_timesteps, device, agent_seed=agent_seed, sync_timings=sync_timings,
                        cuda_graph=cuda_graph)  # fmt: skip
    except BaseException:
        env.close()
        agent.close()
        raise
