"""What keeps a run's folder a durable record: files written whole (:func:`write_whole`), a folder claimed by a
start that failed before training given back (:class:`FolderClaim`), and a finished run left as it is
(:func:`check_unfinished`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlstruct.algos._train.checkpoints import sync_folder

__all__ = ["CONFIG_NAME", "CSV_NAME", "SUMMARY_NAME", "FolderClaim", "given_back_unless_trained", "write_whole"]

log = logging.getLogger(__name__)

#: a run folder's rows, one per training iteration and per evaluation
CSV_NAME = "progress.csv"
#: a run folder's summary, written at its end
SUMMARY_NAME = "summary.json"
#: a run folder's settings, created first: it claims the folder
CONFIG_NAME = "config.json"


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


