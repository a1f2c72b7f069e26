"""Writes that outlast a kill or a power loss: a file or a folder flushed to the disk (:func:`sync_file`,
:func:`sync_folder`), a file written whole or not at all (:func:`write_whole`). It imports nothing of the package, so
that every module that writes a run's files may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["sync_file", "sync_folder", "write_whole"]


def sync_file(path: str | os.PathLike) -> None:
    """Flushes the file at ``path`` from the page cache to the disk (``fsync``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: str | os.PathLike) -> None:
    """Flushes the folder ``path``'s entries to the disk (``fsync``), so that the files renamed into it survive a
    power loss; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder; the files themselves are synced
        pass
    finally:
        os.close(fd)


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
