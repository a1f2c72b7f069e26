"""What keeps a run's folder a durable record: files written whole (:func:`write_whole`), a folder claimed by a
start that failed before training given back (:class:`FolderClaim`), and a finished run left as it is
(:func:`check_unfinished`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rlstruct.algos._train.checkpoints import sync_folder
from rlstruct.errors import RunFinishedError

if TYPE_CHECKING:
    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.algos._train.checkpoints import Resume
    from rlstruct.algos._train.config import RunConfig

__all__ = ["CONFIG_NAME", "CSV_NAME", "FINISHED", "SUMMARY_NAME", "FolderClaim", "check_unfinished",
           "given_back_unless_trained", "write_whole"]

log = logging.getLogger(__name__)

#: a run folder's rows, one per training iteration and per evaluation
CSV_NAME = "progress.csv"
#: a run folder's summary, written at its end
SUMMARY_NAME = "summary.json"
#: a run folder's settings, created first: it claims the folder
CONFIG_NAME = "config.json"
#: the stop reasons of a run that finished, as its settings asked (the others, a signal or another rank's stop, a
#: divergence, leave a run that ``--resume`` continues as it is)
FINISHED = ("target", "budget", "time_limit")


def write_whole(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` whole or not at all: into a temporary file beside it, flushed to the disk, renamed
    onto ``path`` (``os.replace``), the folder flushed after: a kill (or a power loss) at any moment leaves either
    the previous file or the new one, complete.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_whole(Path(tmp) / "a.json", "{}")
    ...     print(sorted(os.listdir(tmp)), (Path(tmp) / "a.json").read_text())
    ['a.json'] {}
    """
    partial = path.with_name(f"{path.name}.partial")
    with open(partial, "w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    sync_folder(path.parent)


@dataclasses.dataclass(frozen=True)
class FolderClaim:
    """A log folder claimed by a new run (:func:`~.log.claim_run_folder`), and what claiming it created.

    Attributes:
        path: the folder.
        created: the folders the claim created, outermost first (``path`` last, unless it existed).
        earlier: the names in ``path`` before the claim (none when the claim created it).
        first_iteration: the run's first training iteration (1; a resumed run's checkpoint's next).
    """

    path: Path
    created: list[Path]
    earlier: frozenset[str]
    first_iteration: int = 1

    def trained(self) -> bool:
        """Whether ``progress.csv`` holds a row of a training iteration of this run (rows are written out when the
        run closes, also when it raised)."""
        try:
            with open(self.path / CSV_NAME, newline="") as f:
                return any(float(row.get("iteration") or 0) >= self.first_iteration for row in csv.DictReader(f))
        except (OSError, ValueError):
            return False

    def release(self) -> bool:
        """Removes what the claim and the run created, unless the run trained (:meth:`trained`): the folder when
        the claim created it (and the parents it created, when nothing else went there since), else the names it
        did not hold before; so that the corrected command gets the same folder. Returns whether it did."""
        if self.trained() or not self.path.is_dir():
            return False
        if self.created and self.created[-1] == self.path:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            for name in set(os.listdir(self.path)) - self.earlier:
                item = self.path / name
                if item.is_dir() and not item.is_symlink():
                    shutil.rmtree(item, ignore_errors=True)
                else:
                    item.unlink(missing_ok=True)
        for folder in reversed(self.created[:-1] if self.created[-1:] == [self.path] else self.created):
            try:
                folder.rmdir()
            except OSError:  # something else is in it: a sibling run's folder
                break
        log.info("%s: the run stopped before its first training iteration; removed what it had written", self.path)
        return True


@contextlib.contextmanager
def given_back_unless_trained(claim: FolderClaim | None) -> Iterator[None]:
    """Runs the body (a run's training); if it raises before the run's first training iteration (a setting that
    only building the run refuses, a tracker or a worker that fails to start, a Ctrl-C), gives back the log folder
    ``claim`` claimed (:meth:`FolderClaim.release`; ``None``: the run claimed none), so that the corrected command
    writes to the same folder."""
    try:
        yield
    except BaseException:
        if claim is not None:
            claim.release()
        raise




def stop_reason(resume: Resume) -> str | None:
    """Why the run of ``resume`` stopped: its checkpoint's record, else (a checkpoint written before it was recorded)
    the ``summary.json`` beside it when that summary is of the checkpoint's iteration; ``None``: it did not stop (a
    periodic checkpoint) or nothing says."""
    if resume.stop_reason is not None:
        return resume.stop_reason
    try:
        summary = json.loads((resume.folder / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("iterations") != resume.iteration:
        return None
    return "signal" if summary.get("interrupted") else summary.get("stop_reason")


def _target(target_return: float | None, stop_at_threshold: bool, spec: EnvSpec) -> float | None:
    return target_return if target_return is not None or not stop_at_threshold else spec.reward_threshold


def check_unfinished(resume: Resume, config: RunConfig, spec: EnvSpec) -> None:
    """Refuses to resume a finished run (:data:`FINISHED`) that ``config`` gives nothing more to do, so that
    ``--resume`` of it changes nothing: neither its rows, nor its checkpoint, nor its summary.

    A finished run continues when ``config`` gives it more to do: env steps left (``max_env_steps`` above the run's,
    or none), and for a run that reached its target a higher target (or none), for one that reached its time limit a
    new ``time_limit`` (it bounds each session's seconds). An interrupted, diverged or killed run resumes as before.

    Raises:
        RunFinishedError: the run finished and ``config`` gives it nothing more to do; the message says what would.
    """
    reason = stop_reason(resume)
    if reason not in FINISHED:
        return
    saved, steps = resume.config, resume.env_steps
    steps_left = config.max_env_steps is None or config.max_env_steps > steps
    more_steps = f"a --max-env-steps above {steps:,}"
    if reason == "budget":
        why = f"its budget of {saved.get('max_env_steps') or steps:,} env steps was spent"
        more, fix = steps_left, more_steps
    elif reason == "target":
        before = _target(saved.get("target_return"), saved.get("stop_at_reward_threshold", True), spec)
        after = _target(config.target_return, config.stop_at_reward_threshold, spec)
        raised = before is None or after is None or after > before
        why = f"an evaluation reached its target return {before:g}" if before is not None else "it reached its target"
        more = raised and steps_left
        fix = "a higher --target-return (or --no-stop-at-reward-threshold)" + ("" if steps_left else
                                                                               f" and {more_steps}")
    else:
        limit = saved.get("time_limit")
        more = steps_left and config.time_limit != limit
        why = f"it reached its time limit of {limit:g} s" if limit is not None else "it reached its time limit"
        fix = "--time-limit SECONDS for this session" + ("" if steps_left else f" and {more_steps}")
    if more:
        log.info("resume=%s finished (%s): continuing it with the new settings", config.resume, reason)
        return
    raise RunFinishedError(f"resume={config.resume!r} is a finished run ({why}, at {steps:,} env steps): nothing to "
                           f"do, the run is left as it is; to train it further, pass {fix}")
