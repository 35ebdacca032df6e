"""FedTopo against its baselines over several seeds, in ONE process on one thread (no Ray, no SuperNodes): the app's
own strategies and client functions driven by ``experiments.runner.in_process_grid.run_in_process`` (an in-process
Grid), with the suite's run config (experiments/suites/fedtopo.toml: its base file and methods). For when `flwr run`
with 20 simulated SuperNodes per run (experiments.runner) does not fit the time at hand; the tables come from the
same report code (``fl_app.report``: means with 95% t-intervals, differences paired by seed).

    python -m experiments.studies.fedtopo_inprocess --out experiments/results/fedtopo-inprocess --seeds 0,1,2 \
        --run-config "num-server-rounds=8 eval-every=4" --no-extra

Each run lives in OUT/runs/<label>/seed<N>/ (the app's outputs and a run.json in the runner's format); a finished
run whose run config equals the request is reused, so a stopped invocation continues where it stopped. Runs go
seed by seed, so whatever finishes forms complete paired seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

import torch

from experiments.runner import (
    COMPLETED,
    RUN_RECORD,
    add_run_config_option,
    data_location,
    data_record,
    make_summary_portable,
    portable_run_config,
    recorded_git_state,
    run_config_of,
)
from experiments.runner.in_process_grid import run_in_process
from fl_app.io.cli import comma_list, tool_parser
from fl_app.report import write_suite_tables
from fl_app.run.config import validate_run_config
from fl_app.run.outputs import write_json

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "experiments" / "suites" / "fedtopo.toml"
EXTRA_METHODS = {"fedtgp-max-pair": {"method": "fedtgp", "tgp-margin": "max-pair"}}  # the paper's printed margin


def suite_runs(seeds: list[int], extra: bool, overrides: dict | None = None) -> list[tuple[str, int, dict]]:
    suite = tomllib.loads(SUITE.read_text())
    base = tomllib.loads((ROOT / suite["suite"]["base-file"]).read_text())
    base.update(suite.get("base", {}))
    base["data-path"] = str(data_location(base["data-path"]))
    base["checkpoint-every"] = 0  # no resumes here: no model files
    base.update(overrides or {})
    methods = {**suite["methods"], **(EXTRA_METHODS if extra else {})}
    return [
        (label, seed, {**base, "method": label, **overrides, "seed": seed})
        for seed in seeds
        for label, overrides in methods.items()
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.studies.fedtopo_inprocess", __doc__)
    parser.add_argument("--out", required=True, type=Path, help="suite folder: runs/<label>/seed<N>/ and the tables")
    parser.add_argument("--seeds", type=comma_list(int, "seeds"), help="seeds, comma-separated (default: 0,1,2)")
    parser.add_argument("--clients", type=int, default=20, help="number of clients (the suite's num-supernodes)")
    parser.add_argument("--no-extra", action="store_true", help=f"skip {list(EXTRA_METHODS)}")
    add_run_config_option(parser, "run-config values of every run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = run_config_of(args)
    seeds = args.seeds or [0, 1, 2]
    args.out = args.out.resolve()  # the app wants an absolute output-dir
    torch.set_num_threads(1)
    commit, dirty = recorded_git_state()
    folders = []
    for label, seed, values in suite_runs(seeds, not args.no_extra, overrides):
        folder = args.out / "runs" / label / f"seed{seed}"
        run_config = {**values, "output-dir": str(folder)}
        kept, data = portable_run_config(run_config), data_record(run_config)  # records hold no path of this machine
        record_path = folder / RUN_RECORD
        if record_path.exists():
            record = json.loads(record_path.read_text())
            same_data = record.get("data", {}).get("sha256") == data.get("sha256")
            if record.get("status") == COMPLETED and record.get("run_config") == kept and same_data:
                print(f"{label:<16} seed={seed}  reuse", flush=True)
                folders.append(folder)
                continue
            raise SystemExit(f"{folder} holds another or an unfinished run: remove it or choose another --out")
        run = validate_run_config(run_config)
        folder.mkdir(parents=True)
        record = {
            "label": label,
            "cell": {},
            "seed": seed,
            "run_config": kept,
            "federation": {"num-supernodes": args.clients, "in-process": True},
            "data": data,
            "commit": commit,
            "dirty": dirty,
            "status": "running",
        }
        write_json(record_path, record)
        started, cpu = time.time(), time.process_time()
        run_in_process(run, args.clients)
        make_summary_portable(folder)
        write_json(
            record_path,
            {
                **record,
                "status": COMPLETED,
                "elapsed_seconds": round(time.time() - started, 1),
                "cpu_seconds": round(time.process_time() - cpu, 1),
            },
        )
        print(f"{label:<16} seed={seed}  done in {time.time() - started:.0f}s", flush=True)
        folders.append(folder)
    print(write_suite_tables(args.out, folders, reference="fedtopo", allow_mixed_commits=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
