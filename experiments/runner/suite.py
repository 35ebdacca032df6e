"""A suite file (``experiments/suites/*.toml``): its sections and keys, read and checked (``load_suite``, errors
naming section and key), and the runner-only ``match-compute`` / ``match-flops`` entries (``match_sources``)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from experiments.runner.records import ROOT
from fl_app.run.config import METHODS

# a [methods] label names a folder under OUT/runs: letters, digits and . _ + - only, starting with a letter or digit
# (so never '..', a path separator or a hidden name)
SAFE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SAFE_LABEL_TEXT = "letters, digits and . _ + - (starting with a letter or digit)"
UNSAFE_IN_FOLDER_NAME = re.compile(r"[/\\\x00-\x1f]")  # grid values are written into folder names too
SUITE_SECTIONS = ("suite", "base", "federation", "methods", "grid")
SUITE_KEYS = ("seeds", "reference", "run-timeout", "description", "base-file", "lanes")
MATCH_COMPUTE = "match-compute"  # runner-only [methods] key: the label whose client training compute a run matches
# runner-only [methods] key beside match-compute: which FLOPs are matched, rounds.csv column -> (the column, what it
# is): the counted ones (FIARSE's kept MACs, the project's convention) or the executed ones (FIARSE's dense MACs,
# the FEAST repository's; other methods execute what they count)
MATCH_FLOPS = "match-flops"
MATCH_FLOPS_COLUMNS = {"counted": "client_train_flops", "executed": "client_train_flops_dense"}
RUNNER_ONLY = (MATCH_COMPUTE, MATCH_FLOPS)


@dataclass
class Suite:
    path: Path
    seeds: list[int]
    base: dict
    federation: dict
    methods: dict[str, dict]
    grid: dict[str, list]
    reference: str | None = None
    run_timeout: float = 3600.0
    description: str = ""
    matched: dict[str, tuple[str, str]] = field(default_factory=dict)  # match-compute label -> (reference, source)
    lanes: int = 1  # runs trained side by side (``lane_cpus``)


def load_suite(
    path: Path, seeds: list[int] | None = None, methods: list[str] | None = None, overrides: dict | None = None
) -> Suite:
    """Read and check a suite file; errors name the section and key. ``seeds``, ``methods`` (a subset of its
    labels, or plain method names) and ``overrides`` (run-config values over [base]) change it from the command
    line without editing it."""
    raw = tomllib.loads(Path(path).read_text())
    if seeds is not None:
        raw.setdefault("suite", {})["seeds"] = seeds
    if methods is not None:
        known = raw.get("methods", {})
        unknown = [m for m in methods if m not in known and m not in METHODS]
        if unknown:
            raise ValueError(f"--methods {unknown}: not in {path}'s [methods] {list(known)} nor a method name")
        sources = {m for label in methods for m in match_sources(known)[0].get(label, ()) if m not in methods}
        if sources:
            raise ValueError(
                f"--methods {methods}: match-compute labels among them read their rounds from {sorted(sources)}; "
                "name those too"
            )
        raw["methods"] = {m: known.get(m, {}) for m in methods}
        if raw.get("suite", {}).get("reference") not in raw["methods"]:
            raw.get("suite", {}).pop("reference", None)
    if overrides:
        raw["base"] = {**raw.get("base", {}), **overrides}
    errors = [f"unknown section [{s}]; allowed: {list(SUITE_SECTIONS)}" for s in raw if s not in SUITE_SECTIONS]
    head = raw.get("suite", {})
    errors += [f"[suite] unknown key '{k}'; allowed: {list(SUITE_KEYS)}" for k in head if k not in SUITE_KEYS]
    seeds = head.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and s >= 0 for s in seeds)) or len(
        set(seeds)
    ) != len(seeds):
        errors.append(f"[suite] seeds={seeds!r}: a non-empty list of distinct integers >= 0")
    methods = raw.get("methods", {})
    if not methods:
        errors.append("[methods]: name at least one method (label = {overrides})")
    for label, overrides in methods.items():
        if not SAFE_LABEL.fullmatch(label):
            errors.append(f"[methods] {label!r}: a label names a run folder; allowed: {SAFE_LABEL_TEXT}")
        elif not isinstance(overrides, dict):
            errors.append(f"[methods] {label}: expected a table of run-config overrides, e.g. {label} = {{}}")
        elif "method" not in overrides and label not in METHODS:
            errors.append(f"[methods] {label}: not a method name, so it must set method = one of {list(METHODS)}")
        elif any(k in overrides for k in ("seed", "output-dir")):
            errors.append(f"[methods] {label}: seed and output-dir are set by the runner")
    matched, match_errors = match_sources(methods)
    errors += match_errors
    grid = raw.get("grid", {})
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            errors.append(f"[grid] {key}: expected a non-empty list of values")
        elif any(UNSAFE_IN_FOLDER_NAME.search(f"{key}={v}") for v in values):
            errors.append(
                f"[grid] {key!r}: a key or value holds a path separator or control character (they name folders)"
            )
    base = raw.get("base", {})
    if "base-file" in head:  # a run-config TOML (e.g. experiments/conf/*.toml) under [base]; seeds come from [suite]
        base_file = ROOT / head["base-file"]
        if not base_file.is_file():
            errors.append(f"[suite] base-file='{head['base-file']}': no such file under {ROOT}")
        else:
            loaded = {k: v for k, v in tomllib.loads(base_file.read_text()).items() if k not in ("seed", "output-dir")}
            base = {**loaded, **base}
    if any(k in raw.get("base", {}) for k in ("seed", "output-dir")):
        errors.append("[base]: seed and output-dir are set by the runner ([suite] seeds)")
    lanes = head.get("lanes", 1)
    if not (isinstance(lanes, int) and not isinstance(lanes, bool) and lanes >= 1):
        errors.append(f"[suite] lanes={lanes!r}: how many runs train side by side; allowed: a whole number >= 1")
    reference = head.get("reference")
    if reference is not None and reference not in methods:
        errors.append(f"[suite] reference='{reference}': must be one of the [methods] labels {list(methods)}")
    if errors:
        raise ValueError(f"invalid suite {path}:\n  " + "\n  ".join(errors))
    return Suite(
        Path(path),
        seeds,
        base,
        raw.get("federation", {}),
        methods,
        grid,
        reference,
        float(head.get("run-timeout", 3600.0)),
        head.get("description", ""),
        matched,
        lanes if isinstance(lanes, int) else 1,
    )


def run_overrides(label: str, overrides: dict) -> dict:
    """A [methods] entry as run-config overrides: the method its label names, then its own keys but the runner's."""
    own = {k: v for k, v in overrides.items() if k not in RUNNER_ONLY}
    return {**({"method": label} if label in METHODS else {}), **own}


def match_sources(methods: dict) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """({label: (reference label, source label)} of the entries with ``match-compute``, errors). The source is the
    same method's equal-rounds run: the first label whose overrides equal the entry's without ``match-compute``."""
    entries = {label: o for label, o in methods.items() if isinstance(o, dict)}
    plain = [label for label, o in entries.items() if MATCH_COMPUTE not in o]
    matched, errors = {}, []
    for label, overrides in entries.items():
        if MATCH_COMPUTE not in overrides:
            continue
        reference = overrides[MATCH_COMPUTE]
        where = f"[methods] {label}: {MATCH_COMPUTE}={reference!r}"
        own = run_overrides(label, overrides)
        sources = [other for other in plain if run_overrides(other, entries[other]) == own]
        if reference == label:
            errors.append(f"{where}: a run cannot match its own compute; allowed: one of {plain}")
        elif not isinstance(reference, str) or reference not in plain:
            errors.append(f"{where}: not a [methods] label without {MATCH_COMPUTE}; allowed: one of {plain}")
        elif overrides.get(MATCH_FLOPS, "counted") not in MATCH_FLOPS_COLUMNS:
            errors.append(
                f"[methods] {label}: {MATCH_FLOPS}={overrides[MATCH_FLOPS]!r}; allowed: {list(MATCH_FLOPS_COLUMNS)}"
            )
        elif "num-server-rounds" in overrides:
            errors.append(f"{where}: sets num-server-rounds too; the runner sets the rounds of a matched run")
        elif not sources:
            errors.append(
                f"{where}: no [methods] label has its overrides without {MATCH_COMPUTE} ({own}); that equal-rounds "
                "run's FLOPs per round set its rounds, so add it"
            )
        elif sources[0] == reference:
            errors.append(f"{where}: its equal-rounds run is {reference} itself; it would repeat that run")
        else:
            matched[label] = (reference, sources[0])
    for label, overrides in entries.items():
        if MATCH_FLOPS in overrides and MATCH_COMPUTE not in overrides:
            errors.append(f"[methods] {label}: {MATCH_FLOPS} without {MATCH_COMPUTE}; it says which FLOPs are matched")
    return matched, errors


class SuiteMismatch(RuntimeError):
    pass
