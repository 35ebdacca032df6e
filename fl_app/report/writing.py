"""Writing a report: table.md and the CSV tables, the plots, each client's data plot; every file through
``fl_app.io.files.replace_file`` (a symlink at an output name is refused, never written through).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pandas as pd

from fl_app.io.cells import spreadsheet_cell
from fl_app.io.files import replace_file
from fl_app.report import client_plots, plots
from fl_app.report.plots import PLOTS
from fl_app.report.read import TABLE_FILES, MixedCommits, ReportError, load_run
from fl_app.report.tables import report
from fl_app.report.text import report_text


def csv_bytes(table: list[dict]) -> bytes:
    """The table as CSV, written as ``csv.DictWriter`` writes it (CRLF lines, nan for a missing value); a text cell
    that a spreadsheet would run as a formula is escaped (``spreadsheet_cell``)."""
    buffer = io.StringIO()
    table = [{key: spreadsheet_cell(value) for key, value in row.items()} for row in table]
    pd.DataFrame(table).to_csv(buffer, index=False, lineterminator="\r\n", na_rep="nan")
    return buffer.getvalue().encode()


def write_file(path: Path, content) -> Path:
    """Create or rewrite one output file (a symlink or folder at the name is refused: ``ReportError``)."""
    try:
        return replace_file(path, content)
    except FileExistsError as error:
        raise ReportError(str(error)) from None


def write_files(out: Path, files: dict[str, bytes]) -> None:
    """Create the folder ``out`` and write each file of ``files`` (name -> content) into it (``write_file``)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        write_file(out / name, content)


def write_tables(out: Path, tables: dict) -> str:
    """table.md (what is printed) and the CSV tables of ``TABLE_FILES`` that have rows."""
    out.mkdir(parents=True, exist_ok=True)
    text = report_text(tables)
    write_file(out / "table.md", (text + "\n").encode())
    for name, filename in TABLE_FILES.items():
        if tables.get(name):
            write_file(out / filename, csv_bytes(tables[name]))
    return text


def stale_files(out: Path, tables: dict, plotted: list[Path] | None = None) -> list[Path]:
    """Table files (and, after plotting, plot files) in ``out`` this report did not write: left from an earlier
    report, of other runs or of a quantity no longer reported; they are named, not removed."""
    stale = [out / f for name, f in TABLE_FILES.items() if not tables.get(name) and os.path.lexists(out / f)]
    if plotted is not None:
        stale += [out / name for name in PLOTS if out / name not in plotted and os.path.lexists(out / name)]
    return stale


def write_suite_tables(
    out: Path, folders: list[Path], reference: str | None = None, allow_mixed_commits: bool = False, plots: bool = True
) -> str:
    """The runner's last step: tables (and plots) of a suite's finished runs, written into its folder."""
    try:
        runs = [load_run(f) for f in folders]
        tables = report(runs, reference, allow_mixed_commits)
        text = write_tables(out, tables)
        if plots:
            write_plots(out, tables)
    except (MixedCommits, ValueError) as error:
        return f"no table written: {error}"
    return text


def write_plots(out: Path, tables: dict) -> list[Path]:
    """The summary plots (see ``fl_app.report.plots``), written into ``out``."""
    return plots.write_plots(out, tables, write_file)


def client_plot(folder: Path, out: Path) -> Path:
    """clients_<label>_seed<N>.png: every client's training labels (redrawn from the run config with the app's own
    partitioning; checked against the partition sizes clients.csv recorded) and its budget or model."""
    run = load_run(folder)
    counts, budgets, architectures = client_plots.client_partitions(run)
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", run.label + "".join(f"_{k}={v}" for k, v in run.cell.items()))
    out.mkdir(parents=True, exist_ok=True)
    figure = client_plots.figure_clients(run, counts, budgets, architectures)
    return write_file(out / f"clients_{name}_seed{run.seed}.png", plots.png_bytes(figure))
