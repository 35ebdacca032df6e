"""Wall time of the README's default run (`flwr run .`, 8 SuperNodes with one CPU each, the default run config) on
an older checkout and on this tree, one after the other, each against its own fresh local SuperLink.

    python -m experiments.bench_default_run --base /path/to/older/checkout            # old, then new
    python -m experiments.bench_default_run --base /path/to/older/checkout --order new,old

The committed result (``/work/exp``: a checkout of a104ce2): the two pairs one after the other,
``--base /work/exp --out A`` and ``--base /work/exp --order new,old --out B``, concatenated into
experiments/results/bench/default_run.json.

Each run is `experiments.flower_runs.flwr_run` from the tree's own folder (its code is the FAB that runs). Reports
per tree the wall time, the ServerApp's round loop, the sum of the clients' own seconds, the final tier accuracies
and the load average before and after (on a shared machine wall times follow the load: alternate the order).
Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_RUN = r"""
import csv, json, tempfile, time
from pathlib import Path
from experiments.flower_env import local_flower_env
from experiments.flower_runs import flwr_run
with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
    out = Path(tmp) / "out"
    started = time.perf_counter()
    _, status = flwr_run({"output-dir": str(out)}, "num-supernodes=8 client-resources-num-cpus=1", env=env,
                         timeout=3600)
    wall = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "rounds.csv") as handle:
        rows = list(csv.DictReader(handle))
    print(json.dumps({"status": status, "wall_s": round(wall, 1), "server_rounds_s": summary["wall_seconds"],
                      "client_s": round(sum(float(r["client_seconds"]) for r in rows), 1),
                      "tiers": [t["accuracy"] for t in summary["tiers"]],
                      "population_weighted_accuracy": summary.get("population_weighted_accuracy")}))
"""


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_default_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", type=Path, required=True, help="an older checkout of this project")
    parser.add_argument(
        "--order",
        type=lambda text: text.split(","),
        default=["old", "new"],
        help="comma-separated trees in the order they run, each old or new (default: old,new)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON lines to this file (default: none)")
    args = parser.parse_args(argv)
    if not args.order or any(name not in ("old", "new") for name in args.order):
        parser.error(f"--order {','.join(args.order)}: each item must be old or new")
    trees = {"old": args.base.resolve(), "new": ROOT}
    results = []
    for name in args.order:
        load = [round(x, 2) for x in os.getloadavg()]
        proc = subprocess.run(
            [sys.executable, "-c", ONE_RUN],
            cwd=trees[name],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(trees[name])},
        )
        if proc.returncode:
            raise RuntimeError(f"the {name} run failed:\n{proc.stderr[-3000:]}")
        results.append(
            {
                "tree": name,
                **json.loads(proc.stdout.strip().splitlines()[-1]),
                "load_start": load,
                "load_end": [round(x, 2) for x in os.getloadavg()],
            }
        )
        print(json.dumps(results[-1]), flush=True)
    for row in results:
        print(f"{row['tree']:<4} wall {row['wall_s']:>7.1f} s  clients {row['client_s']:>7.1f} s", file=sys.stderr)
    if args.out:
        args.out.write_text("".join(json.dumps(row) + "\n" for row in results))
    return results


if __name__ == "__main__":
    main()
