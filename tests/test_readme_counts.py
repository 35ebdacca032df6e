"""The README's test counts are the ones pytest collects: the whole suite, and the slow end-to-end tests that
``-m "not slow"`` leaves out."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.harness.collection import WHOLE_SUITE_COLLECTED

ROOT = Path(__file__).resolve().parents[1]


def collected(*args: str) -> tuple[int, int]:
    """(tests selected, tests deselected) by ``pytest --collect-only`` with ``args``."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    found = re.search(r"^(?:(\d+)/)?(\d+) tests? collected(?: \((\d+) deselected\))?", out, re.M)
    assert found, out[-2000:]
    selected, total, deselected = found.groups()
    return int(selected or total), int(deselected or 0)


def test_the_readme_counts_are_the_collected_tests():
    text = (ROOT / "README.md").read_text()
    stated = re.search(r"Install and run the tests \((\d+) tests, (\d+) of them the end-to-end tests", text)
    assert stated, "README: the tests paragraph must say '(N tests, M of them the end-to-end tests ...'"
    if WHOLE_SUITE_COLLECTED:  # this session collected the whole suite: its own count, before any deselection
        total, slow = WHOLE_SUITE_COLLECTED["total"], WHOLE_SUITE_COLLECTED["slow"]
    else:
        fast, slow = collected("-m", "not slow")  # one collection: what the marker keeps and what it leaves out
        total = fast + slow
    assert (int(stated.group(1)), int(stated.group(2))) == (total, slow), (
        f"README says {stated.group(1)} tests, {stated.group(2)} slow; pytest collects {total}, {slow} slow"
    )
