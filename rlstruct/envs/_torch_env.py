"""The base of the classic-control torch simulators: :class:`TorchVecEnv`, its stepper and its state I/O.

A :class:`TorchVecEnv` (on the harness every torch simulator shares, :class:`~rlstruct.envs._sim_env.SimEnv`) keeps
every env's state in one :class:`~rlstruct.envs._sim_kernels.SimState` (a few tensors on one device) and steps all
of them with the pure batched kernels of :mod:`rlstruct.envs._sim_kernels`, run by one of the steppers of
:mod:`rlstruct.envs._steppers`. Subclasses only describe one system: its reset distribution, its transition and its
observation, each a pure function of arrays written once against an array namespace ``xp``
(:mod:`rlstruct.envs._array_ops`).
"""

from __future__ import annotations

import abc
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from rlstruct._accel import accelerator_for
from rlstruct.devices import DeviceLike
from rlstruct.envs import _sim_kernels as kernels
from rlstruct.envs._actions import ActionSpec
from rlstruct.envs._base import (
    HostDestinations,
    StepResult,
    check_env_info,
    check_sizes,
)
from rlstruct.envs._jit import jit_kernels, jit_wanted
from rlstruct.envs._rng import draw_table, uniform_draws
from rlstruct.envs._sim_env import SimEnv
from rlstruct.envs._sim_io import check_action, check_graph_state, read_state, state_dict
from rlstruct.envs._sim_kernels import SimState
from rlstruct.envs._steppers import KINDS, HostViews, Stepper, make_stepper
from rlstruct.structures import DictTensor

__all__ = ["TorchVecEnv"]

# With compile=True on the CPU, batches up to this size draw fresh states for every env inside the fused step; larger
# ones draw for the finished envs only, outside it.
_FUSED_DENSE_MAX_ENVS = 2048

_PHYSICS_DTYPES = (torch.float64, torch.float32)


class _ClassDefault:
    """The default of ``max_episode_steps``: the simulator's :attr:`TorchVecEnv.default_max_episode_steps`."""

    def __repr__(self) -> str:
        return "default_max_episode_steps"


DEFAULT_MAX_EPISODE_STEPS = _ClassDefault()


class TorchVecEnv(SimEnv):
    """``n_envs`` copies of one system, stepped together by batched torch kernels on one device.

    Subclasses set the class attributes below and implement :meth:`_initial_physics`,
    :meth:`_transition` and :meth:`_frame` as pure functions of arrays against the namespace ``xp``
    they are given (no Python branch on values), which is what lets ``compile=True`` fuse a whole
    step and the CPU step run them on numpy.

    Observations (``B`` rows, keys in this order): ``frame`` ``float32 [B, obs_dim]``, ``reward``
    ``float32 [B]``, ``done`` ``bool [B]`` (``terminated | truncated``), ``terminated``, ``truncated``,
    ``initial_state`` (``bool [B]``), ``last_action`` (``int64 [B]`` for a discrete action space,
    ``float32 [B, *action_shape]`` otherwise). Observation tensors are freshly allocated and the env
    never writes into a tensor it has handed out (the ids of every auto-reset step are one cached
    ``arange``: read them, do not write into them). With the compiled CPU kernel, an auto-reset env
    writes in place: :meth:`step_into` has the kernel fill the given tensors (a batcher's buffer).

    Args:
        n_envs: number of envs (``>= 1``).
        device: where the state, the observations and the ids live.
        seed: an int in ``[0, 2**31)``; env ``k`` of ``seed`` replays the same episodes whatever ``n_envs`` and
            device.
        env_index: the global index of this env's first row: row ``j`` is env ``env_index + j`` of ``seed``, so
            that envs split over processes replay the episodes of the same envs in one process.
        autoreset: ``True``: every env always runs and a finished env restarts inside ``step``;
            ``False`` (episodic): finished envs drop out until :meth:`reset`.
        max_episode_steps: truncation horizon (gymnasium's ``TimeLimit``); ``None`` for none; by default the
            simulator's :attr:`default_max_episode_steps`.
        compile: fuse the step with ``torch.compile`` (off by default; the first steps compile).
        physics_dtype: ``torch.float64`` (the default: gymnasium's doubles, the oracle tests' 1e-5 agreement and
            the same bits on every device) or ``torch.float32``: half the state's memory traffic and the GPU's
            single-precision rate, for throughput on accelerators. The initial states are the float64 draws
            rounded; the trajectories then drift from the float64 ones within float32 rounding per step (and, as
            any perturbation of these chaotic systems, apart over long episodes). On the CPU a float32 env steps
            with the numpy kernels (the compiled kernels are float64).

    Attributes:
        kernel: how a step runs: ``"jit"`` (CPU, one compiled call per step: numba installed and compiled
            kernels for this simulator), ``"numpy"`` (CPU, the kernels on numpy views of the state),
            ``"torch"`` (accelerators, and a CPU with a test's fake accelerator: torch kernels, no host sync in the
            auto-reset step) or ``"compiled"`` (``compile=True``). The CPU kernels give the same bits.

    Raises:
        ValueError: ``n_envs`` or ``max_episode_steps`` is not a positive int, or ``env_index`` a negative one.
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.
        DeviceUnavailableError: ``device`` does not exist on this machine.

    >>> from rlstruct.envs import CartPole
    >>> env = CartPole(2, seed=0, autoreset=True)
    >>> _ = env.reset()
    >>> state = env.get_state()
    >>> state["physics"].shape, state["episode"].tolist(), state["running"].tolist()
    (torch.Size([2, 4]), [0, 0], [True, True])
    >>> CartPole(2, seed=7, autoreset=True).set_state(state)  # continues exactly as env would
    """

    # Set by subclasses.
    physics_names: tuple[str, ...] = ()
    reset_low: tuple[float, ...] = ()
    reset_high: tuple[float, ...] = ()
    n_actions: int | None = None
    action_shape: tuple[int, ...] = ()
    # Subclasses with compiled CPU steps (:mod:`rlstruct.envs._jit_kernels`): the kernels' name prefix, and
    # the names of the class constants the kernels read, in their order.
    _jit_name: str | None = None
    _jit_params: tuple[str, ...] = ()
    #: the truncation horizon when ``max_episode_steps`` is not given (gymnasium's for the same id)
    default_max_episode_steps: int | None = None

    def __init__(
        self,
        n_envs: int,
        *,
        device: DeviceLike = "cpu",
        seed: int = 0,
        env_index: int = 0,
        autoreset: bool = False,
        max_episode_steps: int | None | _ClassDefault = DEFAULT_MAX_EPISODE_STEPS,
        compile: bool = False,
        physics_dtype: torch.dtype = torch.float64,
    ):
        if max_episode_steps is DEFAULT_MAX_EPISODE_STEPS:
            max_episode_steps = self.default_max_episode_steps
        check_sizes(n_envs, max_episode_steps)
        if physics_dtype not in _PHYSICS_DTYPES:
            raise ValueError(
                f"physics_dtype must be torch.float64 or torch.float32, got {physics_dtype!r}; pass torch.float32 "
                "for single-precision physics"
            )
        self.physics_dtype = physics_dtype
        self._physics64 = physics_dtype == torch.float64
        keys = self._init_harness(n_envs, device=device, seed=seed, env_index=env_index, autoreset=autoreset)
        self.max_episode_steps = max_episode_steps
        self.compiled = bool(compile)
        self._discrete = self.n_actions is not None
        dev = self.device
        self._limit = max_episode_steps if max_episode_steps is not None else 2**62
        self._arrays_torch = SimpleNamespace()
        self._arrays_numpy = SimpleNamespace()
        # The draws stay float64 (the same uniform values whatever the physics dtype, rounded by _draws).
        for name, values in draw_table(self.reset_low, self.reset_high).items():
            self._add_array(name, values, physics=False)
        if dev.type == "cpu":
            self._arrays_numpy.draw_salt_u32 = self._arrays_numpy.draw_salt.astype(np.uint32)
        self._state = SimState(
            physics=torch.zeros(len(self.physics_names), n_envs, dtype=physics_dtype, device=dev),
            elapsed_steps=torch.zeros(n_envs, dtype=torch.int64, device=dev),
            episode=torch.full((n_envs,), -1, dtype=torch.int64, device=dev),
            rng_key=keys,
            last_action=self._zero_actions(n_envs),
        )
        self._setup()
        self._action_spec = ActionSpec(self.action_space, device=dev)
        self._destinations = HostDestinations.of_frame(
            self.observation_space.shape, np.float32, self.action_shape, self._discrete, n_envs
        )
        # The host steppers' numpy views of the state, shared by every stepper the env moves through.
        self._host = HostViews()
        self._stepper: Stepper
        # A CPU with an accelerator (a test's recording fake, rlstruct._accel.installed) steps as an accelerator
        # does, so that the fake's graphs replay the torch kernels a CUDA graph captures.
        on_cpu = dev.type == "cpu" and accelerator_for(dev) is None
        if compile:
            self._use_kernels("compiled", sparse=on_cpu and n_envs > _FUSED_DENSE_MAX_ENVS)
        elif on_cpu and self._physics64 and self._jit_name is not None and jit_wanted():
            self._use_kernels("numpy")
            self._start_jit_countdown()
        else:
            self._use_kernels("numpy" if on_cpu else "torch")

    @property
    def kernel(self) -> str:
        """How a step runs: ``"jit"``, ``"numpy"``, ``"torch"`` or ``"compiled"`` (see the class docstring)."""
        return self._stepper.kind

    def _move_to_jit(self) -> None:
        if jit_kernels() is not None:
            self._use_kernels("jit")

    def _use_kernels(self, kind: str, *, sparse: bool = False) -> None:
        """Makes the steps run the stepper ``kind`` (one of :attr:`kernel`'s values); ``sparse`` (``"torch"`` and
        ``"compiled"``): draw fresh initial states for the finished envs only."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        module = jit_kernels() if kind == "jit" else None
        if kind == "jit" and (module is None or self._jit_name is None or not self._physics64):
            raise ValueError(
                f"{type(self).__name__} has no compiled kernels here (numba missing or disabled, or float32 physics)"
            )
        self._stepper = make_stepper(kind, self, self._host, sparse=sparse, jit_module=module)


    def _add_array(self, name: str, values: torch.Tensor, *, physics: bool = True) -> None:
        """Registers a constant array of the kernels, read as ``self._arrays(xp).<name>``; ``physics``: a floating
        array in the physics dtype (so that it does not widen float32 physics)."""
        if physics and values.is_floating_point():
            values = values.to(self.physics_dtype)
        t = values.to(self.device)
        setattr(self._arrays_torch, name, t)
        if self.device.type == "cpu":
            setattr(self._arrays_numpy, name, t.numpy())

    def _arrays(self, xp: type) -> SimpleNamespace:
        return self._arrays_numpy if xp.is_numpy else self._arrays_torch

    def _as_physics(self, xp: type, x: Any) -> Any:
        """``x`` in the physics dtype (a hook's explicit widening to float64 is a rounding to float32 with
        ``physics_dtype=torch.float32``)."""
        return xp.float64(x) if self._physics64 else xp.float32(x)

    def _draws(self, xp: type, key: Any, episode: Any) -> Any:
        """The uniform reset draws ``[D, B]`` of episodes ``episode`` of the envs with keys ``key``
        (:func:`~rlstruct.envs._rng.uniform_draws`, float64), in the physics dtype."""
        u = uniform_draws(key, episode, self._arrays(xp))
        return u if self._physics64 else xp.float32(u)

    # ------------------------------------------------------------ subclass hooks
    # The hooks below are pure functions of arrays, written once against the array namespace ``xp``
    # (:mod:`rlstruct.envs._array_ops`: torch or numpy): Python operators and ``xp.<name>`` only, no Python
    # branch on values. Each returns freshly allocated arrays (the step writes into them).
    @abc.abstractmethod
    def _setup(self) -> None:
        """Sets :attr:`action_space` and :attr:`observation_space` and registers the constant arrays of the hooks
        (:meth:`_add_array`); called once by ``__init__``, before the first step."""

    @abc.abstractmethod
    def _initial_physics(self, xp: type, u: Any) -> Any:
        """Reset states ``[P, B]`` from uniform draws ``[D, B]`` in ``(low, high)`` (both in the physics dtype)."""

    @abc.abstractmethod
    def _transition(self, xp: type, phys: Any, action: Any) -> tuple[Any, Any, Any]:
        """``(next physics [P, B] in the physics dtype, reward float32 [B], terminated bool [B])``."""

    @abc.abstractmethod
    def _frame(self, xp: type, phys: Any) -> Any:
        """The observation ``float32 [B, obs_dim]`` of states ``[P, B]``."""

    def _jit_inputs(self, phys: np.ndarray) -> tuple[np.ndarray, ...]:
        """The extra inputs of the compiled kernels for states ``phys float64 [P, B]``: the transcendental
        functions of the state, computed by torch (so that the compiled step gives the numpy kernels' bits)."""
        return ()

    # ------------------------------------------------------------------ contract
    def __repr__(self) -> str:
        mode = "autoreset" if self.autoreset else "episodic"
        return f"{type(self).__name__}(n_envs={self._n}, device={self.device}, seed={self.seed}, {mode})"

    def graph_state(self) -> dict[str, torch.Tensor] | None:
        """The tensors of the env's state, by name (a fresh dict of the env's own tensors, no copies), for an
        auto-reset env on any device; ``None`` for an episodic env, whose running set shrinks (a host sync and a
        shape change).

        Keys: ``physics`` ``float64 [P, n_envs]`` (one row per state variable), ``elapsed_steps``, ``episode``
        and ``rng_key`` ``int64 [n_envs]``, ``last_action``. A step reads them and rebinds the env to new
        tensors, as do :meth:`reset` and :meth:`set_state`: ask again after any of them. On the CPU the dict is
        returned too (the state round trip works there), though only a CUDA step can be captured: a batcher asks
        for ``cuda_graph`` on CUDA devices only.

        >>> from rlstruct.envs import CartPole
        >>> sorted(CartPole(2, autoreset=True).graph_state())
        ['elapsed_steps', 'episode', 'last_action', 'physics', 'rng_key']
        >>> CartPole(2, autoreset=False).graph_state() is None
        True
        """
        return super().graph_state()

    def _graph_state(self) -> dict[str, torch.Tensor]:
        return self._state._asdict()

    def _set_graph_state(self, state: dict[str, torch.Tensor]) -> None:
        check_graph_state(self._state, state)
        self._state = SimState(**state)
        # The host steppers' views are made again from these tensors at the next step (the uint32 copy of the key
        # included): a state written into them before that step is the one it reads.
        self._host.clear()

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Starts a new episode in every env (see :meth:`VecEnv.reset <rlstruct.envs.VecEnv.reset>`).

        Each call advances every env's episode counter, so a second ``reset`` draws new initial states (as
        gymnasium's ``reset()`` without a seed does); rebuild the env for a replay. ``env_info`` is accepted for
        the contract: these simulators have no per-env parameters.
        """
        self._check_open()
        check_env_info(env_info, self._n)
        self._state, frame = kernels.restart(self, self._state)
        return self._reset_observation(frame, self._zero_actions(self._n))

    def _checked_action(self, action: DictTensor, n_rows: int, ids: torch.Tensor | None
                        ) -> tuple[torch.Tensor, np.ndarray | None]:
        return check_action(self, action, n_rows, ids)

    def _step_autoreset(self, a: torch.Tensor, a_host: np.ndarray | None) -> StepResult:
        self._state, out = self._stepper.autoreset(self._state, a, a_host)
        return self._autoreset_result(
            a, out.frame, out.reward, out.terminated, out.truncated, out.frame_r, out.reward_r,
            self._state.last_action, done=out.done, initial_r=out.initial_r, false=out.false,
        )

    def _step_episodic(self, ids: torch.Tensor, a: torch.Tensor, a_host: np.ndarray | None) -> StepResult:
        self._state, out = self._stepper.episodic(self._state, ids, a, a_host)
        return self._episodic_result(ids, a, out.frame, out.reward, out.terminated, out.truncated, done=out.done)

    def _release(self) -> None:
        self._host.clear()

    def writes_in_place(self) -> bool:
        """True for an auto-reset env stepping with its compiled CPU kernel (``kernel == "jit"``): :meth:`step_into`
        then has the kernel write both observations straight into the destinations."""
        return self.autoreset and self._stepper.writes_in_place

    def _step_into(self, a_host: np.ndarray, nxt: dict, run: dict) -> None:
        self._state = self._stepper.step_into(self._state, a_host, nxt, run)

    # ----------------------------------------------------------- state I/O
    def get_state(self) -> DictTensor:
        """Everything needed to continue exactly, as a DictTensor of ``n_envs`` rows (copies).

        Keys: ``physics`` ``[n_envs, P]`` in the physics dtype (gymnasium's order, see :attr:`physics_names`),
        ``elapsed_steps`` ``int64``, ``episode`` ``int64`` and ``rng_key`` ``int64`` (the RNG
        state), ``last_action``, ``running`` ``bool`` (always all true for auto-reset envs).

        Raises:
            EnvStateError: ``reset`` was never called, or the env is closed.
        """
        self._check_steppable("get_state")
        return state_dict(self._state, self._ids, self._n)

    def set_state(self, state: DictTensor) -> None:
        """Restores a state from :meth:`get_state`, possibly taken on another device or env.

        The env then continues exactly as the one the state was taken from (with the same
        actions, the same observations), e.g. GPU envs seeded from a CPU state.

        Args:
            state: a DictTensor of ``n_envs`` rows with the keys of :meth:`get_state`, on any device.

        Raises:
            TypeError: ``state`` is not a DictTensor.
            SpaceError: a key is missing or has the wrong shape or dtype, or an auto-reset env is
                given a state where some env is not running.
            BatchSizeError: ``state`` does not have ``n_envs`` rows.
        """
        self._state, running = read_state(self, state)
        self._resume(running)

    def _zero_actions(self, n: int) -> torch.Tensor:
        if self.n_actions is not None:
            return torch.zeros(n, dtype=torch.int64, device=self.device)
        return torch.zeros((n,) + self.action_shape, dtype=torch.float32, device=self.device)
