"""Files a deployment writes: private folders, sets of keys and certificates installed all or nothing, and the `flwr`
CLI's connection in ``$FLWR_HOME/config.toml`` edited in place.

- New folders are created with mode 0700 (they hold private keys, the SuperLink's state and the CLI's settings);
  folders that already exist are left as they are.
- ``install_file_set`` writes every file of a set into a fresh staging folder first and only then moves them into
  place, so a failure while generating or writing leaves the previous set untouched, and a failure while moving puts
  the previous files back: a CA never ends up beside a server key it did not sign.
- ``write_connection`` changes only the lines of its own connection (and of ``default`` when asked) and keeps
  everything else in ``config.toml``, comments included; it refuses to write through a symbolic link.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import stat
import tempfile
import tomllib
from pathlib import Path

import tomli_w

from fl_app.deploy.addresses import parse_address
from fl_app.io.files import fsync_dir, write_new_file

PRIVATE_DIR = 0o700
CONFIG_FILE = "config.toml"
CONFIG_FILE_MODE = 0o600  # a new config.toml; an existing one keeps its mode
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a TOML bare key: the connection name needs no quoting
CONNECTION_KEYS = ("address", "root-certificates", "insecure")  # what `write_connection` sets; other keys are kept
LOCAL_CONNECTION = {"address": ":local:"}  # what `flwr` itself writes into a fresh config.toml
_HEADER = re.compile(r"\s*\[")  # a table or array-of-tables header starts a new section


def make_private_dir(path: str | Path) -> Path:
    """Create ``path`` and every missing folder above it with mode 0700; folders that exist are left as they are.
    Returns ``path``; raises ``NotADirectoryError`` when something else is there."""
    path = Path(path)
    missing = []
    folder = path
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR)
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to change
        os.chmod(folder, PRIVATE_DIR)  # the umask may have removed bits that were asked for
    if not path.is_dir():
        raise NotADirectoryError(f"{path}: not a folder")
    return path


def refuse_existing(paths, force: bool) -> None:
    """Refuse to replace existing keys or certificates unless ``force``: one set is written whole or not at all (an
    old CA beside a new server key would not match)."""
    existing = [str(path) for path in paths if os.path.lexists(path)]
    if existing and not force:
        raise FileExistsError(
            f"{', '.join(existing)} already exist(s) and are kept; pass --force (force=True) to "
            "replace them (certificates and keys made or registered before then stop working)"
        )


def install_file_set(folder: str | Path, files: dict[str, tuple[bytes, int]], force: bool = False) -> list[Path]:
    """Write ``files`` (name -> (content, mode)) into ``folder`` as one set: all of them or none.

    Every file is first written into a fresh staging folder inside ``folder`` (created 0700, each file born with its
    final mode, see ``write_new_file``); only when all are written are they moved into place. Existing files are
    refused unless ``force``; with ``force`` each is replaced by a rename (a symlink at a name is replaced, never
    followed), and if a rename fails the files already moved are put back as they were."""
    folder = Path(folder)
    targets = {name: folder / name for name in files}
    refuse_existing(targets.values(), force)
    for path in targets.values():
        if path.is_dir() and not path.is_symlink():
            raise IsADirectoryError(f"{path} is a folder; a key or certificate file is expected there")
    make_private_dir(folder)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", suffix=".tmp", dir=folder))  # mode 0700
    try:
        for name, (data, mode) in files.items():
            write_new_file(staging / name, data, mode)
        previous = staging / ".previous"
        previous.mkdir()
        for name, path in targets.items():
            if os.path.lexists(path):
                _keep_copy(path, previous / name)
        moved: list[str] = []
        try:
            for name, path in targets.items():
                if force:
                    os.replace(staging / name, path)
                else:  # fails if the name was taken since the check above
                    os.link(staging / name, path, follow_symlinks=False)
                moved.append(name)
        except BaseException:
            for name in moved:  # put back what was there before
                if os.path.lexists(previous / name):
                    os.replace(previous / name, targets[name])
                else:
                    os.unlink(targets[name])
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    fsync_dir(folder)
    return list(targets.values())


def _keep_copy(path: Path, backup: Path) -> None:
    """A second name for ``path`` (a hard link; a copy where links are not supported), symlinks kept as links."""
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError:
        if path.is_symlink():
            os.symlink(os.readlink(path), backup)
        else:
            shutil.copy2(path, backup)


# ---------------------------------------------------------------------------------------------------------------
# The `flwr` CLI's connections ($FLWR_HOME/config.toml), edited in place
# ---------------------------------------------------------------------------------------------------------------
def check_connection_name(name: str) -> str:
    if not isinstance(name, str) or not BARE_KEY.fullmatch(name) or name == "default":
        raise ValueError(
            f"connection name {name!r}: letters, digits, '_' and '-' only, and not 'default' (superlink.default "
            "names the connection used when none is given)"
        )
    return name


def connection_entry(address: str, root_certificates: str | Path | None = None, insecure: bool = False) -> dict:
    """The ``[superlink.<name>]`` keys: the address and an absolute ``root-certificates`` path, or ``insecure``."""
    parse_address(address, "--address")  # before anything is written
    entry: dict = {"address": address}
    if insecure:
        entry["insecure"] = True
    else:
        if root_certificates is None:
            raise ValueError("a TLS connection needs root_certificates (the CA certificate)")
        entry["root-certificates"] = str(Path(root_certificates).resolve())
    return entry


def _table_header(*keys: str) -> re.Pattern:
    parts = r"\s*\.\s*".join(rf"(?:{re.escape(k)}|\"{re.escape(k)}\"|'{re.escape(k)}')" for k in keys)
    return re.compile(rf"\s*\[\s*{parts}\s*\]\s*(?:#.*)?")


def _section(lines: list[str], header: re.Pattern) -> tuple[int, int] | None:
    """(header line, end) of the table whose header matches, or None."""
    for start, line in enumerate(lines):
        if header.fullmatch(line.rstrip("\r\n")):
            end = next((i for i in range(start + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
            return start, end
    return None


def _key_line(keys) -> re.Pattern:
    names = "|".join(rf"{re.escape(k)}|\"{re.escape(k)}\"|'{re.escape(k)}'" for k in keys)
    return re.compile(rf"\s*(?:{names})\s*=")


def _set_keys(lines: list[str], header: re.Pattern, values: dict, drop: tuple[str, ...], new_table: str) -> list[str]:
    """In the table ``header`` matches: remove the lines that set one of ``drop`` and put ``values`` right after the
    header (other lines, comments included, stay as they are); a missing table is appended as ``new_table``."""
    text = tomli_w.dumps(values).splitlines(keepends=True)
    found = _section(lines, header)
    if found is None:
        if lines and not lines[-1].endswith("\n"):
            lines = [*lines[:-1], lines[-1] + "\n"]
        return [*lines, *(["\n"] if lines else []), f"[{new_table}]\n", *text]
    start, end = found
    setter = _key_line(drop)
    body = [line for line in lines[start + 1 : end] if not setter.match(line)]
    return [*lines[: start + 1], *text, *body, *lines[end:]]


def edit_connection(text: str, name: str, entry: dict, default: bool = False) -> str:
    """``text`` (a config.toml) with ``[superlink.<name>]`` set to ``entry`` and, with ``default``,
    ``superlink.default`` set to ``name``. Only those lines change; the result is checked by parsing it again, and a
    layout this edit cannot handle (e.g. the connection written as an inline table) raises ``ValueError``."""
    check_connection_name(name)
    if not text.strip():  # a fresh file: laid out as `flwr` lays out its own
        text = f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{LOCAL_CONNECTION["address"]}"\n'
    config = tomllib.loads(text)
    expected = copy.deepcopy(config)
    superlink = expected.setdefault("superlink", {})
    if not isinstance(superlink, dict) or not isinstance(superlink.get(name, {}), dict):
        raise ValueError(f"'superlink' or 'superlink.{name}' is not a table")
    lines = text.splitlines(keepends=True)
    default_name = name if default else None
    if "local" not in superlink:  # what `flwr` writes into a fresh config.toml, so `flwr run .` keeps working
        superlink["local"] = dict(LOCAL_CONNECTION)
        lines = _set_keys(lines, _table_header("superlink", "local"), LOCAL_CONNECTION, (), "superlink.local")
        if "default" not in superlink and default_name is None:
            default_name = "local"
    old = superlink.get(name, {})
    superlink[name] = {**{k: v for k, v in old.items() if k not in CONNECTION_KEYS}, **entry}
    lines = _set_keys(lines, _table_header("superlink", name), entry, CONNECTION_KEYS, f"superlink.{name}")
    if default_name is not None:
        superlink["default"] = default_name
        lines = _set_keys(lines, _table_header("superlink"), {"default": default_name}, ("default",), "superlink")
    edited = "".join(lines)
    try:
        ok = tomllib.loads(edited) == expected
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise ValueError(
            f"could not set [superlink.{name}] by editing the file line by line (it is laid out in a way this edit "
            f"does not handle, e.g. as an inline table or with dotted keys); add it by hand:\n"
            f"[superlink.{name}]\n{tomli_w.dumps(entry)}"
        )
    return edited


def write_connection(
    flwr_home: str | Path,
    name: str,
    address: str,
    root_certificates: str | Path | None = None,
    insecure: bool = False,
    default: bool = False,
) -> Path:
    """Add or update ``[superlink.<name>]`` in $FLWR_HOME/config.toml (see ``edit_connection``): the rest of the file,
    comments included, stays as it is. The file is replaced by a rename (never written through a symlink; a
    config.toml that is a symlink is refused); a new FLWR_HOME folder is created 0700 and a new file 0600."""
    check_connection_name(name)
    entry = connection_entry(address, root_certificates, insecure)
    home = make_private_dir(flwr_home)
    path = home / CONFIG_FILE
    if path.is_symlink():
        raise ValueError(
            f"{path} is a symbolic link; it is not written through (replace it by a regular file, or set "
            "--flwr-home to another folder)"
        )
    mode, text = CONFIG_FILE_MODE, ""
    if os.path.lexists(path):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            mode, raw = stat.S_IMODE(os.fstat(handle.fileno()).st_mode), handle.read()
        try:
            text = raw.decode()
            edited = edit_connection(text, name, entry, default)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from None
    else:
        edited = edit_connection("", name, entry, default)
    write_new_file(path, edited.encode(), mode, replace=True)
    return path
