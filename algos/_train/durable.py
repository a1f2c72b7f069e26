"""Writes that outlast a kill or a power loss: a file or a folder flushed to the disk (:func:`sync_file`,
:func:`sync_folder`), a file written whole or not at all (:func:`written_whole` for a writer of its own,
:func:`write_whole` for text or bytes). It imports nothing of the package, so that every module that writes a run's
files may use it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["sync_file", "sync_folder", "write_whole", "written_whole"]


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


@contextlib.contextmanager
def written_whole(path: str | os.PathLike, *, partial: str | os.PathLike | None = None) -> Iterator[Path]:
    """The file at ``path`` written whole or not at all: the body writes the temporary file it is given, beside
    ``path`` (``partial``, default ``path`` with ``.partial`` added: a writer that picks its format by the suffix
    needs one of its own); then the file is flushed to the disk, renamed onto ``path`` (``os.replace``), and the
    folder flushed. A kill (or a power loss) at any moment leaves either the previous file or the new one, complete;
    a body that raises leaves the previous one, and no temporary file.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with written_whole(Path(tmp) / "a.bin") as partial:
    ...         _ = partial.write_bytes(b"whole")
    ...     print(sorted(os.listdir(tmp)), partial.name)
    ['a.bin'] a.bin.partial
    """
    path = Path(path)
    partial = path.with_name(f"{path.name}.partial") if partial is None else Path(partial)
    try:
        yield partial
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise
    sync_file(partial)
    os.replace(partial, path)
    sync_folder(path.parent)


def write_whole(path: str | os.PathLike, data: str | bytes) -> None:
    """Writes ``data`` (text, its line ends as they are, or bytes) to ``path`` whole or not at all
    (:func:`written_whole`).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_whole(Path(tmp) / "a.json", "{}")
    ...     print(sorted(os.listdir(tmp)), (Path(tmp) / "a.json").read_text())
    ['a.json'] {}
    """
    with written_whole(path) as partial:
        if isinstance(data, str):
            with open(partial, "w", newline="") as f:
                f.write(data)
        else:
            with open(partial, "wb") as f:
                f.write(data)
