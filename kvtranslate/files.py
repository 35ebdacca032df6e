"""Writing kvtranslate's files (config.json, model.safetensors, history.json, eval.json) with the project's rules
for every file it writes (the same as fl_app/io/files.py; kvtranslate imports nothing from the FL side):

- never through a link: the bytes go into a fresh temporary file next to the target, opened with
  O_CREAT | O_EXCL | O_NOFOLLOW, so a planted symlink (at the name or the temporary name) is never followed;
- atomic: the temporary file is fsynced, then linked under the final name (fails if anything is there by then) or,
  when it replaces this process's own earlier file, renamed over it; a reader never sees half a file;
- results are not overwritten: an existing file is replaced only when it is, unchanged, the one this process wrote
  there last; anything else (another run's file, a symlink, a folder) is kept and FileExistsError names it;
- an output folder that is a symlink is refused (its files would land wherever it points).
"""

import json
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any, BinaryIO

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
TEMP_NAME_TRIES = 16
_WRITTEN: dict[str, tuple[int, int, int, int]] = {}  # absolute path -> identity of the file this process wrote

Content = bytes | Callable[[BinaryIO], None]


def _identity(status: os.stat_result) -> tuple[int, int, int, int]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def output_folder(folder: str) -> str:
    """Create `folder` (and its parents) unless it is there; a symlink at `folder` or a non-folder is refused."""
    if os.path.islink(folder):
        raise FileExistsError(f"output folder {folder} is a symlink; nothing is written through it")
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise FileExistsError(f"output folder {folder} exists and is not a folder; it is kept")
    os.makedirs(folder, exist_ok=True)
    return folder


def write_file(path: str, content: Content) -> str:
    """Write `content` (bytes, or a function writing to a binary file) to `path` atomically, creating it or
    replacing only the file this process wrote there last (see the module's rules)."""
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    ours = (
        existing is not None
        and stat.S_ISREG(existing.st_mode)
        and _WRITTEN.get(os.path.abspath(path)) == (_identity(existing))
    )
    if existing is not None and not ours:
        kind = "a symlink" if stat.S_ISLNK(existing.st_mode) else "a file this run did not write"
        raise FileExistsError(f"{path} exists ({kind}); nothing is written through it (choose a new output)")
    tmp, fd = _open_temporary(path)
    try:
        with os.fdopen(fd, "wb") as out:
            content(out) if callable(content) else out.write(content)
            out.flush()
            os.fsync(out.fileno())
        if ours:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path, follow_symlinks=False)  # atomic, and fails if the name is taken by now
            except FileExistsError:
                raise FileExistsError(f"{path} exists; it is kept") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _WRITTEN[os.path.abspath(path)] = _identity(os.lstat(path))
    return path


def write_json(path: str, obj: Any) -> str:
    """`obj` as indented JSON through `write_file`."""
    return write_file(path, (json.dumps(obj, indent=1) + "\n").encode())


def _open_temporary(path: str) -> tuple[str, int]:
    folder, name = os.path.split(path)
    for _ in range(TEMP_NAME_TRIES):
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, CREATE_FLAGS, 0o644)
        except FileExistsError:  # a planted or left-over name: O_EXCL | O_NOFOLLOW refuse it, try another
            continue
    raise FileExistsError(f"{path}: no free temporary name next to it after {TEMP_NAME_TRIES} tries")
