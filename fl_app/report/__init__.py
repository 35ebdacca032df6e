"""The report on run folders: tables (mean over seeds with 95% t-intervals, paired differences), their markdown, the
README blocks made of them, and the plots. ``python -m fl_app.report --help`` for the command (``cli``).

Modules, by concern: ``read`` (result folders, every field checked), ``rows`` (runs grouped into rows), ``stats``
(statistics only the report uses), ``tables`` (the tables), ``text`` (their markdown), ``readme`` (README blocks),
``writing`` (files), ``plots`` and ``client_plots`` (figures), ``cli``. This package re-exports what other code uses.
"""

from fl_app.report.cli import build_parser, main
from fl_app.report.read import (
    MATCHED_COLUMN,
    MixedCommits,
    ReportError,
    find_runs,
    images_per_round,
    load_run,
    read_table,
    settings,
)
from fl_app.report.readme import regenerate_readme
from fl_app.report.rows import Row
from fl_app.report.tables import paired_columns, report, total_compute
from fl_app.report.text import markdown, passes_markdown, percent, report_text, signed, tiers_markdown
from fl_app.report.writing import csv_bytes, write_file, write_files, write_suite_tables, write_tables

__all__ = [
    "MATCHED_COLUMN",
    "MixedCommits",
    "ReportError",
    "Row",
    "build_parser",
    "csv_bytes",
    "find_runs",
    "images_per_round",
    "load_run",
    "main",
    "markdown",
    "paired_columns",
    "passes_markdown",
    "percent",
    "read_table",
    "regenerate_readme",
    "report",
    "report_text",
    "settings",
    "signed",
    "tiers_markdown",
    "total_compute",
    "write_file",
    "write_files",
    "write_suite_tables",
    "write_tables",
]
