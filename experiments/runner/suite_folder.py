"""The suite folder OUT: ``OUT/suite.json`` says which suite its tables are of, and a request that would drop its
runs is refused (``check_suite_folder``); the committed results folders are refused unless asked for."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from experiments.runner.planning import PlannedRun, cell_suffix
from experiments.runner.records import ROOT, portable_run_config
from experiments.runner.suite import Suite, SuiteMismatch

RESULTS = ROOT / "experiments" / "results"  # the committed results: written only with --into-committed


def portable_suite_path(path: Path) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else resolved.name


def suite_record(suite: Suite, runs: list[PlannedRun], out: Path) -> dict:
    """OUT/suite.json: what the folder's tables are of."""
    return {
        "suite": portable_suite_path(suite.path),
        "suite_text": suite.path.read_text(),
        "reference": suite.reference,
        "seeds": suite.seeds,
        "methods": suite.methods,
        "base": portable_run_config(suite.base),
        "federation": suite.federation,
        "grid": suite.grid,
        "runs": [
            {"label": r.label, "cell": r.cell, "seed": r.seed, "folder": str(r.folder.relative_to(out))} for r in runs
        ],
    }


def run_key(label: str, cell: dict, seed: int) -> str:
    return f"{label}{cell_suffix(cell)} seed={seed}"


def check_suite_folder(suite: Suite, runs: list[PlannedRun], out: Path) -> None:
    """Refuse a request that would rewrite OUT's tables without runs OUT/suite.json records (a subset of methods or
    seeds, another suite), or against another reference. A request equal to the recorded suite, or one that only
    adds runs (seeds, methods, grid values), is accepted; changed settings of recorded runs are refused run by run
    (``plan``)."""
    try:
        recorded = json.loads((out / "suite.json").read_text())
    except OSError:
        return  # a new folder, or one made before suite.json existed
    except ValueError:
        raise SuiteMismatch(f"{out / 'suite.json'}: not valid JSON; use another --out") from None
    old_runs = {run_key(r["label"], r.get("cell", {}), r["seed"]): r for r in recorded.get("runs", [])}
    new_runs = {run_key(r.label, r.cell, r.seed) for r in runs}
    dropped = [key for key in old_runs if key not in new_runs]
    if not dropped and recorded.get("reference") == suite.reference:
        return
    now = suite_record(suite, runs, out)
    differences = [
        f"{key}: {recorded.get(key)!r} -> {now[key]!r}"
        for key in ("reference", "seeds", "methods", "grid")
        if recorded.get(key) != now[key]
    ]
    if _parsed_toml(recorded.get("suite_text", "")) != _parsed_toml(now["suite_text"]):
        differences.append(f"suite file: {recorded.get('suite')} -> {now['suite']} (settings differ)")
    raise SuiteMismatch(
        f"{out / 'suite.json'} records another suite ({'; '.join(differences) or 'other runs'}). "
        + (
            f"This request would rewrite its tables without {len(dropped)} runs: {', '.join(dropped)}. "
            if dropped
            else ""
        )
        + "Use another --out for a subset or another suite (or remove that suite.json to hand the folder over)."
    )


def _parsed_toml(text: str) -> dict | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def is_committed(out: Path) -> bool:
    """Whether OUT is one of the committed results folders (or the folder holding them)."""
    return Path(out).resolve().is_relative_to(Path(RESULTS).resolve())


def refuse_committed(out: Path, into_committed: bool) -> None:
    if is_committed(out) and not into_committed:
        raise SuiteMismatch(
            f"--out {out}: a committed results folder; running into it rewrites committed files. Train into a new "
            "folder (`verify` compares it with the committed runs), or pass --into-committed to update the committed "
            "results on purpose."
        )
