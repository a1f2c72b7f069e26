"""Writes that outlast a kill or a power loss, and never go through a link: a file or a folder flushed to the disk
(:func:`sync_file`, :func:`sync_folder`), a file written whole or not at all (:func:`written_whole` for a writer of
its own, :func:`write_whole` for text or bytes), a file opened for appends (:func:`open_appending`) and a folder made
(:func:`make_folder`), each refusing a symbolic link where it writes (:func:`refuse_link`): run folders travel
between machines and users, and a link planted in one would have a run write wherever it points. It imports nothing
of the harness, so that every module that writes a run's files may use it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from collections.abc import Iterator
from pathlib import Path

from rlstruct.errors import RunFileLinkError

__all__ = ["make_folder", "open_appending", "open_unlinked", "refuse_link", "sync_file", "sync_folder", "write_whole",
           "written_whole"]

#: ``open``'s flag that refuses a symbolic link as the last part of the path (none on Windows: :func:`refuse_link`
#: checks first there)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def refuse_link(path: str | os.PathLike) -> None:
    """Raises when ``path`` is a symbolic link (dangling or not), which a write would go through.

    Raises:
        RunFileLinkError: it is; the message names it, where it points, and says to remove it.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     os.symlink(os.devnull, Path(tmp) / "progress.csv")
    ...     try:
    ...         refuse_link(Path(tmp) / "progress.csv")
    ...     except RunFileLinkError as e:
    ...         print(str(e).replace(tmp, "RUN"))
    'RUN/progress.csv' must be a file or folder of its own, not a symbolic link: got a link to '/dev/null', which \
writing it would write through; remove the link (rm 'RUN/progress.csv'), then run the command again
    """
    if os.path.islink(path):
        raise RunFileLinkError(_link_message(path))


def _link_message(path: str | os.PathLike) -> str:
    try:
        target = f" to {os.readlink(path)!r}"
    except OSError:
        target = ""
    return (f"{str(path)!r} must be a file or folder of its own, not a symbolic link: got a link{target}, which "
            f"writing it would write through; remove the link (rm {str(path)!r}), then run the command again")


def open_unlinked(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW, mode)``: the file descriptor of ``path``, refusing a symbolic link there
    (the last part of the path: the folders above it are the caller's to trust).

    Raises:
        RunFileLinkError: ``path`` is a symbolic link.
        OSError: the file cannot be opened otherwise.
    """
    if not _NOFOLLOW:
        refuse_link(path)
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as e:
        # Linux says ELOOP, the BSDs EMLINK; O_EXCL refuses an existing link with EEXIST
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.EEXIST) and os.path.islink(path):
            raise RunFileLinkError(_link_message(path)) from None
        raise


def open_appending(path: str | os.PathLike) -> io.TextIOWrapper:
    """``path`` opened for appending text (created if missing; line ends as written), refusing a symbolic link
    (:func:`open_unlinked`)."""
    return open(path, "a", newline="", opener=_opener)


def _opener(path: str, flags: int) -> int:
    """``open``'s ``opener`` that refuses a symbolic link (:func:`open_unlinked`)."""
    return open_unlinked(path, flags)


def make_folder(path: str | os.PathLike) -> Path:
    """Creates the folder ``path`` (and its parents) unless it exists; refuses ``path`` when it is a symbolic link
    (:func:`refuse_link`), so that the files written into it stay in the run's folder. Returns it."""
    path = Path(path)
    refuse_link(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sync_file(path: str | os.PathLike) -> None:
    """Flushes the file at ``path`` from the page cache to the disk (``fsync``); a symbolic link is refused
    (:func:`open_unlinked`)."""
    fd = open_unlinked(path, os.O_RDONLY)
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
    a body (or a flush, or the rename) that raises leaves the previous one, and no temporary file (an ``OSError`` of a
    write that names no file, such as a full disk's, is raised again naming ``path``).

    Neither ``path`` nor ``partial`` may be a symbolic link (:class:`~rlstruct.errors.RunFileLinkError`, before
    anything is written): ``partial`` is made anew, empty, by this process (a regular one a kill left is replaced),
    so that the body writes a file of its own.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with written_whole(Path(tmp) / "a.bin") as partial:
    ...         _ = partial.write_bytes(b"whole")
    ...     print(sorted(os.listdir(tmp)), partial.name)
    ['a.bin'] a.bin.partial
    """
    path = Path(path)
    partial = path.with_name(f"{path.name}.partial") if partial is None else Path(partial)
    refuse_link(path)
    refuse_link(partial)
    with contextlib.suppress(FileNotFoundError):  # what a write killed before its rename left
        os.unlink(partial)
    os.close(open_unlinked(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    try:
        yield partial
        sync_file(partial)
        refuse_link(path)
        os.replace(partial, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno and e.filename is None:  # a write's error names no file: name it
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    sync_folder(path.parent)


def write_whole(path: str | os.PathLike, data: str | bytes | memoryview) -> None:
    """Writes ``data`` (text, its line ends as they are, or bytes) to ``path`` whole or not at all
    (:func:`written_whole`), never through a symbolic link.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_whole(Path(tmp) / "a.json", "{}")
    ...     print(sorted(os.listdir(tmp)), (Path(tmp) / "a.json").read_text())
    ['a.json'] {}
    """
    with written_whole(path) as partial:
        if isinstance(data, str):
            with open(partial, "w", newline="", opener=_opener) as f:
                f.write(data)
        else:
            with open(partial, "wb", opener=_opener) as f:
                f.write(data)
