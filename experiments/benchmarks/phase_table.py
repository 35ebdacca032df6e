"""The table of where a round's time goes, generated from committed ``bench_overhead`` results that hold phases
(``*_phases_s``), into the block ``round-phases`` of a markdown file:

    B=experiments/results/bench
    python -m experiments.benchmarks.phase_table $B/overhead_phases.json $B/overhead_reference_regime.json \\
        $B/overhead_fedtopo_scarce.json --readme docs/development.md   # any bench_overhead results with phases

One line per setting: the round loop's seconds per round through Flower and in the plain loop (where the benchmark
had one) and their ratio, the work ratio (the round loop over the work its phase lines measure), then the seconds
per round of each server phase and per client call of each client phase (fl_app.run.phase_times). ``--check`` only
says whether the block is current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fl_app.io.cli import tool_parser
from fl_app.io.markdown import sync_blocks
from fl_app.report import markdown
from fl_app.run.phase_times import CLIENT_PHASES, SERVER_PHASES

BLOCK = "round-phases"
COMMAND = "python -m experiments.benchmarks.phase_table"


def setting_name(result: dict) -> str:
    """A result's setting in words: the suite's method, or the FEAST comparison's clients and rounds."""
    if "suite" in result:
        return f"`{result['method']}` of `{Path(result['suite']).name}`, {result['rounds']} rounds"
    return f"FEAST, {result['clients']} clients, {result['rounds']} rounds"


def table(results: list[tuple[str, dict]]) -> str:
    """The block's markdown: one line per (file name, result)."""
    head = ["result", "setting", "Flower s/round", "plain s/round", "rounds ratio", "work ratio"]
    head += [f"server {p}" for p in SERVER_PHASES] + [f"client {p}" for p in CLIENT_PHASES]
    lines = []
    for name, result in results:
        phases = result.get("flower_phases_s")
        if not phases or not phases["server"].get("lines"):
            raise ValueError(f"{name}: no phases (flower_phases_s with server lines); made by an older bench_overhead?")
        rounds, calls = phases["server"]["lines"], max(phases["client"]["lines"], 1)
        plain = result.get("plain_rounds_s")
        work = result.get("work_ratio", result.get("flower_work_ratio"))  # --suite's, or the FEAST comparison's
        cells = [
            f"`{name}`",
            setting_name(result),
            f"{result['flower_rounds_s'] / rounds:.2f}",
            "–" if plain is None else f"{plain / result['rounds']:.2f}",
            "–" if plain is None else f"{result['rounds_ratio']:.2f}",
            "–" if work is None else f"{work:.2f}",
        ]
        cells += [f"{phases['server'].get(p, 0.0) / rounds:.2f}" for p in SERVER_PHASES]
        cells += [f"{phases['client'].get(p, 0.0) / calls:.2f}" for p in CLIENT_PHASES]
        lines.append(cells)
    note = (
        "Seconds per round for the server phases (`clients`: waiting for the replies), per client call for the client "
        "phases; `work ratio`: the Flower round loop over the work its phase lines measure (server dispatch, "
        "aggregation, evaluation; clients' model, data, steps)."
    )
    return markdown(head, lines) + "\n\n" + note


def build_parser():
    parser = tool_parser("experiments.benchmarks.phase_table", __doc__)
    parser.add_argument("results", type=Path, nargs="+", help="bench_overhead JSON files with phases")
    parser.add_argument(
        "--readme", type=Path, required=True, help="markdown file with the round-phases block (required)"
    )
    parser.add_argument("--check", action="store_true", help="only say whether the block is current (default: off)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        results = [(path.name, json.loads(path.read_text().splitlines()[0])) for path in args.results]
        text = table(results)
    except (OSError, ValueError, KeyError, IndexError) as error:
        parser.error(str(error))
    shown = " ".join(str(p) for p in args.results)
    return sync_blocks(args.readme, {BLOCK: text}, f"{COMMAND} {shown} --readme {args.readme}", args.check)


if __name__ == "__main__":
    sys.exit(main())
