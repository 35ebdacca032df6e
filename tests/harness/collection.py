"""What this test session collected, recorded by ``conftest.py`` so that a test can read it."""

from __future__ import annotations

# Set when the session collected the whole suite (pytest given no paths): the count of tests before -k or -m
# deselected any, and how many of them carry the slow mark. test_readme_counts reads it instead of collecting
# again in a subprocess.
WHOLE_SUITE_COLLECTED: dict[str, int] = {}
