"""Finding and stopping the processes a script or test started (Flower's SuperLink, SuperNodes and what they spawn,
Ray's daemons), through psutil: by process id, parent links, process groups and command lines, never by name alone.

Flower detaches the processes it spawns (SuperExec, ServerApp, ClientApp) into sessions of their own, so stopping a
process group is not enough: ``related_pids`` follows parent links and also finds processes whose command line names
one of the given markers (an address, a temporary folder) once their parent is gone.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Iterable

import psutil


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line joined by spaces) of every process this user may see."""
    table = {}
    for proc in psutil.process_iter(["ppid", "cmdline"]):
        info = proc.info
        table[proc.pid] = (info["ppid"] or 0, " ".join(info["cmdline"] or ()))
    return table


def marker_patterns(markers: Iterable[str]) -> list[re.Pattern]:
    # a marker ends where a host, port or path name ends: 127.0.0.1:80 does not match 127.0.0.1:8080
    return [re.compile(re.escape(m) + r"(?![\w.-])") for m in markers]


def related_pids(
    roots: Iterable[int], markers: tuple[str, ...] = (), programs: tuple[str, ...] = ("flwr", "flower")
) -> set[int]:
    """``roots``, all their descendants, and every process whose command line contains one of ``markers`` and one
    of ``programs`` (e.g. the SuperLink's address: detached SuperExec/ServerApp processes name it), with their
    descendants; never this process."""
    table = process_table()
    found = {pid for pid in roots if pid in table}
    patterns = marker_patterns(markers)
    found |= {
        pid
        for pid, (_, cmd) in table.items()
        if any(p in cmd for p in programs) and any(pattern.search(cmd) for pattern in patterns)
    }
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found - {os.getpid()}


def process_groups(markers: tuple[str, ...], programs: tuple[str, ...] = ()) -> set[int]:
    """Process groups (never this process's own) of running processes whose command line contains one of
    ``markers`` and, when ``programs`` are given, one of them."""
    groups = set()
    for pid, (_, cmd) in process_table().items():
        if any(m in cmd for m in markers) and (not programs or any(p in cmd for p in programs)):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                continue
    return groups - {os.getpgrp()}


def is_gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie waiting for its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def live_group_members(groups: set[int]) -> list[int]:
    """Pids of live (not zombie) processes in ``groups``."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) in groups:
                alive.append(proc.pid)
        except ProcessLookupError:
            continue
    return alive


def signal_groups(groups: Iterable[int], sig: int) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate(pids: set[int], groups: bool, timeout: float, reap=lambda: None) -> None:
    """SIGTERM ``pids`` (and, with ``groups``, their process groups, never this process's), wait up to ``timeout``
    seconds for them to go, then SIGKILL what is left. ``reap`` is called while waiting (to reap own children)."""
    pgids = set()
    if groups:
        for pid in pids:
            try:
                pgids.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
    pgids.discard(os.getpgrp())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_groups(pgids, sig)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reap()
            if all(is_gone(pid) for pid in pids):
                return
            time.sleep(0.2)
