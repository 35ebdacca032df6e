"""Every results folder and file the Markdown documents point to exists.

Checked in every Markdown file git tracks or would add: relative links (``[text](path)``), and every path written
out as ``experiments/results/...`` (in ``experiments/README.md`` also ``results/...``), e.g. in a command's ``--out``.
Brace lists (``results/{compare,long}``) are expanded; a path with a glob (``*``) must match something; a path with a
placeholder (``<variant>``, ``FOLDER``) is checked up to the placeholder.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from tests.harness.repository import tracked_files

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH_CHARS = r"[\w.@=,{}<>*-]+"
RESULTS_PATH = re.compile(rf"(?<![\w/.-])((?:experiments/)?results/{PATH_CHARS}(?:/{PATH_CHARS})*)")
PLACEHOLDER = re.compile(r"<[^>]*>|^[A-Z][A-Z_]+$")


def expand(path: str) -> list[str]:
    """``a/{b,c}/d`` -> ``a/b/d``, ``a/c/d``."""
    parts = re.split(r"(\{[^}]*\})", path)
    options = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(choice) for choice in itertools.product(*options)]


def missing(base: Path, path: str) -> bool:
    """Whether ``path`` (under ``base``) names nothing, checked up to its first placeholder."""
    kept = []
    for part in path.split("/"):
        if PLACEHOLDER.search(part):
            break
        kept.append(part)
    if not kept:
        return False
    candidate = "/".join(kept)
    if "*" in candidate:
        return not any(base.glob(candidate))
    return not (base / candidate).exists()


def broken_references(name: str, text: str) -> list[str]:
    found = []
    folder = (ROOT / name).parent
    for match in LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not (folder / target).exists():
            found.append(f"{name}: link {match.group(1)}")
    for match in RESULTS_PATH.finditer(text):
        path = match.group(1).rstrip(".,")
        if not path.startswith("experiments/") and name != "experiments/README.md":
            continue  # a bare results/ elsewhere is some other folder (kvtranslate/results, a deployment's)
        base = ROOT if path.startswith("experiments/") else ROOT / "experiments"
        found += [f"{name}: path {one}" for one in expand(path) if missing(base, one)]
    return found


def test_the_check_reads_links_globs_braces_and_placeholders(tmp_path):
    assert broken_references("README.md", "[x](experiments/results/compare-seeds/README.md)") == []
    assert broken_references("README.md", "[x](experiments/results/no-such-folder/README.md)")
    assert broken_references("README.md", "--out experiments/results/long-seeds`") == [
        "README.md: path experiments/results/long-seeds"
    ]
    assert broken_references("README.md", "`experiments/results/{compare,nothing}/`") == [
        "README.md: path experiments/results/nothing"
    ]
    assert broken_references("README.md", "experiments/results/gamma-seeds/runs/*/seed1 and results/FOLDER") == []
    assert broken_references("README.md", "experiments/results/fedtopo/<variant>/summary.json.") == []


def test_every_results_folder_a_document_points_to_exists():
    found = []
    for name in tracked_files("*.md"):
        found += broken_references(name, (ROOT / name).read_text(errors="replace"))
    assert not found, "\n".join(found)
