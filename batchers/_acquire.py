"""The step loop shared by every batcher mode: one agent, one VecEnv, one block of buffer rows.

The same :class:`Acquirer` runs inside a worker process or in the calling
process. It writes into a preallocated block of the trajectory buffer, whose
row ``i`` belongs to env ``i`` of its VecEnv. Per-step work is over whole
batches: no Python loop over envs, no ``.item()``, and no host–device sync
unless envs finished during the step (episodic envs), which the env itself
already paid for when it shrank its running set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from rlstruct.devices import as_device
from rlstruct.errors import BatchSizeError, DeviceMismatchError
from rlstruct.structures import DictTensor, TemporalDictTensor

from rlstruct.agents import RL_Agent

__all__ = ["Acquirer", "Specs", "PHASES", "allocate_block", "copy_batch_major", "TEMPORAL_PREFIXES", "INFO_PREFIXES"]

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
        self.timings["steps"] = 0.0
        self.timings["env_steps"] = 0.0
        self._sync = sync_timings and self.device.type == "cuda"
        self._started = False
        self._needs_history = bool(agent.require_history())

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

    def bind(self, block: dict[str, torch.Tensor]) -> None:
        """Attaches the buffer block this acquirer writes into.

        The per-step destinations are made here once: ``self._step_views[t]`` lists, for every key the step
        writes (observation, action, next observation), the view ``buffer[t]``, so that a step's writes are
        one ``_foreach_copy_`` call (one dispatch, and fused kernels on a GPU) instead of one indexed
        assignment per key.
        """
        self.block = block
        self._temporal_keys = [k for k in block if k.startswith(TEMPORAL_PREFIXES)]
        self._write_keys = [
            (prefix, k[len(prefix):]) for prefix in TEMPORAL_PREFIXES for k in block if k.startswith(prefix)
        ]
        bufs = [block[p + k] for p, k in self._write_keys]
        self._step_views = [[b[t] for b in bufs] for t in range(self.n_timesteps)]

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

    def acquire(self, agent_info: DictTensor | None = None) -> dict[str, Any]:
        """Runs one acquisition into the block.

        Returns:
            ``{"n_start": envs running at the start, "n_running": envs still running, "steps": steps taken,
            "timings": cumulative phase seconds}``.
        """
        if agent_info is not None and not agent_info.empty():
            self.set_agent_info(agent_info)
        with torch.no_grad():
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
        for prefix, d in (("agent_info/", ai), ("env_info/", ei), ("agent_state/", state)):
            for k, v in d.items():
                block[prefix + k][rows] = v
        keys = self._write_keys
        t1 = self._tick()
        tm["copy"] += t1 - t0
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

    def _check_step_outputs(self, action: DictTensor, obs_next: DictTensor) -> None:
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
        self._check_obs_device(obs_next, "step")

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            self.agent.close()


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
    return Acquirer(env, agent, n_timesteps, device, agent_seed=agent_seed, sync_timings=sync_timings)
