"""rlstruct envs seen from gymnasium-based code (SB3, CleanRL, TorchRL): :func:`to_gymnasium` (an auto-reset
VecEnv as a gymnasium ``VectorEnv`` in ``SAME_STEP`` mode) and :func:`to_gymnasium_env` (a one-env VecEnv as a
plain ``gymnasium.Env``). The reverse direction is :class:`~rlstruct.envs.GymEnv`."""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rlstruct.envs._base import VecEnv
from rlstruct.envs._torch_env import TorchVecEnv
from rlstruct.envs.device_env import DeviceEnv
from rlstruct.errors import BridgeError, EnvStateError, SpaceError
from rlstruct.seeding import check_seed
from rlstruct.structures import DictTensor

__all__ = ["to_gymnasium", "to_gymnasium_env", "GymnasiumVectorEnv", "GymnasiumEnv", "BridgeError"]

Output = Literal["torch", "numpy"]
_OUTPUTS = ("torch", "numpy")
_OPTION_KEYS = ("env_info",)


# ------------------------------------------------------------------------------------------- helpers
def _check_vec_env(env: Any, fn: str) -> VecEnv:
    if not isinstance(env, VecEnv):
        raise TypeError(
            f"{fn} takes an rlstruct VecEnv (e.g. rlstruct.envs.CartPole(n, autoreset=True)), got "
            f"{type(env).__name__}; a gymnasium env needs no bridge"
        )
    return env


def _observation_keys(space: gym.Space) -> tuple[str, ...] | None:
    """The observation keys of a Dict space, or ``None`` when the observation is the ``frame`` key."""
    if isinstance(space, spaces.Dict):
        return tuple(space.spaces.keys())
    return None


def _env_info_from(options: dict[str, Any] | None) -> DictTensor | None:
    if options is None:
        return None
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
    unknown = [k for k in options if k not in _OPTION_KEYS]
    if unknown:
        hint = (
            " (partial resets are not needed: finished envs restart inside step)" if "reset_mask" in unknown else ""
        )
        raise BridgeError(
            f"reset options {unknown} are not supported{hint}; options may only hold 'env_info', "
            "a DictTensor of n_envs rows passed to the rlstruct env's reset(env_info)"
        )
    return options.get("env_info")


def _reset_env(env: VecEnv, seed: int | None, options: dict[str, Any] | None) -> tuple[DictTensor, int | None]:
    """Resets ``env`` for a gymnasium ``reset(seed=, options=)``: ``(observation, checked seed)``."""
    env_info = _env_info_from(options)
    if seed is None:
        obs, _ = env.reset(env_info)
        return obs, None
    seed = check_seed(seed)
    return _reseed(env, seed, env_info), seed


def _reseed(env: VecEnv, seed: int, env_info: DictTensor | None) -> DictTensor:
    """Puts ``env`` where a fresh ``type(env)(..., seed=seed)`` is after its first ``reset``; returns that observation.

    A torch simulator's RNG state is ``(rng_key, episode)`` per env, set at construction; ``set_state`` can
    replace it but not rewind the episode counter before the first reset, so the state is taken from a
    freshly built twin instead (one reset's worth of work, on the same device).
    """
    sim = env
    while isinstance(sim, DeviceEnv):
        sim = sim.env
    if not isinstance(sim, TorchVecEnv):
        raise BridgeError(
            f"reset(seed=...) can re-seed rlstruct's torch simulators only, got {type(sim).__name__}, which is "
            "seeded when built; build it with the seed you want (e.g. GymEnvInf(envs, seed=s)) and call reset() "
            "without a seed"
        )
    twin = type(sim)(
        sim.n_envs(), device=sim.device, seed=seed, autoreset=sim.autoreset, max_episode_steps=sim.max_episode_steps
    )
    obs, _ = twin.reset(env_info)
    sim.set_state(twin.get_state())
    return obs.to(env.device)


def _as_action(actions: Any, device: torch.device) -> torch.Tensor:
    if isinstance(actions, torch.Tensor):
        return actions
    # A contiguous numpy array is shared, not copied (the simulator copies what it keeps).
    return torch.as_tensor(np.ascontiguousarray(actions), device=device)


# ------------------------------------------------------------------------------------------- vector env
class GymnasiumVectorEnv(gym.vector.VectorEnv):
    """An auto-reset rlstruct :class:`~rlstruct.envs.VecEnv` as a gymnasium 1.x ``VectorEnv`` (``SAME_STEP``).

    Built by :func:`to_gymnasium`. With ``N = env.n_envs()`` and ``obs_shape`` the single observation shape:

    * ``reset(seed=None, options=None) -> (obs [N, *obs_shape], {})``. ``seed`` re-seeds a torch simulator
      in place: afterwards it replays exactly what ``type(env)(N, seed=seed, ...)`` would (env ``k``'s
      episodes depend on ``(seed, k)`` only). ``options`` may hold ``{"env_info": DictTensor}``.
    * ``step(actions [N, *action_shape]) -> (obs [N, *obs_shape], rewards [N], terminations [N],
      truncations [N], infos)``. ``obs[i]`` of an env that finished is the first observation of its next
      episode; its terminal observation is ``infos["final_obs"][i]`` and ``infos["_final_obs"][i]`` is
      ``True``. ``infos["final_info"]`` is ``{}`` (rlstruct envs have no per-env info), flagged by
      ``infos["_final_info"]``, as gymnasium's ``SyncVectorEnv`` does for envs that return empty infos.

    Outputs: with ``output="torch"``, observations, rewards (``float32``), terminations and truncations are the
    env's tensors, on its device, never copied to the host, and actions are taken as tensors on that device;
    ``infos["final_obs"]`` is a tensor ``[N, *obs_shape]`` whose rows are meaningful where ``infos["_final_obs"]``
    (``bool [N]``, on the env's device) is true, present on every step (deciding otherwise would read a tensor on
    the host). With ``output="numpy"``, a drop-in for CPU code with the dtypes of gymnasium's ``SyncVectorEnv``
    (observations of the space's dtype, ``float64`` rewards, ``bool`` flags), ``infos["final_obs"]`` is built as
    gymnasium builds it (an object array, ``None`` for the envs that did not finish), only on steps where some
    env finished.

    Attributes:
        env: the wrapped rlstruct env.
        output: ``"torch"`` or ``"numpy"``.
        device: the wrapped env's device.
        num_envs: ``N``.
        single_observation_space, single_action_space: the wrapped env's spaces.
        observation_space, action_space: the batched spaces (``gymnasium.vector.utils.batch_space``).
        metadata: ``{"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}``.

    >>> from rlstruct.envs import CartPole
    >>> envs = to_gymnasium(CartPole(4, seed=0, autoreset=True), output="numpy")
    >>> obs, infos = envs.reset(seed=1)
    >>> obs.shape, obs.dtype, envs.action_space
    ((4, 4), dtype('float32'), MultiDiscrete([2 2 2 2]))
    >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
    >>> rewards.dtype, terminations.dtype, envs.metadata["autoreset_mode"].name
    (dtype('float64'), dtype('bool'), 'SAME_STEP')
    """

    def __init__(self, env: VecEnv, *, output: Output = "torch"):
        env = _check_vec_env(env, "to_gymnasium")
        if output not in _OUTPUTS:
            raise BridgeError(f"output must be one of {list(_OUTPUTS)}, got {output!r}")
        if not env.autoreset:
            raise BridgeError(
                f"to_gymnasium needs an auto-reset env (gymnasium vector envs restart finished envs themselves), "
                f"got the episodic {env!r}; build it with autoreset=True, e.g. CartPole(n, autoreset=True) or "
                "make_env(name, n, autoreset=True)"
            )
        self.env = env
        self.output = output
        self.device = torch.device(env.device)
        self.num_envs = env.n_envs()
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = batch_space(env.observation_space, self.num_envs)
        self.action_space = batch_space(env.action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
        self._keys = _observation_keys(env.observation_space)
        self._numpy = output == "numpy"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r}, output={self.output!r})"

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Restarts every env; with ``seed``, re-seeds the simulator first.

        Args:
            seed: ``None`` (continue each env's random stream) or an int in ``[0, 2**31)``.
            options: ``None``, ``{}`` or ``{"env_info": DictTensor}`` (``n_envs`` rows, on the CPU).

        Returns:
            ``(obs [N, *obs_shape], {})``.

        Raises:
            SeedError: ``seed`` is not ``None`` or an int in ``[0, 2**31)``.
            BridgeError: a seed for an env that is not a torch simulator, or unknown options.
            EnvStateError: the env is closed.
        """
        self._check_open()
        obs, seed = _reset_env(self.env, seed, options)
        super().reset(seed=seed)
        return self._observation(obs), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Steps every env once; finished envs restart in the same step (``SAME_STEP``).

        Args:
            actions: ``[N, *action_shape]``: a tensor on the env's device, or a numpy array (copied to the
                device); integer dtype for a Discrete space, floating for a Box.

        Returns:
            ``(obs, rewards, terminations, truncations, infos)``, see the class docstring.

        Raises:
            EnvStateError: ``reset`` was never called, or the env is closed.
            BatchSizeError, SpaceError, DeviceMismatchError: ``actions`` does not fit (raised by the env).
        """
        self._check_open()
        a = _as_action(actions, self.device)
        (obs_next, _), (obs_running, _) = self.env.step(DictTensor._trusted({"action": a}))
        obs = self._observation(obs_running)
        if not self._numpy:
            done = obs_next["done"]
            infos = {
                "final_obs": self._observation(obs_next),
                "_final_obs": done,
                "final_info": {},
                "_final_info": done.clone(),
            }
            return obs, obs_next["reward"], obs_next["terminated"], obs_next["truncated"], infos
        rewards = obs_next["reward"].cpu().numpy().astype(np.float64)
        terminations = obs_next["terminated"].cpu().numpy()
        truncations = obs_next["truncated"].cpu().numpy()
        done = terminations | truncations
        infos: dict[str, Any] = {}
        if done.any():
            infos["final_obs"] = self._final_obs(self._observation(obs_next), done)
            infos["_final_obs"] = done
            infos["final_info"] = {}
            infos["_final_info"] = done.copy()
        return obs, rewards, terminations, truncations, infos

    def _observation(self, obs: DictTensor) -> Any:
        if self._keys is None:
            frame = obs["frame"]
            return frame.cpu().numpy() if self._numpy else frame
        if self._numpy:
            return {k: obs[k].cpu().numpy() for k in self._keys}
        return {k: obs[k] for k in self._keys}

    def _final_obs(self, terminal: Any, done: np.ndarray) -> np.ndarray:
        # gymnasium's format is one object per finished env, None elsewhere (np.empty fills object arrays
        # with None). fromiter stores each row view as one object, where a plain assignment would broadcast.
        final = np.empty(self.num_envs, dtype=object)
        rows = np.flatnonzero(done)
        if self._keys is None:
            final[rows] = np.fromiter(terminal[rows], dtype=object, count=len(rows))
        else:
            parts = {k: v[rows] for k, v in terminal.items()}
            final[rows] = np.fromiter(
                ({k: p[j] for k, p in parts.items()} for j in range(len(rows))), dtype=object, count=len(rows)
            )
        return final

    def _check_open(self) -> None:
        if self.closed:
            raise EnvStateError(f"{type(self).__name__} is closed; build a new one with to_gymnasium(env)")

    def close_extras(self, **kwargs: Any) -> None:
        """Closes the wrapped env (``close()`` itself is idempotent)."""
        self.env.close()

    def __enter__(self) -> GymnasiumVectorEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def to_gymnasium(env: VecEnv, *, output: Output = "torch") -> GymnasiumVectorEnv:
    """Wraps an auto-reset rlstruct env as a gymnasium 1.x ``VectorEnv`` (``AutoresetMode.SAME_STEP``).

    Args:
        env: an rlstruct :class:`~rlstruct.envs.VecEnv` built with ``autoreset=True`` (a torch simulator,
            :class:`~rlstruct.envs.GymEnvInf`, a :class:`~rlstruct.envs.DeviceEnv` over one of them...).
        output: ``"torch"`` (tensors on the env's device, no host copy per step) or ``"numpy"`` (numpy
            arrays with gymnasium's dtypes, a drop-in for CPU code).

    Returns:
        A :class:`GymnasiumVectorEnv` over ``env`` (``N = env.n_envs()`` sub-envs).

    Raises:
        TypeError: ``env`` is not an rlstruct VecEnv.
        BridgeError: ``env`` is episodic (``autoreset=False``), or ``output`` is unknown.

    >>> from rlstruct.envs import CartPole
    >>> envs = to_gymnasium(CartPole(3, seed=0, autoreset=True))
    >>> obs, infos = envs.reset(seed=0)
    >>> obs, rewards, terminations, truncations, infos = envs.step(torch.ones(3, dtype=torch.int64))
    >>> type(obs).__name__, tuple(obs.shape), rewards.tolist(), sorted(infos)
    ('Tensor', (3, 4), [1.0, 1.0, 1.0], ['_final_info', '_final_obs', 'final_info', 'final_obs'])
    """
    return GymnasiumVectorEnv(env, output=output)


# ------------------------------------------------------------------------------------------- single env
class GymnasiumEnv(gym.Env):
    """A one-env rlstruct :class:`~rlstruct.envs.VecEnv` as a plain ``gymnasium.Env`` (numpy in and out).

    Built by :func:`to_gymnasium_env`. ``reset(seed=, options=) -> (obs, {})`` and
    ``step(action) -> (obs, reward: float, terminated: bool, truncated: bool, {})`` with ``obs`` a numpy
    array of shape ``obs_shape`` (a dict of them for a Dict space) and ``action`` a scalar (Discrete) or an
    array of shape ``action_shape`` (Box). After an episode ends, call ``reset()``: an episodic env refuses
    to step further, an auto-reset one continues with its next episode.

    Each step reads the step's results on the host (gymnasium's API returns Python ``bool``/``float``), so
    this is for compatibility and checking (e.g. ``gymnasium.utils.env_checker.check_env``), not throughput:
    use :func:`to_gymnasium` for that.

    Attributes:
        env: the wrapped rlstruct env.
        observation_space, action_space: the wrapped env's spaces.

    >>> from rlstruct.envs import CartPole
    >>> env = to_gymnasium_env(CartPole(1))
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    >>> obs.shape, reward, terminated, truncated
    ((4,), 1.0, False, False)
    """

    metadata = {"render_modes": []}

    def __init__(self, env: VecEnv):
        env = _check_vec_env(env, "to_gymnasium_env")
        if env.n_envs() != 1:
            raise BridgeError(
                f"to_gymnasium_env wraps a single env, got n_envs={env.n_envs()}; build it with n_envs=1, "
                "or use to_gymnasium(env) for a gymnasium vector env"
            )
        self.env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self._device = torch.device(env.device)
        self._keys = _observation_keys(env.observation_space)
        self._action_shape = (1,) + tuple(env.action_space.shape or ())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Starts a new episode; with ``seed``, re-seeds the simulator first (see :class:`GymnasiumVectorEnv`).

        Args:
            seed: ``None`` (continue the env's random stream) or an int in ``[0, 2**31)``.
            options: ``None``, ``{}`` or ``{"env_info": DictTensor}`` (one row, on the CPU).

        Returns:
            ``(obs, {})``, ``obs`` of shape ``obs_shape``.

        Raises:
            SeedError: ``seed`` is not ``None`` or an int in ``[0, 2**31)``.
            BridgeError: a seed for an env that is not a torch simulator, or unknown options.
            EnvStateError: the env is closed.
        """
        obs, seed = _reset_env(self.env, seed, options)
        super().reset(seed=seed)
        return self._observation(obs), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Steps the env with one action (a scalar for Discrete, an array of ``action_shape`` for Box).

        Returns:
            ``(obs, reward, terminated, truncated, {})``: the observation reached (the terminal one when the
            episode ends), a ``float`` and two ``bool``.

        Raises:
            SpaceError: ``action`` does not have the action space's number of elements.
            EnvStateError: ``reset`` was never called, the env is closed, or an episodic env's episode is over.
        """
        a = _as_action(action, self._device)
        if a.numel() != int(np.prod(self._action_shape)):
            raise SpaceError(
                f"action must fit {self.action_space} (shape {self._action_shape[1:]}), got shape {list(a.shape)}; "
                "pass one action, e.g. env.action_space.sample()"
            )
        (obs_next, _), _ = self.env.step(DictTensor._trusted({"action": a.reshape(self._action_shape)}))
        # gymnasium's Env API returns Python scalars: one read on the host per step is inherent here.
        reward = float(obs_next["reward"].cpu().numpy()[0])
        terminated = bool(obs_next["terminated"].cpu().numpy()[0])
        truncated = bool(obs_next["truncated"].cpu().numpy()[0])
        return self._observation(obs_next), reward, terminated, truncated, {}

    def _observation(self, obs: DictTensor) -> Any:
        if self._keys is None:
            return obs["frame"][0].cpu().numpy()
        return {k: obs[k][0].cpu().numpy() for k in self._keys}

    def close(self) -> None:
        """Closes the wrapped env; idempotent."""
        self.env.close()


def to_gymnasium_env(env: VecEnv) -> GymnasiumEnv:
    """Wraps a one-env rlstruct env (episodic or auto-reset) as a plain ``gymnasium.Env``.

    Args:
        env: an rlstruct :class:`~rlstruct.envs.VecEnv` with ``n_envs() == 1``.

    Returns:
        A :class:`GymnasiumEnv` over ``env``: numpy observations, ``float`` rewards, ``bool`` flags.

    Raises:
        TypeError: ``env`` is not an rlstruct VecEnv.
        BridgeError: ``env`` has more than one env.

    >>> from gymnasium.utils.env_checker import check_env
    >>> from rlstruct.envs import Acrobot
    >>> check_env(to_gymnasium_env(Acrobot(1)), skip_render_check=True)
    """
    return GymnasiumEnv(env)
