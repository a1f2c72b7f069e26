"""What a training run leaves behind: its checkpoint and its learning-curve plot."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.algos.networks import cpu_state_dict

if TYPE_CHECKING:
    from rlstruct.algos.run import EnvSpec, RunConfig

__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint", "plot_learning_curve"]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "rlstruct-checkpoint-1"
#: the checkpoint's file name in a run's log folder
CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path: str | os.PathLike, algo: str, config: RunConfig, spec: EnvSpec, model: nn.Module,
                    extra: dict[str, Any] | None = None) -> str:
    """Writes ``{format, algo, config, env_spec, model, ...}`` of plain types and CPU tensors.

    It loads with ``torch.load(path, weights_only=True)``.
    """
    data = {
        "format": CHECKPOINT_FORMAT,
        "algo": algo,
        "config": config.to_dict(),
        "env_spec": dataclasses.asdict(spec),
        "model": cpu_state_dict(model),
        **(extra or {}),
    }
    torch.save(data, path)
    return str(path)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a checkpoint written by :func:`save_checkpoint` (``weights_only=True``, onto the CPU).

    Args:
        path: the checkpoint file, or a run's log folder (its ``checkpoint.pt``).

    Raises:
        FileNotFoundError: no such file, or a folder without ``checkpoint.pt``.
        ValueError: the file is not an rlstruct checkpoint.
    """
    if os.path.isdir(path):
        folder, path = path, os.path.join(path, CHECKPOINT_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{str(folder)!r} is a folder without a {CHECKPOINT_NAME}; pass the checkpoint "
                                    "file that rlstruct train printed, or the log folder of a finished run")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # torch.load's errors for a file it cannot read vary (pickle, zip, unpickler)
        raise ValueError(f"{str(path)!r} is not an rlstruct checkpoint (torch.load cannot read it: "
                         f"{type(e).__name__}); pass a checkpoint.pt written by rlstruct train") from e
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not an rlstruct checkpoint (no format {CHECKPOINT_FORMAT!r})")
    return data


def plot_learning_curve(history: list[dict[str, float]], path: str | os.PathLike, title: str) -> str | None:
    """Plots the evaluation and training returns against env steps and wall clock into a PNG.

    Returns:
        The path, or ``None`` when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'rlstruct[plot]'); no learning-curve plot")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    train = [r for r in history if isinstance(r.get("train/episode_return"), float)
             and math.isfinite(r["train/episode_return"])]
    evals = [r for r in history if "eval/return" in r]
    for ax, x in zip(axes, ("env_steps", "wall_time_s")):
        if train:
            ax.plot([r[x] for r in train], [r["train/episode_return"] for r in train], color="tab:blue", alpha=0.4,
                    lw=1, label="training episodes")
        if evals:
            ax.plot([r[x] for r in evals], [r["eval/return"] for r in evals], "o-", color="tab:red", ms=3,
                    label="evaluation (mean)")
        ax.set_xlabel("env steps" if x == "env_steps" else "wall clock (s)")
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
