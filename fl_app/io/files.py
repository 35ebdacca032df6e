"""Writing a file so that no reader ever sees half of it and nothing already there is lost by accident.

Every file the project writes goes through ``write_new_file``: it writes into a fresh temporary file in the target
folder (a random name opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and the final mode, so a planted symlink is never
followed and a private key is never readable by others, not even for a moment), fsyncs it, and then either links it
under the final name, which fails if anything (a file, a directory or a symlink) is there already, or, with
``replace=True``, renames it over that name (a planted symlink is replaced, never followed).

Which existing file may be replaced is decided by the two writers built on it:

- ``write_own_file``: a new file, or the file this process wrote at that name last (a run rewriting its
  ``metrics.csv`` after each round); another run's file, a symlink or a file changed since is kept.
- ``replace_file``: for a caller that has decided the regular file at the name is its own to rewrite (a reference
  document regenerated in place); a symlink, folder or other kind of file is kept.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Callable

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
TEMP_NAME_TRIES = 16  # a random temporary name taken already (planted or left over) is skipped for another

Content = bytes | Callable[[BinaryIO], None]


def write_new_file(path: str | Path, content: Content, mode: int | None = 0o644, replace: bool = False) -> Path:
    """Write ``content`` (bytes, or a function writing to a binary file) to ``path`` with permission bits ``mode``
    (None: what ``open`` gives, 0o666 less the umask).

    Raises ``FileExistsError`` when something exists at ``path`` and ``replace`` is false."""
    path = Path(path)
    if not replace and os.path.lexists(path):
        raise FileExistsError(f"{path} exists; it is kept (nothing is overwritten without an explicit request)")
    tmp, fd = _open_temporary(path, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as out:
            if mode is not None:
                os.fchmod(out.fileno(), mode)  # the umask may have removed bits that were asked for
            if callable(content):
                content(out)
            else:
                out.write(content)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return path


def _open_temporary(path: Path, mode: int) -> tuple[Path, int]:
    for _ in range(TEMP_NAME_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, CREATE_FLAGS, mode)
        except FileExistsError:  # never written through: O_EXCL | O_NOFOLLOW refuse whatever holds the name
            continue
    raise FileExistsError(f"{path}: no free temporary name next to it after {TEMP_NAME_TRIES} tries")


def _link_new(tmp: Path, path: Path) -> None:
    try:
        os.link(tmp, path, follow_symlinks=False)  # atomic, and fails if the name is taken by now
    except FileExistsError:
        raise FileExistsError(
            f"{path} exists; it is kept (nothing is overwritten without an explicit request)"
        ) from None
    except OSError:  # a filesystem without hard links: the check at the start stands
        if os.path.lexists(path):
            raise FileExistsError(f"{path} exists; it is kept") from None
        os.replace(tmp, path)


def fsync_dir(folder: Path) -> None:
    """Make a rename or link inside ``folder`` durable (where the filesystem syncs folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not every filesystem syncs directories
        pass
    finally:
        os.close(fd)


# -- files this process wrote ----------------------------------------------------------------------------------------
# absolute path -> (device, inode, size, modification time) of the file this process wrote there last
_WRITTEN: dict[str, tuple[int, int, int, int]] = {}


def _identity(status: os.stat_result) -> tuple[int, int, int, int]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def wrote_here(path: str | Path) -> bool:
    """Whether ``path`` is, unchanged, the regular file this process last wrote there (``write_own_file``,
    ``replace_file`` or ``remember_written``)."""
    status = _lstat(Path(path))
    return (
        status is not None and stat.S_ISREG(status.st_mode) and _WRITTEN.get(os.path.abspath(path)) == _identity(status)
    )


def remember_written(path: str | Path) -> None:
    """Record ``path`` as the file this process wrote there (for a writer built on ``write_new_file`` with its own
    rule for what it replaces, such as ``fl_app.run.checkpoint.save_verified``)."""
    _WRITTEN[os.path.abspath(path)] = _identity(os.lstat(path))


def write_own_file(path: str | Path, content: Content, mode: int | None = None) -> Path:
    """Create ``path``, or replace it only when it is the file this process wrote there last (``wrote_here``):
    anything else at the name (another run's file, a file changed since, a symlink, a folder) is kept and
    ``FileExistsError`` names it."""
    path = Path(path)
    existing = _lstat(path)
    if existing is not None and not wrote_here(path):
        raise FileExistsError(
            f"{path} exists and was not written by this run; it is kept (choose a new output or remove it)"
        )
    write_new_file(path, content, mode, replace=existing is not None)
    remember_written(path)
    return path


def replace_file(path: str | Path, content: Content, mode: int | None = None) -> Path:
    """Create ``path`` or replace the regular file there (the caller decided it is its own to rewrite; mode None
    keeps its permission bits); a symlink, folder or other kind of file at the name is kept (``FileExistsError``)."""
    path = Path(path)
    existing = _lstat(path)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        kind = "a symlink" if stat.S_ISLNK(existing.st_mode) else "not a regular file"
        raise FileExistsError(f"{path} is {kind}; it is kept and nothing is written through it")
    if existing is not None and mode is None:
        mode = stat.S_IMODE(existing.st_mode)
    write_new_file(path, content, mode, replace=existing is not None)
    remember_written(path)
    return path


def open_new_file(path: str | Path) -> BinaryIO:
    """A new file at ``path`` open for writing as it grows (a log another process streams into): created with
    ``O_EXCL | O_NOFOLLOW`` (0o666 less the umask), so nothing there, a symlink included, is ever written through."""
    try:
        return os.fdopen(os.open(path, CREATE_FLAGS, 0o666), "wb")
    except FileExistsError:
        raise FileExistsError(f"{path} exists; it is kept (nothing is overwritten)") from None


def existing_output(path: str | Path, option: str = "--out") -> str | None:
    """Why ``path`` cannot be a new output file (something, even a dangling symlink, is there), or None."""
    if os.path.lexists(path):
        return f"{option} {path} already exists; choose a new file (nothing is ever overwritten)"
    return None


def first_link(root: str | Path, path: str | Path) -> Path | None:
    """The first symlink among the folders and files from ``root`` (exclusive) down to ``path``, or None: a
    writer that keeps to its output folder follows no link inside it (the link may point anywhere)."""
    root, path = Path(root), Path(path)
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if os.path.islink(current):
            return current
    return None
