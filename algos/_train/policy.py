"""A trained policy in one line: :func:`load` reads a run's checkpoint into a :class:`Policy`, whose
:meth:`~Policy.predict` maps observations (numpy or torch, one or a batch) to actions, outside any batcher.

The policy is the run's evaluation agent (the one ``rlstruct eval`` runs), rebuilt from the checkpoint's config and
weights, its observation normalisation included.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlstruct.agents import RL_Agent
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, load_checkpoint, stepped_backend
from rlstruct.algos._train.config import set_torch_threads
from rlstruct.algos._train.evaluation import check_model_fits, evaluate_checkpoint, evaluation_agent
from rlstruct.algos._train.registry import check_run_code, saved_algorithm
from rlstruct.algos._train.seeds import evaluation_seeds
from rlstruct.devices import DeviceLike, as_device, check_device_exists
from rlstruct.errors import SpaceError
from rlstruct.structures import DictTensor

__all__ = ["Policy", "load"]


def load(run_or_checkpoint: str | os.PathLike, *, device: DeviceLike = "cpu",
         torch_threads: int | None = None, trust_code: bool = False) -> Policy:
    """The trained policy of a run: its log folder (``--logdir``) or its ``checkpoint.pt``.

    A run folder may come from anywhere (a colleague's, a paper's), so the code it names (its algorithm's module, its
    network factory, its env's module) is imported only when it is rlstruct's or an installed package's, outside the
    run's folder and not provided by the current folder (:func:`~rlstruct.algos._train.registry.check_run_code`);
    ``trust_code=True`` imports the run's own code as well, as ``transformers``' ``trust_remote_code`` does.

    Args:
        run_or_checkpoint: a run's folder, or a checkpoint written by ``train``.
        device: where the policy's network runs.
        torch_threads: torch's threads during each :meth:`~Policy.predict` call, the previous count restored after
            it (0: torch's count as the process has it); ``None``: the run's ``torch_threads``, what ``rlstruct
            train`` gave its learner (1 unless ``--torch-threads``).
        trust_code: import the code the run names also when it is neither rlstruct's nor an installed package's (it
            runs in this process); only for a run whose code you trust.

    Raises:
        CheckpointError: there is nothing at the path, a folder without a ``checkpoint.pt``, a file that is not an
            rlstruct checkpoint, or one whose weights do not fit its config.
        DeviceUnavailableError: ``device`` does not exist here.
        UntrustedCodeError: the run names code that is not trusted (the message names the setting and the module),
            and not ``trust_code``.
        ValueError: ``torch_threads`` is not an int >= 0.

    >>> load("no/such/run")
    Traceback (most recent call last):
    ...
    rlstruct.errors.CheckpointError: run_or_checkpoint='no/such/run' does not exist; pass the checkpoint.pt of an \
earlier run, or its log folder (the --logdir it was trained with)
    """
    path = os.fspath(run_or_checkpoint)
    check_device_exists(device, argument="device")
    if torch_threads is not None and (not isinstance(torch_threads, int) or isinstance(torch_threads, bool)
                                      or torch_threads < 0):
        raise ValueError(f"torch_threads must be an int >= 0 or None (the run's), got {torch_threads!r}; pass e.g. 1")
    checkpoint = load_checkpoint(path, argument="run_or_checkpoint")
    check_run_code(checkpoint, path, trust_code=trust_code)
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_NAME)
    return Policy(checkpoint, path, device=device, torch_threads=torch_threads, trust_code=trust_code)


def _at_policy_threads(predict: Callable[..., Any]) -> Callable[..., Any]:
    """Runs ``predict`` with torch at the policy's :attr:`~Policy.torch_threads`, restoring the process's count after
    it: a library call leaves the caller's setting as it found it (the switch costs microseconds, see
    docs/benchmarks/predict.md)."""

    @functools.wraps(predict)
    def at_threads(self: Policy, *args: Any, **kwargs: Any) -> Any:
        previous = set_torch_threads(self.torch_threads)
        try:
            return predict(self, *args, **kwargs)
        finally:
            set_torch_threads(previous)

    return at_threads


class Policy:
    """The evaluation agent of a saved run, acting on observations given by hand.

    Built by :func:`load`. :meth:`predict` follows Stable-Baselines3's ``predict``: the action of one observation
    ``[*obs]`` or of a batch ``[N, *obs]``, as the same kind (numpy in, numpy out; torch in, torch out on the
    input's device) and the same batching. A recurrent policy (an LSTM run) also takes and returns its memory:
    ``predict(obs, state=state) -> (action, state)``, ``state=None`` starting fresh episodes; a stateless policy
    returns the action alone.

    Each :meth:`predict` call runs with torch at :attr:`torch_threads` threads and restores the process's count
    after it: one small network's forward pass is fastest on one thread, and torch's default (one thread a core)
    spins threads that fight whatever else the machine runs.

    Attributes:
        algo: the algorithm that trained it, e.g. ``"ppo"``.
        config: the run's config, as plain types.
        spec: the env's description (observation shape and dtype, actions).
        backend: the env backend the run stepped, which :meth:`evaluate` steps.
        path: the checkpoint file.
        device: where the network runs.
        recurrent: whether :meth:`predict` takes and returns a state.
        torch_threads: torch's threads during :meth:`predict` (0: the process's count), by default the run's
            ``torch_threads``.
        trust_code: whether :meth:`evaluate` imports the run's code when it is not trusted (:func:`load`'s).
    """

    def __init__(self, checkpoint: dict[str, Any], path: str, *, device: DeviceLike = "cpu",
                 torch_threads: int | None = None, trust_code: bool = False):
        self.algo: str = checkpoint["algo"]
        #: where the algorithm came from: its name, or ``"module:ATTRIBUTE"`` of one from outside the package
        self.source: str = saved_algorithm(checkpoint)
        self.config: dict[str, Any] = checkpoint["config"]
        self.spec = EnvSpec.from_dict(checkpoint["env_spec"])
        self.backend: str = stepped_backend(checkpoint)
        self.path = path
        self.device = as_device(device)
        self._weights = checkpoint["model"]
        self._create, self._args, greedy = evaluation_agent(self.source, self.config, self.spec,
                                                            str(self.device), policy="greedy")
        check_model_fits(self._create, self._args, self._weights, path)
        self._infos = {True: greedy, False: evaluation_agent(self.source, self.config, self.spec, policy="sample")[2]}
        self.agent: RL_Agent = self._create(**self._args)
        self.agent.update(self._weights)
        self.recurrent = bool(self.config.get("recurrent", False))
        self.torch_threads: int = (int(self.config.get("torch_threads", 1)) if torch_threads is None
                                   else torch_threads)
        self.trust_code = trust_code

    def __repr__(self) -> str:
        return f"Policy(algo={self.algo!r}, env={self.config['env']!r}, path={self.path!r}, device='{self.device}')"

    def agent_info(self, n: int = 1, *, deterministic: bool = True) -> DictTensor:
        """The ``agent_info`` of :meth:`predict`'s ``deterministic`` for ``n`` envs (CPU, ``n`` rows): greedy, or
        acting as the run did at its end (a sample, or epsilon-greedy at its final epsilon)."""
        return DictTensor({k: v.expand(n).clone() for k, v in self._infos[deterministic].items()})

    def agent_factory(self) -> tuple[Callable[..., RL_Agent], dict[str, Any]]:
        """``(create_agent, agent_args)`` for :class:`~rlstruct.RL_Batcher`: the same agent, holding the run's
        weights from its start (no ``update`` needed), to run with :meth:`agent_info` as the batcher's
        ``agent_info``."""
        return _loaded_agent, {"create_agent": self._create, "agent_args": self._args, "weights": self._weights}

    def evaluation_seeds(self, seed: int, n_workers: int = 1) -> tuple[list[int], list[int]]:
        """The env seeds and agent seeds, one per worker, of the batcher :meth:`evaluate` (``rlstruct eval``) runs
        from ``seed`` over ``n_workers`` workers: a batcher of the run's evaluation envs seeded so plays the episodes
        it plays, one per env."""
        return evaluation_seeds(seed, n_workers)

    def evaluate(self, *, episodes: int = 16, seed: int = 12345, deterministic: bool = True, n_processes: int = 0,
                 max_steps: int | None = None) -> dict[str, Any]:
        """Runs ``episodes`` episodes of the run's env (:func:`~rlstruct.algos._train.evaluation.evaluate_checkpoint`,
        what ``rlstruct eval`` runs) on :attr:`device`.

        Returns:
            ``{"eval_return", "return_min", "return_max", "episodes", "policy", "env", "algo", "checkpoint"}``.
        """
        return evaluate_checkpoint(self.path, episodes=episodes, device=str(self.device), seed=seed,
                                   n_processes=n_processes, max_steps=max_steps,
                                   policy="greedy" if deterministic else "sample", trust_code=self.trust_code)

    def export(self, output: str | os.PathLike, *, format: str | None = None) -> str:
        """Writes the deterministic policy to ``output`` for onnxruntime (``format="onnx"``) or ``torch.jit.load``
        (``"torchscript"``; ``None``: by the suffix, ``.onnx`` or not), with the observation normalisation inside
        (see :mod:`~rlstruct.algos._train.export`); returns its path. What ``rlstruct export`` runs.

        The file takes ``observation [N, *obs]`` in the env's dtype and returns ``action``; a recurrent policy's also
        takes and returns its memory: ``(observation, h, c) -> (action, h, c)``, zeros at an episode's start.

        Raises:
            ValueError: an unknown ``format``, or a policy loaded on another device than the CPU.
            ConfigError: ``output`` is in a run's folder (:func:`~.run_folder.check_output`).
            MissingDependencyError: ONNX without the ``export`` extra.
        """
        from rlstruct.algos._train.export import export_policy

        if self.device.type != "cpu":
            raise ValueError(f"the policy must be loaded on the CPU to be exported, got device={str(self.device)!r}; "
                             "load the run with load(run) (device='cpu')")
        return str(export_policy(self.agent, self.spec, output, format=format, recurrent=self.recurrent))

    def initial_state(self, n: int = 1) -> DictTensor:
        """The state of ``n`` fresh episodes (empty for a stateless policy), on :attr:`device`."""
        return self.agent.initial_state(self.agent_info(n), n)

    @_at_policy_threads
    @torch.no_grad()
    def predict(self, observation: Any, deterministic: bool = True, *, state: DictTensor | None = None,
                episode_start: Any = None, seed: int | None = None) -> Any:
        """The action of ``observation``, of the kind and batching it comes in.

        Args:
            observation: ``[*obs]`` or ``[N, *obs]``, a numpy array (or a list) or a torch tensor; its values are
                the env's raw observations (the run's normalisation is applied here).
            deterministic: greedy (the mode, the mean, the argmax), or acting as the run did at its end: a sample,
                or epsilon-greedy at its final epsilon (DQN, PQN).
            state: a recurrent policy's memory from the previous call (``None``: fresh episodes); ``[N, ...]``.
            episode_start: with ``state``, the rows whose episode starts at this observation (their memory is
                reset), ``bool [N]`` or one bool, numpy or torch (``None``: none).
            seed: seeds the draws of this call and the next (``None``: the policy's generator goes on).

        Returns:
            The action (``int64`` for discrete actions, ``float32 [*action]`` within the bounds for continuous ones),
            ``[N, ...]`` for a batch; a recurrent policy returns ``(action, state)``.

        Raises:
            SpaceError: an observation whose shape is neither the env's nor a batch of it, of a dtype that does
                not convert to the env's, or holding NaN or infinite values.
            ValueError: ``state`` given to a stateless policy, or ``episode_start`` of another length than the batch.
        """
        numpy = not isinstance(observation, torch.Tensor)
        frame = self._frame(observation)
        batched = frame.dim() > len(self.spec.obs_shape)
        frames = (frame if batched else frame.unsqueeze(0)).to(self.device)
        n = frames.shape[0]
        if state is not None and not self.recurrent:
            raise ValueError(f"state is for recurrent policies, got a state for this stateless {self.algo} policy; "
                             "call predict(observation) without state")
        if seed is not None:
            self.agent.seed(seed)
        info = self.agent_info(n, deterministic=deterministic)
        fresh = state is None
        if fresh:
            state = self.agent.initial_state(info, n)
        if fresh or episode_start is None:
            starts = torch.full((n,), fresh, dtype=torch.bool, device=self.device)
        else:
            starts = torch.as_tensor(np.asarray(episode_start) if not isinstance(episode_start, torch.Tensor)
                                     else episode_start).to(self.device, torch.bool).flatten()
            if starts.shape[0] not in (1, n):
                raise ValueError(f"episode_start must hold one bool per observation ({n}), got "
                                 f"{starts.shape[0]} values; pass a bool [N] array, or one bool")
            starts = starts.expand(n)
        out, state = self.agent(state, DictTensor({"frame": frames, "initial_state": starts}), info)
        action = out["action"] if batched else out["action"][0]
        if numpy:
            action = action.cpu().numpy()
        elif isinstance(observation, torch.Tensor):
            action = action.to(observation.device)
        return (action, state) if self.recurrent else action

    def _frame(self, observation: Any) -> torch.Tensor:
        shape, dtype = self.spec.obs_shape, self.spec.obs_dtype
        expected = f"{shape} (one observation) or (N, {', '.join(map(str, shape))}) (a batch)"
        try:
            frame = observation if isinstance(observation, torch.Tensor) else torch.as_tensor(np.asarray(observation))
        except (TypeError, ValueError, RuntimeError) as e:
            raise SpaceError(f"observation must be an array of shape {expected} and dtype {dtype}, got "
                             f"{type(observation).__name__} ({e}); pass the env's observation") from e
        if tuple(frame.shape[-len(shape):]) != shape or frame.dim() not in (len(shape), len(shape) + 1):
            raise SpaceError(f"observation must have shape {expected} for {self.config['env']}, got "
                             f"{tuple(frame.shape)}; pass the env's observation, or a stack of them")
        want = getattr(torch, dtype)
        fits = (frame.dtype == want if not want.is_floating_point
                else frame.dtype.is_floating_point or (not frame.dtype.is_complex and frame.dtype != torch.bool))
        if not fits:
            raise SpaceError(f"observation must have dtype {dtype} for {self.config['env']}, got "
                             f"{str(frame.dtype).removeprefix('torch.')}; pass the env's observation as it comes")
        frame = frame.to(want)
        # A network maps NaN to some action without a word (an argmax of NaN is 0): refuse it here, where it is seen.
        finite = torch.isfinite(frame)
        if not bool(finite.all()):
            raise SpaceError(f"observation must hold finite values, got {int((~finite).sum())} NaN or infinite "
                             f"value(s) of {frame.numel()}; pass the env's observation (a NaN or an infinity comes "
                             "from the code that built it: a wrapper, a normalisation, a division)")
        return frame


def _loaded_agent(create_agent: Callable[..., RL_Agent], agent_args: dict[str, Any],
                  weights: dict[str, torch.Tensor]) -> RL_Agent:
    """``create_agent(**agent_args)`` holding ``weights`` (module level, so it pickles for worker processes)."""
    agent = create_agent(**agent_args)
    agent.update(weights)
    return agent
