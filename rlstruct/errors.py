"""The exceptions rlstruct raises on bad input or misuse.

Every user-facing error derives from :class:`RLStructError`, and also from the
built-in exception a user would naturally catch (``ValueError`` for bad
values, ``RuntimeError`` for a broken run), so that ``except ValueError``
keeps working in code written before rlstruct.

Messages name the argument, what was expected, what was received, and the fix.

One type per situation, whichever implementation raises it. For the envs (``GymEnv``, ``GymEnvInf``,
``DeviceEnv``, the torch simulators, the JAX envs ``JaxVecEnv``/``GymnaxEnv``/``MjxEnv``/``BraxEnv``,
``MujocoTorchEnv``, ``make_env`` for every backend (torch, gymnasium, envpool, ale, gymnax, mjx, mujoco_torch, brax),
and the gymnasium bridge ``to_gymnasium``/``to_gymnasium_env``):

==========================================================  =========================
situation                                                    type
==========================================================  =========================
``step`` (or ``step_into``) before ``reset``                 :class:`EnvStateError`
``step``/``reset`` after ``close``                           :class:`EnvStateError`
``step`` once every episodic env has finished                :class:`EnvStateError`
``step_into`` on an episodic env                             :class:`EnvStateError`
a seed that is not an int in ``[0, 2**31)``                  :class:`SeedError`
an unsupported observation or action space                   :class:`SpaceError`
an action that does not fit the action space (shape, dtype)  :class:`SpaceError`
an action out of range, or a NaN or infinite Box action      :class:`ActionRangeError`
not one action row per running env                           :class:`BatchSizeError`
a tensor on the wrong device                                 :class:`DeviceMismatchError`
==========================================================  =========================

For the batchers (``RL_Batcher``, ``RayBatcher``), checked at construction or at the start-up call of the agent:
repeated ``seeds``, :class:`ConfigError`; an instance (not a class or function) as ``create_agent`` or
``create_env``, or ``agent_args``/``env_args`` that are not dicts, ``TypeError``; an agent whose ``__call__`` does not
return ``(output, state)``, :class:`AgentOutputError`; ``execute``/``get`` out of order, :class:`BatcherStateError`; a
worker that fails, :class:`BatcherWorkerError`.

For the algorithms' runs: a path that is no readable rlstruct checkpoint (nothing there, a folder without a
``checkpoint.pt``, a file that cannot be read, is not a checkpoint, is a damaged one or holds NaN or infinite weights),
:class:`CheckpointError` from ``rlstruct.algos.load``, ``rlstruct eval``, ``rlstruct export`` and ``--resume`` alike;
a run's ``summary.json`` or ``config.json`` that ``rlstruct compare`` cannot read as a result, or a ``progress.csv``
that ``--resume`` cannot continue, :class:`RunRecordError`; a run folder another process writes,
:class:`RunFolderBusyError`; a file of a run folder that is a symbolic link, :class:`RunFileLinkError`; an
observation given to ``Policy.predict`` that does not fit the env's or holds NaN or infinite values,
:class:`SpaceError`; a disk-backed replay buffer (``--replay-storage disk``) that the disk has not
the room for, at setup or when its files grow, :class:`DiskSpaceError`; a batch given to a learner's update without a
key its loss reads, :class:`BatchKeyError`; a saved run opened without ``--trust-code`` that names code neither
rlstruct's nor an installed package's, :class:`UntrustedCodeError`.

A layer raises its own errors: an env never raises a batcher error (:class:`BatcherStateError` is the
batcher's call order only), and the bridge raises :class:`BridgeError` only for what gymnasium code asks
that the rlstruct env cannot honour; everything else comes from the env it wraps, unchanged.
"""

from __future__ import annotations

__all__ = [
    "RLStructError",
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "BatchSizeError",
    "SpaceError",
    "ActionRangeError",
    "SeedError",
    "EnvStateError",
    "BatcherWorkerError",
    "BatcherStateError",
    "BatcherWorkerTimeout",
    "AgentOutputError",
    "MissingDependencyError",
    "BridgeError",
    "GraphCaptureError",
    "ConfigError",
    "DiskSpaceError",
    "CheckpointError",
    "RunFinishedError",
    "RunFolderBusyError",
    "RunFileLinkError",
    "VideoError",
    "RankLostError",
    "AlgorithmSourceError",
    "UntrustedCodeError",
    "RunRecordError",
    "BatchKeyError",
]


class RLStructError(Exception):
    """Root of every exception raised by rlstruct."""


class DeviceMismatchError(RLStructError, ValueError):
    """A tensor is on another device than the one it must be on."""


class DeviceUnavailableError(RLStructError, ValueError):
    """A device was asked for that this machine does not have."""


class BatchSizeError(RLStructError, ValueError):
    """Tensors that must share their leading (batch or time) sizes do not, or a batch operation met a structure
    without a batch dimension (a DictTensor of 0-d tensors, a *record* such as a dict of losses)."""


class SpaceError(RLStructError, ValueError):
    """An env's space is not supported (e.g. a Tuple observation space), or an action or observation does not fit
    the env's space (shape or dtype). Raised at construction or at ``step`` by every env implementation alike."""


class ActionRangeError(SpaceError):
    """An action's values are outside its env's action space: a Discrete or MultiDiscrete action out of range, or a
    NaN or infinite Box action (finite Box actions go to the env as given, as gymnasium's own envs take them).

    Every env checks its actions at ``step``: at once on the CPU; on an accelerator the check is recorded on the
    device and read where the batcher synchronises anyway, the end of an acquisition, so the error names the step.
    The message names the key, the valid range, the offending values and the env ids, and the fix.
    """


class SeedError(RLStructError, ValueError):
    """A seed is not an int in ``[0, 2**31)`` (what every env backend, C ones included, accepts): negative, too
    large, or not an integer at all. Every env constructor, ``make_env`` and the bridge's ``reset(seed=...)``
    check seeds with :func:`rlstruct.seeding.check_seed`, so they all raise this type."""


class EnvStateError(RLStructError, RuntimeError):
    """An env method was called in a state where it cannot run (``step`` before ``reset``, ``step`` or ``reset``
    after ``close``, ``step`` once every episodic env has finished, or ``step_into`` on an episodic env). Raised
    by every :class:`~rlstruct.envs.VecEnv` implementation alike, and by the gymnasium bridge over them."""


class BatcherWorkerError(RLStructError, RuntimeError):
    """A batcher worker failed: it raised, died, or stopped answering.

    Attributes:
        worker_id: index of the failing worker (``-1`` when not known).
        remote_traceback: the traceback formatted in the worker, when it sent one.
    """

    def __init__(self, message: str, worker_id: int = -1, remote_traceback: str | None = None):
        super().__init__(message)
        self.worker_id = worker_id
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (type(self), (self.args[0], self.worker_id, self.remote_traceback))


class BatcherWorkerTimeout(BatcherWorkerError):
    """A batcher worker did not answer within the batcher's ``timeout`` (hung in its env or agent, or an acquisition
    longer than the timeout allows). A :class:`BatcherWorkerError`, so that code catching that keeps working."""


class AgentOutputError(RLStructError, TypeError):
    """An agent's ``__call__`` returned something other than ``(output, new_state)``, two DictTensors (e.g. a bare
    tensor, or the output without the state). Checked once, at the batcher's first call of the agent; a worker
    process's check reaches the batcher as this type too."""


class BatcherStateError(RLStructError, RuntimeError):
    """A batcher method was called in a state where it cannot run (e.g. ``get`` with nothing pending)."""


class MissingDependencyError(RLStructError, ImportError):
    """An optional dependency is needed for this feature; the message names the extra to install."""


class BridgeError(RLStructError, ValueError):
    """An rlstruct env cannot be exposed to gymnasium code as asked (episodic env, seed or options it cannot honour)."""


class GraphCaptureError(RLStructError, RuntimeError):
    """A step could not be captured in a CUDA graph (``cuda_graph=True``): the env or agent synchronizes with the
    host, changes shapes, or keeps its state where a replay cannot see it."""


class ConfigError(RLStructError, ValueError):
    """Settings that are valid one by one but cannot work together (e.g. ``compile_update`` with a recurrent
    policy, ``cuda_graph`` with a CPU batcher, weight sharing with worker processes)."""


class DiskSpaceError(ConfigError, OSError):
    """The disk has not the room that the settings need (the files of a disk-backed replay buffer), found when the
    run is set up or when a file is made: a :class:`ConfigError` (the settings cannot work on this disk) and an
    ``OSError``."""


class CheckpointError(RLStructError, ValueError):
    """A path given as a run or a checkpoint is not one: nothing is there, a folder without a ``checkpoint.pt``, a
    file that cannot be read or is not an rlstruct checkpoint, or one whose weights do not fit its config or hold NaN
    or infinite values (a run that diverged)."""


class RunFinishedError(ConfigError):
    """``--resume`` names a run that finished (its budget spent, its target reached, its time limit reached) and
    the new settings give it nothing more to do: resuming it would only change its record. ``rlstruct train``
    answers it with one line and exit status 0, leaving the run as it is."""


class RunFolderBusyError(ConfigError):
    """A run's folder is being written by another process (a ``--resume`` of it, or the run itself, alive): one
    writer per run folder, held by an exclusive lock for the run's whole life. The message names the holder (its PID,
    host and start time) and what to do."""


class RunFileLinkError(ConfigError):
    """A file or folder that a run writes in its run folder (``config.json``, ``progress.csv``, the checkpoint,
    ``summary.json``, ``run.lock``, their ``.partial`` files, ``videos``, ``replay``...) is a symbolic link: writing
    it would write the link's target, wherever it points. Run folders are copied between machines and users, so a
    run never writes through a link; the message names the file and says to remove the link."""


class VideoError(RLStructError, ValueError):
    """A video cannot be recorded as asked: the env's backend has no ``rgb_array`` frames, or the video path's
    suffix names a format rlstruct does not write (``.mp4`` and ``.gif`` are the ones it does)."""


class RankLostError(RLStructError, RuntimeError):
    """A collective of a data-parallel run (``torchrun``) failed on this rank: another rank died, left, or did not
    answer within the run's timeout (``batcher_timeout``). Every surviving rank raises it instead of waiting for
    the lost one; that rank's own output says why it stopped.

    Attributes:
        rank: this rank.
        world_size: the ranks of the run.
    """

    def __init__(self, message: str, rank: int = -1, world_size: int = -1):
        super().__init__(message)
        self.rank, self.world_size = rank, world_size

    def __reduce__(self):
        return (type(self), (self.args[0], self.rank, self.world_size))


class AlgorithmSourceError(RLStructError, ValueError):
    """An algorithm named by ``rlstruct train NAME``, ``MODULE:ATTRIBUTE``, an entry point of the
    ``rlstruct.algorithms`` group, or a saved run cannot be had: no such algorithm, a module that is not importable
    (the message names it) or that fails as it imports, an attribute that is missing or is no algorithm description,
    or a description that takes a built-in algorithm's name."""


class UntrustedCodeError(ConfigError):
    """Opening a saved run (``rlstruct eval``, ``export``, ``train --resume``, ``rlstruct.algos.load``) would import
    code the run names (its algorithm's module, its network or env factory) that is neither rlstruct's nor an
    installed package's (a module in the run's folder or the current folder, on ``PYTHONPATH``, or Python's own), and
    the caller did not pass ``--trust-code`` (``trust_code=True``); or a factory a setting names is not one (a
    built-in function such as ``os:system``, a callable of another package than the module named). The message
    names the setting, the module and the flag."""


class RunRecordError(RLStructError, ValueError):
    """A run folder's record cannot be read: its ``summary.json`` (or ``config.json``) is not a JSON object, a
    finished run's ``eval_return`` is missing, not a number or not finite, or the ``progress.csv`` a ``--resume``
    continues has no header, a cell that is not a number, or an iteration's row twice. The message names the file
    (and the row and column)."""


class BatchKeyError(RLStructError, KeyError):
    """A loss was given a batch without a key it reads (the keys a loss declares with
    ``rlstruct.algos.harness.reads``, as TorchRL's losses declare their ``in_keys``). The message names the
    missing key, the loss and the keys the batch holds.

    Attributes:
        key: the first missing key.
    """

    def __init__(self, message: str, key: str = ""):
        super().__init__(message)
        self.key = key

    def __str__(self) -> str:  # KeyError's own shows the message as a repr, quotes and escapes included
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.args[0], self.key))
