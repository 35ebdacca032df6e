"""``runner verify``: retrain a suite's runs into a new folder and compare their numbers with the committed
runs of the same settings."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from experiments.runner.comparison import report_comparison
from experiments.runner.execution import run_suite
from experiments.runner.machine import differences as machine_differences
from experiments.runner.planning import PlannedRun, plan
from experiments.runner.records import read_record, recorded_git_state
from experiments.runner.suite import Suite, SuiteMismatch
from experiments.runner.suite_folder import is_committed, run_key


def verify(
    suite: Suite,
    committed: Path,
    out: Path,
    tolerance: float = 0.0,
    launch: Callable[[PlannedRun, float], str] | None = None,
    printer=print,
    shared_ray: bool = False,
) -> bool:
    """Train the suite's runs (usually a few seeds and methods of it) into the new folder OUT and compare their
    numbers with the committed folder's runs of the same settings; True when all are equal."""
    committed, out = Path(committed).resolve(), Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SuiteMismatch(f"--out {out}: exists and is not empty; verify trains into a new (or empty) folder")
    if is_committed(out):
        raise SuiteMismatch(f"--out {out}: in the committed results; verify trains into a new folder outside them")
    try:
        references = plan(suite, committed)
    except SuiteMismatch as error:
        raise SuiteMismatch(f"--committed {committed}: {error}") from None
    missing = [r for r in references if r.action != "reuse"]
    if missing:
        raise SuiteMismatch(
            f"--committed {committed} has no finished run with these settings for: "
            + ", ".join(run_key(r.label, r.cell, r.seed) for r in missing)
        )
    commits = sorted({(read_record(r.folder) or {}).get("commit", "unknown")[:7] for r in references})
    commit, dirty = recorded_git_state()
    printer(
        f"committed runs made at commit {', '.join(commits)}; this tree: {commit[:7]}{' (modified)' if dirty else ''}",
        flush=True,
    )
    result = run_suite(suite, out, launch=launch, printer=printer, plots=False, shared_ray=shared_ray)
    if result["failed"]:
        printer("some runs failed: nothing compared for them", flush=True)
    done = [(old, new) for old, new in zip(references, result["runs"]) if new not in result["failed"]]
    for old, new in done:
        changed = segment_differences(read_record(old.folder) or {}, (read_record(new.folder) or {}).get("machine"))
        if changed:
            printer(
                f"{run_key(new.label, new.cell, new.seed)}: made on another machine setup ("
                + "; ".join(changed)
                + "). Bit-identical numbers need the same kernels, threads and versions; with these differences "
                "expect the first round to agree to about 1e-5 (relative) and the final accuracy to differ by up "
                "to the seed-to-seed spread, since training amplifies the last bits",
                flush=True,
            )
    equal = report_comparison(
        [(run_key(new.label, new.cell, new.seed), old.folder, new.folder) for old, new in done], tolerance, printer
    )
    return equal and not result["failed"]


def segment_differences(committed: dict, machine: dict | None) -> list[str]:
    """``machine_differences`` between the committed run's machine and ``machine``; for a committed run continued
    on other machines (its ``earlier_segments``), those of each segment's machine, named by its rounds."""
    segments = [s for s in committed.get("earlier_segments") or [] if isinstance(s, dict)]
    if not segments:
        return machine_differences(committed.get("machine"), machine)
    own = {"rounds": [int(committed.get("resumed_after_round") or 0) + 1, "end"], "machine": committed.get("machine")}
    found = []
    for part in [*segments, own]:
        first, end = (part.get("rounds") or ["?", "?"])[:2]
        found += [f"rounds {first}-{end}: {d}" for d in machine_differences(part.get("machine"), machine)]
    return found
