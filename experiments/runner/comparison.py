"""Comparing runs' numbers: per file and metric, how many values of a new run differ from a committed run's
(``compare_run``), for ``verify`` and for ``compare`` (run folders made by other tools). Time and memory are never
compared."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from experiments.runner.records import read_rows
from experiments.runner.suite import SuiteMismatch

# columns and keys that measure the machine (time, memory), not the computation: never compared
MEASURED = re.compile(r"seconds|rss|peak|_mb$|^wall|elapsed|started")
# summary.json keys that say how a run was made (continued from a checkpoint), not what it computed
HOW_MADE = ("resumed_after_round",)
COMPARED_FILES = ("metrics.csv", "rounds.csv", "clients.csv", "summary.json")


@dataclass
class Finding:
    file: str
    metric: str
    values: int
    differing: int = 0
    largest: float = 0.0  # largest |new - committed| among numbers
    first: str = ""  # where the first difference is, e.g. "row 3: 0.351 -> 0.352"

    @property
    def equal(self) -> bool:
        return self.differing == 0


def _same(old, new, tolerance: float) -> tuple[bool, float]:
    """(equal, |difference|): numbers equal within ``tolerance`` (relative and absolute; 0 = the same float; NaN
    equals NaN), anything else equal as text."""
    try:
        a, b = float(old), float(new)
    except (TypeError, ValueError):
        return str(old) == str(new), 0.0
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b), 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance) if tolerance else a == b, abs(a - b)


def _leaves(value, where: str = "") -> dict:
    """A JSON value as {'a.b[2].c': leaf}."""
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _leaves(item, f"{where}.{key}" if where else key).items()
        }
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{where}[{i}]").items()}
    return {where: value}


def _summary(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: v for k, v in data.items() if k != "run_config"} if isinstance(data, dict) else None


ABSENT = "<absent>"


def _values(name: str, old, new) -> dict[str, dict[str, tuple]]:
    """metric -> {where: (committed value, new value)} for one file (rows of a CSV by position; summary.json keys
    with list positions folded into one metric, e.g. ``tiers[].accuracy``)."""
    out: dict[str, dict[str, tuple]] = {}
    if name.endswith(".csv"):
        for i in range(max(len(old), len(new))):
            rows = [table[i] if i < len(table) else {} for table in (old, new)]
            for column in dict.fromkeys([*rows[0], *rows[1]]):
                out.setdefault(column, {})[f"row {i + 1}"] = tuple(row.get(column, ABSENT) for row in rows)
    else:
        leaves = [_leaves(side) for side in (old, new)]
        for key in dict.fromkeys([*leaves[0], *leaves[1]]):
            metric = re.sub(r"\[\d+\]", "[]", key)
            out.setdefault(metric, {})[key] = tuple(side.get(key, ABSENT) for side in leaves)
    return out


def compare_run(committed: Path, new: Path, tolerance: float = 0.0) -> tuple[list[Finding], list[str]]:
    """Per file and metric (CSV column, or summary.json key), how many values of the new run differ from the
    committed run's; and the metrics only the new run has (recorded since, not compared). Time and memory
    (``MEASURED``), the round a run was continued after (``HOW_MADE``) and the run config are not compared."""
    findings, added = [], []
    for name in COMPARED_FILES:
        read = _summary if name == "summary.json" else read_rows
        old, now = read(committed / name), read(new / name)
        if old is None and now is None:
            continue
        if old is None or now is None:
            findings.append(Finding(name, "(file)", 1, 1, math.inf, f"missing in {committed if old is None else new}"))
            continue
        for metric, values in _values(name, old, now).items():
            if MEASURED.search(metric.split(".")[-1]) or metric in HOW_MADE:
                continue
            if all(pair[0] == ABSENT for pair in values.values()):
                added.append(f"{name} {metric}")
                continue
            finding = Finding(name, metric, len(values))
            for where, (before, after) in values.items():
                equal, difference = _same(before, after, tolerance)
                if not equal:
                    finding.differing += 1
                    finding.largest = max(finding.largest, difference)
                    finding.first = finding.first or f"{where}: {before} -> {after}"
            findings.append(finding)
    return findings, added


def report_comparison(pairs: list[tuple[str, Path, Path]], tolerance: float, printer=print) -> bool:
    """Compare (name, committed folder, new folder) pairs and print one line per run and one per differing metric;
    True when every compared value is equal (within ``tolerance``)."""
    rule = "bit-identical (tolerance 0)" if not tolerance else f"equal within {tolerance:g} (relative and absolute)"
    printer(f"comparing {len(pairs)} runs, numbers {rule}; time and memory are not compared", flush=True)
    all_equal = True
    for name, committed, new in pairs:
        findings, added = compare_run(committed, new, tolerance)
        differing = [f for f in findings if not f.equal]
        all_equal &= not differing and bool(findings)
        values = sum(f.values for f in findings)
        verdict = "EQUAL" if not differing and findings else "DIFFERS"
        printer(f"{verdict:<7} {name}: {len(findings)} metrics, {values} values ({committed} vs {new})", flush=True)
        if added:
            printer(f"        not in the committed run, not compared: {', '.join(added)}", flush=True)
        for f in findings:
            if not f.equal:
                printer(
                    f"        {f.file} {f.metric}: {f.differing} of {f.values} differ, largest |diff| {f.largest:.3g};"
                    f" first at {f.first}",
                    flush=True,
                )
    printer("all equal" if all_equal else "some numbers differ", flush=True)
    return all_equal


def run_folders(out: Path) -> dict[str, Path]:
    """OUT's finished run folders by their place under OUT (runs/<label>[@cell]/seed<N>, or any folder with a
    summary.json); interrupted copies are left out."""
    return {
        str(p.parent.relative_to(out)): p.parent
        for p in sorted(Path(out).rglob("summary.json"))
        if ".interrupted-" not in str(p) and p.parent != out
    }


def compare_folders(committed: Path, new: Path, tolerance: float = 0.0, printer=print) -> bool:
    """Compare every run of NEW with the run at the same place under COMMITTED (for runs made by other tools, e.g.
    experiments.studies.fedtopo_inprocess)."""
    new_runs, old_runs = run_folders(new), run_folders(committed)
    unmatched = [place for place in new_runs if place not in old_runs]
    if not new_runs or unmatched:
        raise SuiteMismatch(
            f"{new}: no run folders to compare" if not new_runs else f"no committed run for: {', '.join(unmatched)}"
        )
    return report_comparison([(place, old_runs[place], new_runs[place]) for place in new_runs], tolerance, printer)
