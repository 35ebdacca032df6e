"""The commit a result was computed at and whether the checkout differed from it, as run records state them
(``commit``, ``dirty``): the suite runner's run.json (``experiments.runner.records``) and kvtranslate's study rows
(``experiments.translation.kvtranslate_retention``).

Dirty means: a file git tracks, under the paths asked about, differs from HEAD (changed, staged, deleted or
renamed). A file git does not track is not part of the commit's code and never counts: a run's own outputs, written
into the checkout while a suite trains, must not mark the next run of the suite dirty."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_state(root: str | Path, paths: tuple[str, ...] = ()) -> tuple[str | None, bool | None]:
    """(HEAD's commit, dirty) of the checkout at ``root``, dirty over ``paths`` (relative to ``root``; none: the
    whole checkout); (None, None) outside a git checkout or without git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            # no index refresh: other git processes may be working in the same checkout
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no", "--", *paths],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, bool(status.strip())
