"""The step loop shared by every batcher mode: one agent, one VecEnv, one block of buffer rows.

:class:`Acquirer` runs in a worker process or in the calling process and writes its env's rows of the trajectory
buffer (:mod:`~rlstruct.batchers._buffer`), checking what the agent and the env hand over against the buffer's
layout. An auto-reset env runs every row at every step (one ``step_into`` loop, which a CUDA graph can capture);
an episodic env shrinks its running set as episodes end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.batchers._buffer import TEMPORAL_PREFIXES, Specs, foreach_copy, specs_of
from rlstruct.batchers._carry import Carry
from rlstruct.batchers._graph import StepGraph
from rlstruct.devices import as_device
from rlstruct.envs import VecEnv
from rlstruct.errors import AgentOutputError, BatchSizeError, DeviceMismatchError, GraphCaptureError, SpaceError
from rlstruct.structures import DictTensor, TemporalDictTensor

__all__ = ["Acquirer", "PHASES", "build_acquirer"]

PHASES = ("agent_forward", "env_step", "buffer_write", "copy")


def _add_lengths(lengths: torch.Tensor, rows: slice | torch.Tensor, n: int) -> None:
    """``lengths[rows] += n``: ``rows`` is ``slice(None)`` or an index tensor."""
    if isinstance(rows, slice):
        lengths.add_(n)
    else:
        lengths.index_add_(0, rows, torch.full_like(rows, n))


@dataclass
class _SlotViews:
    """The per-step views of one buffer block, made once at :meth:`Acquirer.bind`.

    ``running[t]`` is ``observation/*[t]`` (``running[T]``: a scratch for the observation after the last step),
    ``nxt[t]`` is ``_observation/*[t]``, ``actions[t]`` lists ``action/*[t]``, and ``writes[t]`` lists every
    temporal key's step ``t`` in the acquirer's key order (the episodic loop writes them together).
    """

    block: dict[str, torch.Tensor]
    running: list[DictTensor]
    nxt: list[DictTensor]
    actions: list[list[torch.Tensor]]
    writes: list[list[torch.Tensor]]


def _outputs(returned: Any, agent: RL_Agent) -> tuple[DictTensor, DictTensor]:
    """What the agent returned, checked to be ``(output, new_state)``, two DictTensors (at the probe call only)."""
    name = type(getattr(agent, "agent", agent)).__name__  # the user's agent, under RL_Agent_CheckDevice
    if isinstance(returned, tuple) and len(returned) == 2 and all(isinstance(x, DictTensor) for x in returned):
        return returned
    if isinstance(returned, tuple):
        got = f"a tuple of {len(returned)} ({', '.join(type(x).__name__ for x in returned)})"
    else:
        got = f"a {type(returned).__name__}"
    hint = (" (the state is missing)" if isinstance(returned, DictTensor)
            else " (wrap it: DictTensor({'action': action}))" if isinstance(returned, torch.Tensor) else "")
    raise AgentOutputError(
        f"{name}.__call__ must return (output, new_state), two DictTensors, the output holding 'action', got "
        f"{got}{hint}; return e.g. (DictTensor({{'action': action}}), new_state), with new_state=DictTensor({{}}) "
        "for a stateless agent"
    )


class Acquirer:
    """Collects ``n_timesteps`` steps of ``agent`` on ``env`` into a buffer block.

    It trusts what it is handed: ``agent_info`` and ``env_info`` were checked at the batcher's boundary (CPU,
    one row per env, the example's keys); it checks what the agent and env return.

    Args:
        env: the VecEnv (its observations on ``device``).
        agent: the agent (its state and outputs on ``device``).
        n_timesteps: steps per acquisition.
        device: where env observations, agent state and the buffer block live.
        agent_seed: passed to ``agent.seed`` after the probe call, when given.
        env_index: the global index of the env's first row when the batcher has one seed: ``agent_seed`` goes to
            ``agent.seed_envs(agent_seed, env_index)`` instead (``None``: one seed per worker).
        sync_timings: synchronize the device at phase boundaries so that timings are exact on a GPU
            (costs one sync per phase; off by default).
        cuda_graph: replay the whole step loop (agent, env step and buffer writes, ``n_timesteps`` steps) as
            one CUDA graph: the first acquisition runs eagerly (lazy initialisations happen there), the second
            captures the loop, every later one is one ``replay``. Needs a CUDA ``device`` and an env whose
            :meth:`~rlstruct.envs.VecEnv.graph_state` hands out its state (the auto-reset torch simulators). Only
            device work is replayed: what the agent computes on the host is frozen at capture, its weights must
            be updated in place (``load_state_dict`` does), and ``agent_info`` reaches it as pinned host
            tensors updated in place (copy them to the device with ``non_blocking=True``).

    Raises:
        ValueError: ``cuda_graph`` on a device other than CUDA.
        GraphCaptureError: ``cuda_graph`` with an env that cannot be captured (no ``graph_state()``, or not
            auto-reset).
    """

    def __init__(
        self,
        env,
        agent: RL_Agent,
        n_timesteps: int,
        device: torch.device,
        *,
        agent_seed: int | None = None,
        env_index: int | None = None,
        sync_timings: bool = False,
        cuda_graph: bool = False,
    ):
        self.env = env
        self.agent_seed = agent_seed
        self.env_index = env_index
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
        # Every row runs at every step: the step_into loop. Otherwise the running set shrinks as episodes end.
        self._full_rows = bool(getattr(env, "autoreset", False))
        self.cuda_graph = bool(cuda_graph)
        self._graph = StepGraph(env, agent, self.device) if self.cuda_graph else None
        # On an accelerator the env records its action checks on the device; they are read after each acquisition.
        deferred = getattr(env, "deferred_action_check", None)
        self._action_checks = deferred() if callable(deferred) else None
        self.n_acquired = 0
        self.carry: Carry | None = None  # with restart_workers: where each boundary's state is kept
        if self._graph is not None and not self._full_rows:
            raise GraphCaptureError(
                f"cuda_graph=True needs an auto-reset env (every env running, fixed shapes), but {env!r} has "
                "autoreset=False; build it with autoreset=True or pass cuda_graph=False"
            )

    # ----------------------------------------------------------------- setup
    def probe(self, agent_info: DictTensor, env_info: DictTensor) -> Specs:
        """Resets the env and calls the agent once to learn every buffer key's shape and dtype.

        The global torch RNG is restored afterwards, so the probe does not change what follows.
        """
        devices = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            obs, ids = self.env.reset(env_info)
            self._check_obs_device(obs, "reset")
            state = self.agent.initial_state(agent_info, self.n_envs)
            history = self._history_at(0, slice(None), obs) if self._needs_history else None
            action, new_state = _outputs(self.agent(state, obs, agent_info, history), self.agent)
        if "action" not in action:
            raise KeyError(f"the agent output must hold the key 'action', got keys {list(action.keys())}")
        specs: Specs = {}
        specs.update(specs_of(obs, "observation/"))
        specs.update(specs_of(action, "action/"))
        specs.update(specs_of(obs, "_observation/"))
        specs.update(specs_of(agent_info, "agent_info/"))
        specs.update(specs_of(env_info, "env_info/"))
        specs.update(specs_of(new_state, "agent_state/"))
        self.specs = specs
        # Seeded after the probe call, so that the agent's own generator starts fresh for the first acquisition.
        if self.agent_seed is not None and self.env_index is not None:
            self.agent.seed_envs(self.agent_seed, self.env_index)
        elif self.agent_seed is not None:
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

        The per-step destinations are made here once per slot (:class:`_SlotViews`), so that a step's writes are
        views handed to ``step_into`` and one ``_foreach_copy_`` call (one dispatch, and fused kernels on a GPU)
        instead of one indexed assignment per key.
        """
        block = blocks[0]
        self._temporal_keys = [k for k in block if k.startswith(TEMPORAL_PREFIXES)]
        self._write_keys = [
            (prefix, k[len(prefix):]) for prefix in TEMPORAL_PREFIXES for k in block if k.startswith(prefix)
        ]
        self._obs_keys = [k for p, k in self._write_keys if p == "observation/"]
        self._action_keys = [k for p, k in self._write_keys if p == "action/"]
        # What each kind of output must look like, from the probe: [(key, per-row shape, dtype)] and the key set.
        self._layout = {
            prefix: (
                [(k[len(prefix):], shape, dtype) for k, (shape, dtype) in self.specs.items() if k.startswith(prefix)],
                frozenset(k[len(prefix):] for k in self.specs if k.startswith(prefix)),
            )
            for prefix in ("observation/", "action/", "agent_state/")
        }
        # The observation after the last step: one scratch for every slot (the next acquisition copies it in).
        scratch = DictTensor._trusted({k: torch.empty_like(block["observation/" + k][0]) for k in self._obs_keys})
        self._slots = [self._views_of(b, scratch) for b in blocks]
        self._slot = 0
        self.block = block

    def _views_of(self, block: dict[str, torch.Tensor], scratch: DictTensor) -> _SlotViews:
        def per_step(prefix: str, keys: list[str]) -> list[dict[str, torch.Tensor]]:
            steps = {k: block[prefix + k].unbind(0) for k in keys}
            return [{k: v[t] for k, v in steps.items()} for t in range(self.n_timesteps)]

        running = [DictTensor._trusted(d) for d in per_step("observation/", self._obs_keys)] + [scratch]
        nxt = [DictTensor._trusted(d) for d in per_step("_observation/", self._obs_keys)]
        actions = [list(d.values()) for d in per_step("action/", self._action_keys)]
        writes = [list(step) for step in zip(*[block[p + k].unbind(0) for p, k in self._write_keys])]
        return _SlotViews(block, running, nxt, actions, writes)

    def _check_obs_device(self, obs: DictTensor, where: str) -> None:
        for k, v in obs.items():
            if v.device != self.device:
                raise DeviceMismatchError(
                    f"env.{where} returned observation key {k!r} on {v.device}, the batcher device is "
                    f"{self.device}; wrap the env in DeviceEnv(env, from_device, {str(self.device)!r})"
                )

    # ----------------------------------------------------------------- protocol
    def reset(self, agent_info: DictTensor, env_info: DictTensor, boundary: int | None = None) -> None:
        """Restarts every env and forgets the carried agent state; keeps the state as ``boundary`` (the batcher's
        count of resets and acquisitions) where :attr:`carry` is set."""
        self._set_infos(agent_info, env_info)
        with torch.no_grad():
            obs, ids = self.env.reset(env_info)
        self._check_obs_device(obs, "reset")
        self._check_fits(obs, "observation/", self.n_envs, "env.reset", _ENV_FIX)
        self.observation = obs
        self.ids = ids
        self.ids_cpu = torch.arange(self.n_envs)
        self.state: DictTensor | None = None
        self._started = True
        if self.carry is not None and boundary is not None:
            self.carry.write(self, boundary)

    def restore(self, agent_info: DictTensor, env_info: DictTensor, boundary: int) -> None:
        """Takes the state :attr:`carry` kept at ``boundary`` (a failed predecessor's), with these infos."""
        assert self.carry is not None
        self._set_infos(agent_info, env_info)
        self.carry.restore(self, boundary)
        self._started = True

    def _set_infos(self, agent_info: DictTensor, env_info: DictTensor) -> None:
        self.agent_info = agent_info
        self.env_info = env_info
        self._env_info_dev = env_info.to(self.device)

    def acquire(
        self, agent_info: DictTensor | None = None, slot: int = 0, boundary: int | None = None
    ) -> dict[str, Any]:
        """Runs one acquisition into block ``slot`` (see :meth:`bind`), with ``agent_info`` (one row per env)
        from now on when it is given; keeps the state after it as ``boundary`` where :attr:`carry` is set.

        Returns:
            ``{"n_start": envs running at the start, "n_running": envs still running, "steps": steps taken,
            "timings": cumulative phase seconds}``.
        """
        if agent_info is not None and not agent_info.empty():
            self.agent_info = agent_info
        assert 0 <= slot < len(self._slots) and self._started
        self._slot = slot
        self.block = self._slots[slot].block
        checks = self._action_checks
        if checks is not None:  # the last acquisition's, if its read had to wait for the device
            checks.raise_pending(wait=True)
        self.n_acquired += 1
        with torch.no_grad():
            if not self._full_rows:
                out = self._acquire_episodic()
            elif self._graph is not None and not self._graph.warm:
                out = self._graph.warm_up(self._acquire_full)
            else:
                out = self._acquire_full()
        if checks is not None:
            # No host sync here (in process, the learner reads the buffer in stream order): a copy of the record,
            # read now if the device is done with it, else by raise_action_errors or the next acquisition.
            checks.snapshot(f" of acquisition {self.n_acquired}")
            checks.raise_pending(wait=False)
        if self.carry is not None and boundary is not None:
            t0 = self._tick()
            self.carry.write(self, boundary)
            self.timings["copy"] += self._tick() - t0
        return out

    def raise_action_errors(self) -> None:
        """Reads the env's deferred action checks of the last acquisition (on an accelerator), waiting for them:
        free where the caller has just synchronised with the device.

        Raises:
            ActionRangeError: an action of that acquisition was outside the action space (the message names the
                step).
        """
        if self._action_checks is not None:
            self._action_checks.raise_pending(wait=True)

    def _tick(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @staticmethod
    def _no_tick() -> float:
        return 0.0

    def _start(self, rows: slice | torch.Tensor, ai: DictTensor, ei: DictTensor, n: int) -> DictTensor:
        """Writes the acquisition's per-row columns (agent_info, env_info, the starting agent state) and zeroes
        ``lengths``; returns the starting agent state."""
        if self.state is not None:
            state = self.state
            self._check_fits(state, "agent_state/", n, "the agent", _STATE_FIX)
        else:
            state = self.agent.initial_state(ai, n)
            self._check_fits(state, "agent_state/", n, "agent.initial_state", _STATE_FIX)
        for prefix, d in (("agent_info/", ai), ("env_info/", ei), ("agent_state/", state)):
            for k, v in d.items():
                dst = self.block[prefix + k]
                # agent_info stays on the CPU; an index write (the running rows) needs it on the buffer's device.
                dst[rows] = v if isinstance(rows, slice) else v.to(dst.device, non_blocking=True)
        self.block["lengths"].zero_()
        return state

    def _acquire_full(self) -> dict[str, Any]:
        """One acquisition with every env running: the first observation into the buffer, then the step loop
        (eager, or replayed as a CUDA graph)."""
        views, tm, n, T = self._slots[self._slot], self.timings, self.n_envs, self.n_timesteps
        t0 = self._tick()
        state = self._start(slice(None), self.agent_info, self._env_info_dev, n)
        first = views.running[0]
        if self.observation is not first:
            foreach_copy([first[k] for k in self._obs_keys], [self.observation[k] for k in self._obs_keys])
        t1 = self._tick()
        tm["copy"] += t1 - t0
        if self._graph is not None and self._graph.warm:
            state = self._graph.replay(lambda s, ai: self._steps(s, ai, views, self._no_tick), state, self.agent_info)
            tm["graph_replay"] += self._tick() - t1
        else:
            state = self._steps(state, self.agent_info, views, self._tick)
        self.block["lengths"].fill_(T)
        tm["steps"] += T
        tm["env_steps"] += n * T
        self.state, self.observation = state, views.running[T]
        return {"n_start": n, "n_running": n, "steps": T, "timings": dict(tm)}

    def _steps(self, state: DictTensor, ai: DictTensor, views: _SlotViews, tick: Callable[[], float]) -> DictTensor:
        """The step loop with every env running: the agent reads step ``t`` from the buffer, ``env.step_into``
        writes ``_observation/*[t]`` and ``observation/*[t+1]`` there (the last running observation into the
        scratch), and the actions are copied. Returns the agent state after the last step."""
        tm, keys, n = self.timings, self._action_keys, self.n_envs
        obs = views.running[0]
        for t in range(self.n_timesteps):
            ta = tick()
            history = self._history_at(t, slice(None), obs) if self._needs_history else None
            action, state = self.agent(state, obs, ai, history)
            tb = tick()
            self._check_action(action, n, t)
            self.env.step_into(action, views.nxt[t], views.running[t + 1])
            tc = tick()
            foreach_copy(views.actions[t], [action[k] for k in keys])
            td = tick()
            tm["agent_forward"] += tb - ta
            tm["env_step"] += tc - tb
            tm["buffer_write"] += td - tc
            obs = views.running[t + 1]
        return state

    def _acquire_episodic(self) -> dict[str, Any]:
        """One acquisition of an env whose running set shrinks as its episodes end: ``env.step`` returns the
        running rows, which are written where they belong."""
        views, tm = self._slots[self._slot], self.timings
        lengths = views.block["lengths"]
        ids = self.ids
        B = n_start = ids.shape[0]
        if B == 0:
            return {"n_start": 0, "n_running": 0, "steps": 0, "timings": dict(tm)}
        full = B == self.n_envs
        rows: slice | torch.Tensor = slice(None) if full else ids
        t0 = self._tick()
        ai = self.agent_info if full else self.agent_info.index(self.ids_cpu)
        ei = self._env_info_dev if full else self._env_info_dev.index(ids)
        state = self._start(rows, ai, ei, B)
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
            self._check_action(action, B, t)
            (obs_next, _), (obs_running, ids_running) = self.env.step(action)
            tc = self._tick()
            if t == 0:
                self._check_obs_device(obs_next, "step")
            self._check_fits(obs_next, "observation/", B, "env.step (observation_next)", _ENV_FIX)
            self._check_fits(obs_running, "observation/", ids_running.shape[0], "env.step (observation_running)",
                             _ENV_FIX)
            sources = {"observation/": obs, "action/": action, "_observation/": obs_next}
            values = [sources[p][k] for p, k in keys]
            if full:
                foreach_copy(views.writes[t], values)
            else:
                for dst, v in zip(views.writes[t], values):
                    dst[rows] = v
            td = self._tick()
            tm["agent_forward"] += tb - ta
            tm["env_step"] += tc - tb
            tm["buffer_write"] += td - tc
            steps = t + 1
            tm["env_steps"] += B
            n_next = ids_running.shape[0]
            if n_next != B:
                # Finished rows were dropped; their order is kept, so the survivors' positions in the previous
                # running set are found without leaving the device (the env already synced once).
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

    def _check_fits(self, d: DictTensor, prefix: str, n_rows: int, who: str, fix: str) -> None:
        """Raises unless ``d`` has the keys, per-row shapes and dtypes the buffer holds under ``prefix``, and
        ``n_rows`` rows: SpaceError for keys, shapes and dtypes, BatchSizeError for the rows. Metadata only."""
        layout, keys = self._layout[prefix]
        if d.variables.keys() != keys:
            got = set(d.variables)
            raise SpaceError(
                f"{who} returned the keys {sorted(got)}, but the buffer holds {sorted(keys)} under {prefix!r} "
                f"(missing {sorted(keys - got)}, unexpected {sorted(got - keys)}); {fix}"
            )
        for k, shape, dtype in layout:
            v = d.variables[k]
            if v.dim() == 0 or v.shape[0] != n_rows:
                raise BatchSizeError(
                    f"{who} returned {k!r} with shape {tuple(v.shape)}, the buffer needs one row per running env, "
                    f"{(n_rows, *shape)}; return one row per env, in the order of the observation's rows"
                )
            if v.shape[1:] != shape or v.dtype != dtype:
                raise SpaceError(
                    f"{who} returned {k!r} with rows of shape {tuple(v.shape[1:])} and dtype {v.dtype}, but the "
                    f"buffer holds {prefix}{k} as rows of shape {shape} and dtype {dtype}; {fix}"
                )

    def _check_action(self, action: DictTensor, n_rows: int, t: int) -> None:
        """The agent's outputs against the buffer at every step (keys, rows, per-row shapes and dtypes: metadata
        only); their device at the first step of an acquisition."""
        self._check_fits(action, "action/", n_rows, "the agent", _AGENT_FIX)
        if t != 0:
            return
        for k, v in action.items():
            if v.device != self.device:
                raise DeviceMismatchError(
                    f"the agent returned action key {k!r} on {v.device}, the batcher device is {self.device}; "
                    "compute the action on the batcher device (wrap the agent in RL_Agent_CheckDevice to find where)"
                )

    def close(self) -> None:
        if self._graph is not None:
            self._graph.close()
        try:
            self.env.close()
        finally:
            self.agent.close()


_ENV_FIX = (
    "an env must return the keys, per-row shapes and dtypes of its reset observation at every reset and step (a "
    "copy into the buffer would broadcast or cast them silently)"
)
_AGENT_FIX = (
    "the agent must return the keys, per-row shapes and dtypes of the batcher's probe call (made at construction) "
    "at every step"
)
_STATE_FIX = (
    "the agent state (initial_state, and the state the agent returns) must keep the keys, per-row shapes and "
    "dtypes of the state returned by the batcher's probe call at construction"
)


def build_acquirer(
    create_env: Callable[..., Any],
    env_args: dict,
    seed: int,
    create_agent: Callable[..., RL_Agent],
    agent_args: dict,
    device: torch.device,
    *,
    agent_seed: int | None = None,
    env_index: int | None = None,
    n_timesteps: int,
    check_device: bool = False,
    sync_timings: bool = False,
    cuda_graph: bool = False,
) -> Acquirer:
    """Builds a worker's env (``create_env(**env_args, seed=seed)``, and ``env_index=env_index`` unless it is
    ``None``) and agent (``create_agent(**agent_args)``,
    wrapped in :class:`~rlstruct.agents.RL_Agent_CheckDevice` with ``check_device``) and their acquirer; closes
    what it built when a later part fails."""
    env_kwargs = {**env_args, "seed": seed}
    if env_index is not None:
        env_kwargs["env_index"] = env_index
    env = create_env(**env_kwargs)
    if not isinstance(env, VecEnv):
        close = getattr(env, "close", None)
        if callable(close):
            close()
        raise TypeError(
            f"create_env must build a VecEnv, got {type(env).__name__} from "
            f"{getattr(create_env, '__name__', create_env)}; for a gymnasium id pass create_env=make_env, "
            "env_args={'name': 'CartPole-v1', 'n_envs': 8, "
            "'backend': 'gymnasium'}, or wrap the gymnasium envs in GymEnv([...])"
        )
    try:
        agent = create_agent(**agent_args)
        if check_device:
            agent = RL_Agent_CheckDevice(agent, device)
    except BaseException:
        env.close()
        raise
    try:
        return Acquirer(env, agent, n_timesteps, device, agent_seed=agent_seed, env_index=env_index,
                        sync_timings=sync_timings, cuda_graph=cuda_graph)
    except BaseException:
        env.close()
        agent.close()
        raise
