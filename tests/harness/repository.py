"""The repository's own files, for the tests that check every committed file of a kind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tracked_files(*pathspecs: str) -> list[str]:
    """Names (relative to the repository) of the files git tracks or would add, narrowed to ``pathspecs``; the test
    is skipped outside a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *pathspecs],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]
