"""The batched MinAtar env around any game of this package: :class:`MinAtarEnv`, its pure step and its state I/O.

A game (one folder per game, its ``rules`` module's ``GAME``) holds the rules: a pure reset and step over a flat
dict of tensors, and the frame. The env adds what minatar's ``Environment`` and the gymnasium ids add around the
game: the minimal action set, sticky actions, the time limit, the auto-reset and the counter-based draws.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium import spaces

from rlstruct.devices import DeviceLike
from rlstruct.envs._actions import ActionSpec
from rlstruct.envs._base import HostDestinations, StepResult, check_env_info, check_sizes
from rlstruct.envs._jit import jit_module, jit_wanted
from rlstruct.envs._rng import START_SALT, draw_table, step_uniforms, uniform_draws
from rlstruct.envs._sim_env import SimEnv
from rlstruct.envs._sim_io import check_action
from rlstruct.envs._steppers import fused
from rlstruct.errors import BatchSizeError, DeviceMismatchError, SpaceError
from rlstruct.structures import DictTensor

__all__ = ["Game", "MinAtarEnv", "GAMES", "game", "has_kernels", "advance", "autoreset_step",
           "autoreset_step_sparse", "restart", "random_start", "STICKY_ACTION_PROB"]

#: The games with a torch simulator: gymnasium name (``MinAtar/<name>-v1``) -> (minatar's name, whose folder is
#: ``rlstruct.envs.minatar._<minatar name>``; the minimal action set, in minatar's letters and order).
GAMES = {
    "Asterix": ("asterix", "nlurd"),
    "Breakout": ("breakout", "nlr"),
    "Freeway": ("freeway", "nud"),
    "Seaquest": ("seaquest", "nlurdf"),
    "SpaceInvaders": ("space_invaders", "nlrf"),
}
#: minatar's ``Environment`` default, which its gymnasium ids keep.
STICKY_ACTION_PROB = 0.1
#: The actions of every game, in minatar's order (an action's index is its full-set number).
ACTION_MAP = ("n", "l", "u", "r", "d", "f")
_DRIVER = "rlstruct.envs.minatar._jit_driver"
# The prefix of the game's keys in the env's state, beside the env's own ("elapsed_steps", "episode", "rng_key",
# "last_action", "sticky_action").
_GAME_PREFIX = "game/"


class Game(Protocol):
    """What a game module's ``GAME`` is: the rules of one minatar game over batched tensors.

    A draw ``u`` in ``[0, 1)`` stands for the reference's random call at the same point: ``rand() -> u``,
    ``choice(k items) -> items[floor(u * k)]``, ``randint(a, b) -> a + floor(u * (b - a))``. A step consumes
    ``n_step_draws`` of them whether it uses them or not.
    """

    name: str
    channels: tuple[str, ...]
    n_step_draws: int
    n_reset_draws: int

    def reset(self, u: torch.Tensor, ramping: bool) -> dict[str, torch.Tensor]: ...

    def step(
        self, state: dict[str, torch.Tensor], action: torch.Tensor, u: torch.Tensor, ramping: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]: ...

    def observe(self, state: dict[str, torch.Tensor]) -> torch.Tensor: ...


def has_kernels(name: str) -> bool:
    """Whether the game of minatar name ``name`` has a compiled CPU step: its ``rules`` module is written for both
    steps (it declares ``STATE_KEYS``; imports only the game's folder)."""
    return hasattr(importlib.import_module(f"rlstruct.envs.minatar._{name}.rules"), "STATE_KEYS")


def game(name: str) -> tuple[Game, tuple[int, ...]]:
    """The ``GAME`` of the gymnasium name ``name`` (``"Breakout"``) or minatar name (``"breakout"``), and its minimal
    action set (full-set action numbers).

    Raises:
        ValueError: no torch simulator for ``name``.

    >>> rules, actions = game("Breakout")
    >>> rules.channels, actions
    (('paddle', 'ball', 'trail', 'brick'), (0, 1, 3))
    """
    by_minatar_name = {v[0]: v for v in GAMES.values()}
    entry = GAMES.get(name, by_minatar_name.get(name))
    if entry is None:
        raise ValueError(f"game must be one of {list(GAMES)}, got {name!r}; the torch MinAtar games are those")
    minatar_name, letters = entry
    rules = importlib.import_module(f"rlstruct.envs.minatar._{minatar_name}.rules").GAME
    return rules, tuple(ACTION_MAP.index(a) for a in letters)


class _Settings(Protocol):
    game: Game
    ramping: bool
    sticky_action_prob: float
    _limit: int
    _action_set: torch.Tensor
    _reset_table: Any


def restart(env: _Settings, state: dict[str, torch.Tensor], episode: torch.Tensor) -> dict[str, torch.Tensor]:
    """The initial states of episodes ``episode`` (``int64 [B]``) of the envs of ``state`` (its ``rng_key``): a new
    state dict, the env's counters at zero."""
    u = uniform_draws(state["rng_key"], episode, env._reset_table).t()
    fresh = {_GAME_PREFIX + k: v for k, v in env.game.reset(u, env.ramping).items()}
    # A tensor each: a state whose keys share one is another input to the compiled step, which would compile again
    # once a step has given them apart.
    fresh.update(elapsed_steps=torch.zeros_like(episode), episode=episode, rng_key=state["rng_key"],
                 last_action=torch.zeros_like(episode), sticky_action=torch.zeros_like(episode))
    return fresh


def _game_part(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    n = len(_GAME_PREFIX)
    return {k[n:]: v for k, v in state.items() if k.startswith(_GAME_PREFIX)}


def _where(mask: torch.Tensor, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per key, ``a`` where ``mask [B]`` else ``b``."""
    return {k: torch.where(mask.view((-1,) + (1,) * (v.dim() - 1)), v, b[k]) for k, v in a.items()}


def advance(
    env: _Settings, state: dict[str, torch.Tensor], action: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One step of every env of ``state`` with the minimal-set actions ``action`` (``int64 [B]``): pure, no host
    sync, no branch on a value.

    Returns:
        ``(state, out)``: the state reached (before any auto-reset) and ``frame``, ``reward``, ``terminated``,
        ``truncated``, ``done`` of the step.
    """
    full = env._action_set[action]
    u = step_uniforms(state["rng_key"], state["episode"], state["elapsed_steps"], 1 + env.game.n_step_draws)
    # minatar's Environment.act: with probability sticky_action_prob the previous action is repeated.
    played = torch.where(u[:, 0] < env.sticky_action_prob, state["sticky_action"], full)
    g, reward, terminated = env.game.step(_game_part(state), played, u[:, 1:], env.ramping)
    elapsed = state["elapsed_steps"] + 1
    truncated = elapsed >= env._limit
    nxt = {_GAME_PREFIX + k: v for k, v in g.items()}
    nxt.update(elapsed_steps=elapsed, episode=state["episode"], rng_key=state["rng_key"], last_action=action,
               sticky_action=played)
    out = {"frame": env.game.observe(g), "reward": reward, "terminated": terminated, "truncated": truncated,
           "done": terminated | truncated}
    return nxt, out


def autoreset_step(
    env: _Settings, state: dict[str, torch.Tensor], action: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`advance`, then the finished envs restarted (their next episode): ``out`` gains what the envs act on
    next, ``frame_r``, ``reward_r`` (``0`` where an episode ended) and ``initial_r`` (a copy of ``done``). Pure and
    capturable: every env draws a fresh state, the finished ones take it."""
    nxt, out = advance(env, state, action)
    done = out["done"]
    fresh = restart(env, nxt, nxt["episode"] + 1)
    nxt = _where(done, fresh, nxt)
    out["frame_r"] = env.game.observe(_game_part(nxt))
    return nxt, _next_flags(out)


def _next_flags(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``out`` with the reward and ``initial_state`` of the observation the envs act on next."""
    out["reward_r"] = torch.where(out["done"], 0.0, out["reward"])
    out["initial_r"] = out["done"].clone()
    return out


def autoreset_step_sparse(
    env: _Settings, state: dict[str, torch.Tensor], action: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`autoreset_step` restarting the finished envs only (the same results): one host sync to find them, so
    for the CPU, where it saves the fresh states of the envs that go on."""
    nxt, out = advance(env, state, action)
    rows = torch.nonzero(out["done"]).squeeze(1)
    if rows.numel() == 0:
        out["frame_r"] = out["frame"]
        return nxt, _next_flags(out)
    fresh = restart(env, {k: v.index_select(0, rows) for k, v in nxt.items()}, nxt["episode"][rows] + 1)
    nxt = {k: v.index_put((rows,), fresh[k]) for k, v in nxt.items()}
    out["frame_r"] = out["frame"].index_put((rows,), env.game.observe(_game_part(fresh)))
    return nxt, _next_flags(out)


def random_start(env: _Settings, state: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """The envs of ``state``, just restarted, after a random start of at most ``n`` steps: env ``k`` plays ``r_k``
    uniformly random minimal-set actions, ``r_k`` uniform in ``{0, ..., n}``, while the others wait (an episode that
    ends meanwhile restarts). ``r_k`` and the actions are counter-based draws of the restarted episode
    (:data:`~rlstruct.envs._rng.START_SALT`'s stream, apart from the game's), so they depend on ``(seed, k,
    episode)`` only. One host sync (the longest start); a reset's cost, never a step's. Returns the state reached
    (env ``k``'s ``elapsed_steps`` is ``r_k`` where its episode did not end during the start).
    """
    zero = torch.zeros_like(state["episode"])
    key, episode = state["rng_key"], state["episode"].clone()
    r = (step_uniforms(key, episode, zero, 1, salt=START_SALT)[:, 0] * (n + 1)).to(torch.int64)
    step = autoreset_step if r.device.type != "cpu" else autoreset_step_sparse
    for t in range(int(r.max())):
        u = step_uniforms(key, episode, zero + (t + 1), 1, salt=START_SALT)[:, 0]
        nxt, _ = step(env, state, (u * len(env._action_set)).to(torch.int64))
        state = _where(r > t, nxt, state)
    return state


class MinAtarEnv(SimEnv):
    """``n_envs`` copies of one MinAtar game (``MinAtar/<Game>-v1``), stepped together by torch on one device.

    The semantics of minatar 1.0.x through its gymnasium ids: the game's minimal action set (action ``i`` is the
    set's ``i``-th full-set action), sticky actions (with probability ``sticky_action_prob`` the previous
    full-set action is played instead: minatar's ``Environment.act``), difficulty ramping, a time limit of
    ``max_episode_steps`` (truncation) and frames ``bool [B, 10, 10, C]`` in the reference's channel order. Every
    random draw (the reset's, the sticky action's, the game's) is counter-based: env ``k``'s episodes depend on
    ``(seed, k, episode)`` only, whatever ``n_envs``, the device or the other envs; each episode starts with the
    previous action ``0`` (the reference carries it over from the previous episode).

    Observations: ``frame`` ``bool [B, 10, 10, C]``, ``reward`` ``float32 [B]``, ``done``, ``terminated``,
    ``truncated``, ``initial_state`` (``bool [B]``), ``last_action`` (``int64 [B]``, minimal-set).

    On the CPU an auto-reset env moves to a compiled step (numba installed, the extra ``fast``) after
    :func:`~rlstruct.envs._jit.jit_after` env steps: one call per step, the same bits as the torch step (frames,
    rewards, flags, and the state after any number of steps); ``RLSTRUCT_JIT=0`` keeps the torch step. It writes
    the state in place (tensors nobody else was handed: after :meth:`graph_state`, the next step rebinds the env to
    new ones) and :meth:`step_into` writes the observations straight into a batcher's buffer. With ``compile=True``
    an auto-reset env on any device runs its whole step (the draws, the rules, the time limit, the restarts, both
    frames) as one graph of ``torch.compile``, with the torch step's bits; its first step compiles.

    Args:
        name: the game, gymnasium's (``"Breakout"``) or minatar's (``"breakout"``) name (see :data:`GAMES`).
        n_envs: number of envs (``>= 1``).
        device: where the state, the observations and the ids live.
        seed: an int in ``[0, 2**31)``.
        env_index: the global index of this env's first row: row ``j`` is env ``env_index + j`` of ``seed``, so
            that envs split over processes replay the episodes of the same envs in one process.
        autoreset: ``True``: a finished env restarts inside ``step``; ``False``: finished envs drop out until
            :meth:`reset`.
        max_episode_steps: truncation horizon; ``None`` for none (the ids' is 1000).
        sticky_action_prob: in ``[0, 1]``.
        ramping: difficulty ramping (the ids' default, ``True``).
        compile: fuse an auto-reset env's step with ``torch.compile`` (off by default on every device: the first
            step compiles, a cost a short run may not win back; an episodic env, whose running set changes shape,
            steps eagerly).
        random_start_steps: ``n >= 0``: at each :meth:`reset`, env ``k`` first plays ``r_k`` uniformly random
            actions, ``r_k`` uniform in ``{0, ..., n}`` (:func:`random_start`), so that the episodes of a game whose
            length is fixed (Freeway's 2,500 frames) end out of step across envs rather than all in one step. A
            training setting, as Atari's random no-op starts are: the reset's observation is where env ``k`` stands
            then, and its steps are the env's, not the agent's (a run does not count them); evaluation envs start
            without it (``0``, the default).

    Attributes:
        kernel: how a step runs: ``"jit"`` (the compiled CPU step), ``"compiled"`` (``compile=True``) or
            ``"torch"``.

    Raises:
        ValueError: an unknown game, ``n_envs``, ``max_episode_steps``, ``sticky_action_prob`` or
            ``random_start_steps`` out of range.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.

    >>> env = MinAtarEnv("Breakout", 2, seed=0, autoreset=True)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, obs["frame"].dtype, env.action_space
    (torch.Size([2, 10, 10, 4]), torch.bool, Discrete(3))
    >>> (nxt, _), (run, _) = env.step(DictTensor({"action": torch.tensor([0, 2])}))
    >>> nxt["reward"].tolist(), nxt["done"].tolist()
    ([0.0, 0.0], [False, False])
    """

    def __init__(
        self,
        name: str,
        n_envs: int,
        *,
        device: DeviceLike = "cpu",
        seed: int = 0,
        env_index: int = 0,
        autoreset: bool = False,
        max_episode_steps: int | None = 1000,
        sticky_action_prob: float = STICKY_ACTION_PROB,
        ramping: bool = True,
        compile: bool = False,
        random_start_steps: int = 0,
    ):
        check_sizes(n_envs, max_episode_steps)
        if isinstance(random_start_steps, bool) or not isinstance(random_start_steps, int) or random_start_steps < 0:
            raise ValueError(f"random_start_steps must be an int >= 0 (0: every env starts at its episode's start), "
                             f"got {random_start_steps!r}; pass e.g. random_start_steps=2500 for Freeway, one "
                             "episode's length")
        if not 0.0 <= float(sticky_action_prob) <= 1.0:
            raise ValueError(f"sticky_action_prob must be in [0, 1], got {sticky_action_prob!r}; minatar's is 0.1")
        self.game, minimal = game(name)
        keys = self._init_harness(n_envs, device=device, seed=seed, env_index=env_index, autoreset=autoreset)
        self.max_episode_steps = max_episode_steps
        self.sticky_action_prob = float(sticky_action_prob)
        self.ramping = bool(ramping)
        self.random_start_steps = random_start_steps
        self._limit = max_episode_steps if max_episode_steps is not None else 2**62
        self._action_set = torch.tensor(minimal, dtype=torch.int64, device=self.device)
        self.n_actions = len(minimal)
        self._discrete = True
        self.action_space = spaces.Discrete(self.n_actions)
        self._action_spec = ActionSpec(self.action_space, device=self.device)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(10, 10, len(self.game.channels)), dtype=bool)
        table = draw_table((0.0,) * self.game.n_reset_draws, (1.0,) * self.game.n_reset_draws)
        self._reset_table = type("DrawTable", (), {k: v.to(self.device) for k, v in table.items()})
        self._state = restart(self, {"rng_key": keys}, torch.full((n_envs,), -1, dtype=torch.int64,
                                                                   device=self.device))
        self._destinations = HostDestinations.of_frame(self.observation_space.shape, np.bool_, (), True, n_envs)
        # _own is the state dict whose tensors nobody else was handed, the one the numba step may write into.
        self._jit_step: Any = None
        self._own: dict[str, torch.Tensor] | None = None
        self._fused = fused(autoreset_step) if compile and self.autoreset else None
        if (self._fused is None and self.device.type == "cpu" and self.autoreset and jit_wanted()
                and has_kernels(self.game.name)):
            self._start_jit_countdown()

    @property
    def kernel(self) -> str:
        """How a step runs: ``"jit"``, ``"compiled"`` or ``"torch"`` (see the class docstring)."""
        if self._jit_step is not None:
            return "jit"
        return "torch" if self._fused is None else "compiled"

    def _move_to_jit(self) -> None:
        driver = jit_module(_DRIVER)
        if driver is not None:
            keys = driver.game_module(self.game.name).STATE_KEYS
            self._jit_step = driver.CompiledStep(self, tuple(_GAME_PREFIX + k for k in keys))

    # ------------------------------------------------------------------ contract
    def __repr__(self) -> str:
        mode = "autoreset" if self.autoreset else "episodic"
        return f"MinAtarEnv({self.game.name!r}, n_envs={self._n}, device={self.device}, seed={self.seed}, {mode})"

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Starts every env's next episode (see :meth:`VecEnv.reset <rlstruct.envs.VecEnv.reset>`), each after its
        random start with ``random_start_steps``; ``env_info`` is accepted for the contract (no per-env options)."""
        self._check_open()
        check_env_info(env_info, self._n)
        self._state = restart(self, self._state, self._state["episode"] + 1)
        if self.random_start_steps:
            self._state = random_start(self, self._state, self.random_start_steps)
        last = self._state["last_action"].clone()
        return self._reset_observation(self.game.observe(_game_part(self._state)), last)

    def _checked_action(self, action: DictTensor, n_rows: int, ids: torch.Tensor | None
                        ) -> tuple[torch.Tensor, np.ndarray | None]:
        return check_action(self, action, n_rows, ids)

    def _step_autoreset(self, a: torch.Tensor, a_host: np.ndarray | None) -> StepResult:
        if self._jit_step is not None:
            return self._jit_step_result(a_host)
        if self._fused is not None:
            step = self._fused
        else:
            step = autoreset_step if self.device.type != "cpu" else autoreset_step_sparse
        self._state, out = step(self, self._state, a)
        return self._autoreset_result(
            a, out["frame"], out["reward"], out["terminated"], out["truncated"], out["frame_r"], out["reward_r"],
            self._state["last_action"], done=out["done"], initial_r=out["initial_r"],
        )

    def _jit_step_result(self, a_host: np.ndarray) -> StepResult:
        n = self._n
        frames = torch.empty((2, n) + self.observation_space.shape, dtype=torch.bool)
        rewards = torch.empty((2, n), dtype=torch.float32)
        flags = torch.empty((8, n), dtype=torch.bool)
        last = torch.empty((2, n), dtype=torch.int64)
        nxt, run = ({"frame": frames[j], "reward": rewards[j], "done": flags[4 * j], "terminated": flags[4 * j + 1],
                     "truncated": flags[4 * j + 2], "initial_state": flags[4 * j + 3], "last_action": last[j]}
                    for j in range(2))  # fmt: skip
        self._step_into(a_host, {k: v.numpy() for k, v in nxt.items()}, {k: v.numpy() for k, v in run.items()})
        return (DictTensor._trusted(nxt), self._ids_all), (DictTensor._trusted(run), self._ids_all)

    def _step_into(self, a_host: np.ndarray, nxt: dict[str, np.ndarray], run: dict[str, np.ndarray]) -> None:
        """The numba step of every env: the state in place, the observations into the arrays ``nxt``, ``run``."""
        if self._state is not self._own:  # tensors someone else may hold: step on copies
            self._state = self._own = {k: v.clone(memory_format=torch.contiguous_format) for k, v in
                                       self._state.items()}
        self._jit_step(self._state, a_host, nxt, run)

    def writes_in_place(self) -> bool:
        """True for an auto-reset env on its compiled CPU step (``kernel == "jit"``): :meth:`step_into` then has it
        write both observations straight into the destinations."""
        return self._jit_step is not None

    def _step_episodic(self, ids: torch.Tensor, a: torch.Tensor, a_host: np.ndarray | None) -> StepResult:
        # The running envs step; the finished ones keep their last state.
        nxt, out = advance(self, {k: v.index_select(0, ids) for k, v in self._state.items()}, a)
        self._state = {k: v.index_put((ids,), nxt[k]) for k, v in self._state.items()}
        return self._episodic_result(ids, a, out["frame"], out["reward"], out["terminated"], out["truncated"],
                                     done=out["done"])

    # ----------------------------------------------------------------- state I/O
    def graph_state(self) -> dict[str, torch.Tensor] | None:
        """The env's state tensors by name (no copies) for an auto-reset env, ``None`` for an episodic one (see
        :meth:`VecEnv.graph_state <rlstruct.envs.VecEnv.graph_state>`); a step rebinds the env to new tensors."""
        return super().graph_state()

    def _graph_state(self) -> dict[str, torch.Tensor]:
        self._own = None  # the next step rebinds the env to new tensors
        return dict(self._state)

    def _set_graph_state(self, state: dict[str, torch.Tensor]) -> None:
        self._state = self._checked(state, copy=False)

    def get_state(self) -> DictTensor:
        """Everything needed to continue exactly, as a DictTensor of ``n_envs`` rows (copies): the game's tensors
        (keys ``game/<name>``), ``elapsed_steps``, ``episode``, ``rng_key`` (the RNG state), ``last_action``,
        ``sticky_action`` (the full-set action a sticky step repeats) and ``running`` (bool).

        Raises:
            EnvStateError: ``reset`` was never called, or the env is closed.
        """
        self._check_steppable("get_state")
        return DictTensor._trusted({**{k: v.clone() for k, v in self._state.items()}, "running": self._running()})

    def set_state(self, state: DictTensor) -> None:
        """Restores a state of :meth:`get_state`, possibly taken on another device or env of the same game; the env
        then continues exactly as the one it was taken from.

        Raises:
            TypeError: ``state`` is not a DictTensor.
            SpaceError: a key is missing, or has another per-row shape or dtype; or an auto-reset env is given a
                state where some env is not running.
            BatchSizeError: ``state`` does not have ``n_envs`` rows.
        """
        if not isinstance(state, DictTensor):
            raise TypeError(f"state must be a DictTensor from get_state(), got {type(state).__name__}")
        if state.n_elems() != self._n:
            raise BatchSizeError(
                f"state has {state.n_elems()} rows, this env has n_envs={self._n}; take the state from an env with "
                f"{self._n} envs or slice it with state.slice(0, {self._n})"
            )
        if "running" not in state:
            raise SpaceError("state lacks the key 'running'; pass the DictTensor returned by get_state()")
        running = state["running"].to(self.device)
        if self.autoreset and not bool(running.all()):
            raise SpaceError("an auto-reset env runs every env, got a state where some env is not running; "
                             "take the state from an auto-reset env")
        self._state = self._checked({k: v.to(self.device) for k, v in state.items() if k != "running"}, copy=True)
        self._resume(running)

    def _checked(self, state: dict[str, torch.Tensor], *, copy: bool) -> dict[str, torch.Tensor]:
        """``state`` checked against the env's own state (keys, per-row shapes, dtypes, device)."""
        mine = self._state
        if set(state) != set(mine):
            raise SpaceError(
                f"state must have the keys {sorted(mine)}, got {sorted(state)}; pass a state of this env's game"
            )
        for k, v in mine.items():
            s = state[k]
            if s.shape != v.shape or s.dtype != v.dtype:
                raise SpaceError(f"state[{k!r}] must be {v.dtype} {list(v.shape)}, got {s.dtype} {list(s.shape)}")
            if s.device != v.device:
                raise DeviceMismatchError(f"state[{k!r}] is on {s.device}, the env on {v.device}; move it there")
        return {k: state[k].clone() if copy else state[k] for k in mine}

