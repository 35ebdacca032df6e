"""Writing a file so that no reader ever sees half of it and nothing already there is lost by accident.

``write_new_file`` writes into a fresh temporary file in the target folder (``O_CREAT | O_EXCL | O_NOFOLLOW`` with the
final mode, so a private key is never readable by others, not even for a moment), fsyncs it, and then either links it
under the final name, which fails if anything (a file, a directory or a symlink) is there already, or, with
``replace=True``, renames it over that name (a planted symlink is replaced, never followed).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def write_new_file(
    path: str | Path, content: bytes | Callable[[BinaryIO], None], mode: int = 0o644, replace: bool = False
) -> Path:
    """Write ``content`` (bytes, or a function writing to a binary file) to ``path`` with permission bits ``mode``.

    Raises ``FileExistsError`` when something exists at ``path`` and ``replace`` is false."""
    path = Path(path)
    if not replace and os.path.lexists(path):
        raise FileExistsError(f"{path} exists; it is kept (nothing is overwritten without an explicit request)")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, CREATE_FLAGS, mode)
    try:
        with os.fdopen(fd, "wb") as out:
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
    _fsync_dir(path.parent)
    return path


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


def _fsync_dir(folder: Path) -> None:
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
