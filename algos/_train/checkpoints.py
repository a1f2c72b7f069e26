"""What a training run leaves behind, its checkpoint and its learning-curve plot, and how a run resumes from it.

A checkpoint holds the policy's weights (what ``rlstruct eval`` runs) and what the learner needs to continue
(``iteration``, ``env_steps`` and ``learner``: the optimizers' state dicts and the algorithm's own state, e.g.
DQN's target network); :func:`load_resume` reads it back for ``rlstruct train ALGO --resume RUN`` and checks
that the new command builds the same networks on the same data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import math
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.algos._optim import OptimizerLike
from rlstruct.algos._train.config import resume_fields
from rlstruct.algos._train.durable import write_whole
from rlstruct.algos._train.finite import check_finite_checkpoint
from rlstruct.devices import cpu_state_dict, tree_copy
from rlstruct.envs.factory import resolve_backend
from rlstruct.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.algos._train.config import RunConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "Resume",
    "check_digest",
    "check_resume_algorithm",
    "content_digest",
    "does_not_fit",
    "load_checkpoint",
    "load_resume",
    "load_state",
    "restore_optimizer",
    "save_checkpoint",
    "stepped_backend",
]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "rlstruct-checkpoint-1"
#: the checkpoint's file name in a run's log folder
CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path: str | os.PathLike, algo: str, config: RunConfig, spec: EnvSpec, model: nn.Module,
                    extra: dict[str, Any] | None = None) -> str:
    """Writes ``{format, algo, config, env_spec, model, **extra, digest}`` of plain types and CPU tensors.

    It loads with ``torch.load(path, weights_only=True)``; ``extra``'s tensors are moved to the CPU
    (:func:`~rlstruct.devices.tree_copy`); ``digest`` is :func:`content_digest` of the rest, which
    :func:`load_checkpoint` checks. The file is written whole (:func:`~.durable.write_whole`): a process killed (or
    a machine that loses power) while writing leaves the previous checkpoint whole; never through a symbolic link
    (:class:`~rlstruct.errors.RunFileLinkError`). It is serialized in memory first, so that a full or read-only disk
    is the ``OSError`` of the write that failed, naming the file (``torch.save`` gives a ``RuntimeError`` of its
    stream's own).
    """
    data = {
        "format": CHECKPOINT_FORMAT,
        "algo": algo,
        "config": config.to_dict(),
        # The simulator the run stepped: what its "auto" came to, which a later release may resolve otherwise.
        "backend": resolve_backend(config.env, config.backend),
        "env_spec": dataclasses.asdict(spec),
        "model": cpu_state_dict(model),
        **tree_copy(extra or {}),
    }
    data[DIGEST_KEY] = content_digest(data)
    serialized = io.BytesIO()
    torch.save(data, serialized)
    write_whole(path, serialized.getbuffer())
    return str(path)


#: the key of a checkpoint's digest (:func:`content_digest`), the last one written
DIGEST_KEY = "digest"


def content_digest(data: Any) -> str:
    """The ``"sha256:..."`` digest of a checkpoint's content: its keys and plain values in order, and each tensor's
    dtype, shape and bytes (``data``'s ``digest`` key aside).

    It is taken over the content rather than the file's bytes, so that it is written inside the file that
    ``torch.load(weights_only=True)`` reads, and every change to what a load returns (a weight, a counter, a key)
    changes it: ``torch.load`` does not check the zip's CRCs, so a flipped bit in a weight loads silently.

    >>> a = content_digest({"w": torch.zeros(2), "n": 1})
    >>> a == content_digest({"w": torch.zeros(2), "n": 1}), a == content_digest({"w": torch.ones(2), "n": 1})
    (True, False)
    """
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(x.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            h.update(f"D{len(x)}".encode())
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__[0]}{len(x)}".encode())
            for v in x:
                walk(v)
        else:  # str, int, float (repr round-trips), bool, None
            h.update(f"{type(x).__name__}:{x!r};".encode())

    walk({k: v for k, v in data.items() if k != DIGEST_KEY})
    return f"sha256:{h.hexdigest()}"


def check_digest(data: dict[str, Any], shown: str) -> None:
    """Checks a loaded checkpoint's content against the digest written with it (:func:`content_digest`);
    ``shown`` names the file in the message. A checkpoint written before digests were (no ``digest``) passes.

    Raises:
        CheckpointError: the content differs from the digest: the file changed after it was written.
    """
    expected = data.get(DIGEST_KEY)
    if expected is None:
        log.debug("%s has no digest (written by an earlier rlstruct): its content is not checked", shown)
        return
    if content_digest(data) != expected:
        raise CheckpointError(f"{shown} is damaged: its content does not match the digest written with it (the file "
                              "changed on disk or in a copy after it was written); restore it from a copy, or resume "
                              "from another checkpoint")


def _torch_archive(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` is a zip archive that ``torch.save`` wrote (its local headers hold its
    ``data.pkl``), whatever its zip directory at the end holds."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") and b"/data.pkl" in head


def _zip_damage(path: str | os.PathLike) -> str | None:
    """What is damaged in the zip archive at ``path`` that ``torch.save`` wrote: an entry whose bytes do not match
    its CRC, or a zip directory that cannot be read; ``None`` when nothing is, or when it is no such archive."""
    try:
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
    except OSError:  # unreadable: the caller says so
        return None
    except Exception as e:  # a damaged directory raises what its flipped bits say: a bad zip, an unsupported
        # compression or version (NotImplementedError), an entry marked encrypted (RuntimeError)...
        if not _torch_archive(path):
            return None
        reason = (str(e).strip().splitlines() or [""])[0]
        return f"its zip directory cannot be read ({type(e).__name__}: {reason})"
    return None if damaged is None else f"its entry {damaged} does not match its CRC"


def _check_crc(path: str | os.PathLike, argument: str, cause: BaseException | None = None) -> None:
    """Raises :class:`~rlstruct.errors.CheckpointError` when an entry of the checkpoint's zip does not match its CRC
    (``torch.load`` does not check them) or its zip directory cannot be read; with ``cause`` (``torch.load`` failed),
    also when the file is an archive ``torch.save`` wrote."""
    damage = _zip_damage(path)
    if damage is None and cause is not None and _torch_archive(path):
        damage = f"torch.load cannot read it ({type(cause).__name__})"
    if damage is not None:
        raise CheckpointError(f"{argument}={os.fspath(path)!r} is damaged: {damage} (the file changed on disk or in a "
                              "copy after it was written); restore it from a copy, or resume from another checkpoint"
                              ) from cause


#: what every checkpoint holds, and the type of each
CHECKPOINT_KEYS = {"algo": str, "config": dict, "env_spec": dict, "model": dict}
#: the settings of a checkpoint's config that evaluating it needs
CONFIG_KEYS = ("env", "backend", "hidden_sizes")


def load_checkpoint(path: str | os.PathLike, *, argument: str = "path") -> dict[str, Any]:
    """Reads a checkpoint written by :func:`save_checkpoint` (``weights_only=True``, onto the CPU).

    Every way a path can fail to be a checkpoint raises the one :class:`~rlstruct.errors.CheckpointError`, naming
    ``argument`` and the path: ``rlstruct.algos.load``, ``rlstruct eval`` and ``--resume`` all read through here.

    Args:
        path: the checkpoint file, or a run's log folder (its ``checkpoint.pt``).
        argument: the name of ``path`` in the caller's signature or command line, for the messages.

    Raises:
        CheckpointError: nothing is at ``path``, a folder without ``checkpoint.pt``, a file this process cannot read,
            one that is not an rlstruct checkpoint, a damaged one (its content differs from its digest, its bytes from
            the zip's CRCs, or it lacks
            what every checkpoint holds), one whose counters are out of range (a negative ``iteration`` or
            ``env_steps``), or one whose weights hold NaN or infinite values (:func:`~.finite.check_finite_checkpoint`).

    >>> load_checkpoint("no/such/run", argument="resume")
    Traceback (most recent call last):
    ...
    rlstruct.errors.CheckpointError: resume='no/such/run' does not exist; pass the checkpoint.pt of an earlier run, \
or its log folder (the --logdir it was trained with)
    """
    shown = f"{argument}={os.fspath(path)!r}"
    if not os.path.exists(path):
        raise CheckpointError(f"{shown} does not exist; pass the {CHECKPOINT_NAME} of an earlier run, or its log "
                              "folder (the --logdir it was trained with)")
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_NAME)
        if not os.path.isfile(path):
            raise CheckpointError(f"{shown} is a folder without a {CHECKPOINT_NAME}; pass the checkpoint file that "
                                  "rlstruct train printed, or the log folder of a finished run")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise CheckpointError(f"{shown} cannot be read ({e.strerror or type(e).__name__}); pass a {CHECKPOINT_NAME} "
                              "this process may read") from e
    except Exception as e:  # torch.load's errors for a file it cannot read vary (pickle, zip, unpickler)
        _check_crc(path, argument, e)
        raise CheckpointError(f"{shown} is not an rlstruct checkpoint (torch.load cannot read it: "
                              f"{type(e).__name__}); pass a {CHECKPOINT_NAME} written by rlstruct train") from e
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{shown} is not an rlstruct checkpoint (no format {CHECKPOINT_FORMAT!r}); pass a "
                              f"{CHECKPOINT_NAME} written by rlstruct train")
    check_digest(data, f"{argument}={os.fspath(path)!r}")
    # A changed byte that leaves the content as it was (a pickle memo index no later entry reads) loads whole and
    # matches the digest: the zip's CRCs still say the file changed.
    _check_crc(path, argument)
    missing = [k for k, kind in CHECKPOINT_KEYS.items() if not isinstance(data.get(k), kind)]
    missing += [f"config[{k!r}]" for k in CONFIG_KEYS if not missing and k not in data["config"]]
    if missing:
        raise CheckpointError(f"{shown} is a damaged rlstruct checkpoint: it lacks {', '.join(missing)}; pass a "
                              f"{CHECKPOINT_NAME} written whole by rlstruct train (the last periodic one, if the run "
                              "was killed)")
    _check_counters(data, f"{argument}={os.fspath(path)!r}")
    check_finite_checkpoint(data, shown)
    return data


#: a checkpoint's counters and the least each may be
COUNTERS = {"iteration": 0, "env_steps": 0, "world_size": 1, "wall_time_s": 0.0}


def _check_counters(data: dict[str, Any], shown: str) -> None:
    """Refuses counters out of range (a negative iteration or env-step count, a world of no rank): a resumed run
    would write them into ``progress.csv`` and count its budget from them."""
    for key, least in COUNTERS.items():
        if key not in data:  # a checkpoint rlstruct eval reads, without the learner's counters
            continue
        value, kind = data[key], float if isinstance(least, float) else int
        number = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not number or not value >= least or (kind is float and not math.isfinite(value)):
            raise CheckpointError(f"{shown} must hold {key} as {'a finite number' if kind is float else 'an integer'} "
                                  f">= {least:g}, got {value!r}: a damaged or edited checkpoint; pass a "
                                  f"{CHECKPOINT_NAME} written by rlstruct train (the run's last periodic one, if any)")


def load_state(module: torch.nn.Module | OptimizerLike, state: Any, what: str, path: str | os.PathLike) -> None:
    """``module.load_state_dict(state)``, with a :class:`~rlstruct.errors.ConfigError` naming the checkpoint when
    the state does not fit (missing or unexpected keys, other shapes: a damaged file, or one the settings of this run
    do not describe).

    Raises:
        ConfigError: the state does not fit ``module``.
    """
    try:
        module.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        fix = "pass an undamaged checkpoint of the same settings, or start a new run without --resume"
        raise does_not_fit(f"resume={str(path)!r}: {what} in the checkpoint does not fit this run's", e, fix) from e


def does_not_fit(situation: str, cause: Exception, fix: str, *,
                 error: type[ConfigError | CheckpointError] = ConfigError) -> ConfigError | CheckpointError:
    """The message for state that does not fit its module (``load_state_dict``'s missing or unexpected keys, other
    shapes), wherever a checkpoint is loaded: ``situation``, the first lines of torch's message, then ``fix``; as a
    :class:`~rlstruct.errors.ConfigError` (this run's settings do not fit the checkpoint) or an ``error`` of the
    caller's (:class:`~rlstruct.errors.CheckpointError`: a checkpoint that does not fit its own config).

    >>> missing = RuntimeError("Missing key(s): pi.0.weight")
    >>> print(does_not_fit("ck.pt holds weights that do not fit", missing, "pass another"))
    ck.pt holds weights that do not fit (Missing key(s): pi.0.weight); pass another
    """
    detail = " ".join(line.strip() for line in str(cause).strip().splitlines()[:3])[:300]
    return error(f"{situation} ({detail}); {fix}")


@dataclasses.dataclass
class Resume:
    """What a resumed run continues from: a checkpoint read by :func:`load_resume`.

    Attributes:
        path: the checkpoint file.
        algo: the algorithm that wrote it.
        config: its run's config, as plain types.
        iteration: training iterations done (the resumed run's first is ``iteration + 1``).
        env_steps: training env steps taken.
        wall_time_s: seconds of wall clock the run had taken over all its sessions.
        model: the policy's weights (the model the checkpoint's ``model`` holds).
        learner: the algorithm's learner state: ``{"optimizer": ...}`` and what else its ``train`` keeps.
        world_size: the data-parallel ranks that trained it (1: one process; older checkpoints say nothing: 1).
        stop_reason: why the run stopped, in a run's final checkpoint (see :data:`~.result.STOP_REASONS`); ``None`` in
            a periodic one, and in those written before it was recorded.
    """

    path: Path
    algo: str
    config: dict[str, Any]
    iteration: int
    env_steps: int
    wall_time_s: float
    model: dict[str, torch.Tensor]
    learner: dict[str, Any]
    world_size: int = 1
    stop_reason: str | None = None

    @property
    def folder(self) -> Path:
        """The checkpoint's folder: the log folder of the run it continues."""
        return self.path.parent


def load_resume(algo: str, config: RunConfig, *, checkpoint: dict[str, Any] | None = None) -> Resume | None:
    """Reads ``config.resume`` (a checkpoint or a run's log folder) and checks that ``config`` may continue it.

    Args:
        algo: the algorithm of the new run.
        config: the new run's config; its class's :func:`~.config.resume_fields` are the settings that must equal
            the checkpoint's (the shared ones, its family's and its algorithm's, e.g. DQN's ``dueling``).
        checkpoint: the content of ``config.resume`` (:func:`load_checkpoint`'s) when the caller has read it
            already; ``None`` reads it here.

    Returns:
        The checkpoint's content, or ``None`` when ``config.resume`` is ``None`` (a fresh run).

    Raises:
        CheckpointError: ``config.resume`` is not a readable checkpoint (:func:`load_checkpoint`), or its learner's
            state holds NaN or infinite values.
        ConfigError: it was written by another algorithm or by a version of rlstruct that did not save the learner's
            state, or a setting that shapes the networks or the data differs from the checkpoint's.
    """
    if config.resume is None:
        return None
    data = load_checkpoint(config.resume, argument="resume") if checkpoint is None else checkpoint
    path = Path(config.resume)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    check_resume_algorithm(algo, config.resume, data)
    if "learner" not in data or "iteration" not in data:
        raise ConfigError(f"resume={config.resume!r} is a checkpoint without the learner's state (rlstruct eval can "
                          "read it, training cannot continue from it); start a new run, e.g. from its weights in your "
                          "own code")
    check_finite_checkpoint(data, f"resume={config.resume!r}", keys=("learner",))
    saved = data["config"]
    new = config.to_dict()
    # A setting the checkpoint's config lacks came after it was written: the run had its default's behaviour.
    defaults = type(config)().to_dict()
    for name in resume_fields(type(config)):
        before, now = saved.get(name, defaults[name]), new[name]
        if name == "backend":  # "auto" and the backend it picks are the same simulator
            before, now = stepped_backend(data), resolve_backend(new["env"], now)
        if name == "max_episode_steps":  # None is the env's own limit, which the checkpoint's spec holds
            limit = data["env_spec"]["max_episode_steps"]
            before, now = before or limit, now or limit
        if before != now:
            flag = "--" + name.replace("_", "-")
            shown = repr(before)
            if saved.get(name, defaults[name]) != before:  # what the setting came to: the backend "auto" picked
                shown += " (the env's own limit)" if name == "max_episode_steps" else f" (its {saved.get(name)!r})"
            raise ConfigError(
                f"{name} must equal the checkpoint's to resume it ({name} shapes the networks or the data), got "
                f"{name}={new[name]!r} and the checkpoint's {shown} (resume={config.resume!r}); pass "
                f"{flag} as the run was trained, or start a new run without --resume"
            )
    return Resume(path=path, algo=data["algo"], config=saved, iteration=int(data["iteration"]),
                  env_steps=int(data["env_steps"]), wall_time_s=float(data.get("wall_time_s", 0.0)),
                  model=data["model"], learner=data["learner"], world_size=int(data.get("world_size", 1)),
                  stop_reason=data.get("stop_reason"))


def stepped_backend(checkpoint: dict[str, Any]) -> str:
    """The backend the run of ``checkpoint`` stepped: the one it recorded, else what its ``"auto"`` came to when it
    ran (checkpoints written before the record: ``MinAtar/`` ids were minatar's own games through gymnasium then).

    >>> stepped_backend({"config": {"env": "MinAtar/Breakout-v1", "backend": "auto"}})
    'gymnasium'
    >>> stepped_backend({"config": {"env": "MinAtar/Breakout-v1", "backend": "auto"}, "backend": "torch"})
    'torch'
    """
    if "backend" in checkpoint:
        return checkpoint["backend"]
    env, backend = checkpoint["config"]["env"], checkpoint["config"].get("backend", "auto")
    if backend == "auto" and env.startswith("MinAtar/"):
        return "gymnasium"
    return resolve_backend(env, backend)


def check_resume_algorithm(algo: str, resume: str, checkpoint: dict[str, Any]) -> None:
    """Checks that ``checkpoint`` (the content of ``resume``) holds a run of ``algo``: before its settings are read
    as a resumed run's (its preset, its network) by another algorithm.

    Raises:
        ConfigError: another algorithm wrote it.
    """
    if checkpoint["algo"] != algo:
        raise ConfigError(f"resume={resume!r} holds a {checkpoint['algo']} run, got rlstruct train {algo}; resume "
                          f"it with rlstruct train {checkpoint['algo']}, or start a new {algo} run without --resume")


def check_resume_env(env: str, resume: str, checkpoint: dict[str, Any]) -> None:
    """Checks that a run resumed from ``checkpoint`` (the content of ``resume``) keeps its env: before the new env's
    preset is looked up, which would blame the preset for it.

    Raises:
        ConfigError: ``env`` is not the run's.
    """
    trained_on = checkpoint.get("config", {}).get("env")
    if trained_on is not None and env != trained_on:
        raise ConfigError(f"a run's env cannot be changed at resume: resume={resume!r} is a run on {trained_on!r}, "
                          f"got env={env!r}; drop --env to continue it on {trained_on!r}, or start a new run on "
                          f"{env!r} without --resume")


def restore_optimizer(optimizer: OptimizerLike, state: dict[str, Any], lr: float) -> None:
    """Loads an optimizer's saved state (its steps and moments, onto its parameters' device) and sets every group's
    learning rate to ``lr``: the new command's, which a schedule then rescales from the restored step count.

    >>> p = torch.nn.Parameter(torch.ones(1))
    >>> saved = torch.optim.Adam([p], lr=0.1)
    >>> p.grad = torch.ones(1); saved.step()
    >>> opt = torch.optim.Adam([p], lr=0.5)
    >>> restore_optimizer(opt, tree_copy(saved.state_dict()), 0.01)
    >>> float(opt.state[p]["step"]), opt.param_groups[0]["lr"]
    (1.0, 0.01)
    """
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["lr"] = lr
