"""Suite machine time with runs side by side on this machine's cores: one small suite trained several ways.

    python -m experiments.benchmarks.bench_lanes --out experiments/results/bench/lanes.json
    python -m experiments.benchmarks.bench_lanes --settings lanes-1,lanes-1-shared-ray,lanes-2-shared-ray --out F

- ``lanes-1``: one runner, one run at a time (Ray sees every core; the suite's clients train side by side);
- ``lanes-2``: one runner with ``--lanes 2`` (two runs side by side, each given half of the cores, so runs x parallel
  clients x threads stays within them);
- ``side-by-side-3``: three runners started together, each with one lane and a third of the suite's seeds: what
  running suites beside each other did before lanes (three runs, each with as many clients as the cores, on the
  cores of one);
- ``lanes-1-shared-ray``, ``lanes-2-shared-ray``: as ``lanes-1`` and ``lanes-2`` with ``--shared-ray`` (each lane's
  runs join one Ray head started for the suite instead of each starting and stopping its own Ray).

The suite is the smoke suite (`experiments/suites/smoke.toml`: bundled CIFAR-10 sample, tiny shapes, FEAST and
FedAvg-min, one thread per client) with ``--seeds`` seeds and ``--rounds`` rounds. Each client trains on one thread in
every setting, so every run must end with the same accuracies in all of them (``same_results``); only the time
differs.
Prints one JSON line: per setting the suite's wall time (``suite_s``), the sum and mean of its runs' own recorded wall
times (``runs_s``, ``run_mean_s``: what a run's record says it cost), and the load average at start and end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.benchmarks.common import add_out_option, refuse_existing_out, write_json_lines
from fl_app.io.cli import tool_parser

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "suites" / "smoke.toml"
SHARED_SUFFIX = "-shared-ray"
SETTINGS = ("lanes-1", "lanes-2", "side-by-side-3", "lanes-1" + SHARED_SUFFIX, "lanes-2" + SHARED_SUFFIX)


def suite_text(seeds: int, rounds: int) -> str:
    """The smoke suite with ``seeds`` seeds and ``rounds`` rounds."""
    text = SMOKE.read_text()
    for old, new in (
        ("seeds = [0, 1]\n", f"seeds = {list(range(seeds))}\n"),
        ("num-server-rounds = 2\n", f"num-server-rounds = {rounds}\n"),
    ):
        if old not in text:
            raise RuntimeError(f"{SMOKE}: expected the line {old.strip()!r}; update bench_lanes.suite_text")
        text = text.replace(old, new)
    return text


def runner(
    suite: Path, out: Path, lanes: int, seeds: list[int] | None = None, shared_ray: bool = False
) -> subprocess.Popen:
    command = [sys.executable, "-m", "experiments.runner", "run", str(suite), "--out", str(out), "--lanes", str(lanes)]
    if seeds is not None:
        command += ["--seeds", ",".join(map(str, seeds))]
    if shared_ray:
        command.append("--shared-ray")
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished_runs(outs: list[Path]) -> dict[str, dict]:
    """'label/seedN' -> (the run's recorded wall seconds, its final tier accuracies) over the suite folders."""
    runs = {}
    for out in outs:
        for summary in sorted(out.glob("runs/*/seed*/summary.json")):
            data = json.loads(summary.read_text())
            if not data.get("completed"):
                raise RuntimeError(f"{summary}: the run did not complete ({data.get('error')})")
            key = f"{summary.parent.parent.name}/{summary.parent.name}"
            runs[key] = {"wall_s": data["wall_seconds"], "tiers": data["tiers"]}
    return runs


def measure(name: str, groups: list[tuple[int, list[int] | None]], suite: Path, work: Path) -> dict:
    """Start one runner per (lanes, seeds) group at once and wait for all of them."""
    outs = [work / f"{name}-{i}" for i in range(len(groups))]
    load_start = list(os.getloadavg())
    started = time.perf_counter()
    shared = name.endswith(SHARED_SUFFIX)
    procs = [runner(suite, out, lanes, seeds, shared) for out, (lanes, seeds) in zip(outs, groups)]
    errors = [proc.communicate()[1] for proc in procs]
    suite_s = time.perf_counter() - started
    for proc, err in zip(procs, errors):
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: a runner failed ({proc.returncode}):\n{err[-3000:]}")
    runs = finished_runs(outs)
    walls = [run["wall_s"] for run in runs.values()]
    return {
        "suite_s": round(suite_s, 1),
        "runs": len(runs),
        "runs_s": round(sum(walls), 1),
        "run_mean_s": round(sum(walls) / len(walls), 1),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "_tiers": {key: run["tiers"] for key, run in runs.items()},
    }


def build_parser():
    parser = tool_parser("experiments.benchmarks.bench_lanes", __doc__)
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the suite, a multiple of 3 (default: 3)")
    parser.add_argument("--rounds", type=int, default=4, help="server rounds of each run (default: 4)")
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help=f"comma-separated settings to measure, lanes-1 among them (the reference); allowed: {', '.join(SETTINGS)} "
        "(default: all)",
    )
    add_out_option(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_existing_out(parser, args.out)
    if args.seeds < 3 or args.seeds % 3:
        parser.error(f"--seeds {args.seeds}: the three side-by-side runners split them evenly; allowed: 3, 6, 9, ...")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: allowed: 1 or more")
    chosen = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SETTINGS]
    if unknown or "lanes-1" not in chosen:
        parser.error(f"--settings {args.settings}: lanes-1 and any of {', '.join(SETTINGS)}")
    seeds = list(range(args.seeds))
    third = len(seeds) // 3
    groups = {
        "lanes-1": [(1, None)],
        "lanes-2": [(2, None)],
        "side-by-side-3": [(1, seeds[i * third : (i + 1) * third]) for i in range(3)],
    }
    groups.update({name + SHARED_SUFFIX: groups[name] for name in ("lanes-1", "lanes-2")})
    settings = {name: groups[name] for name in SETTINGS if name in chosen}
    with tempfile.TemporaryDirectory(prefix="bench_lanes_") as tmp:
        work = Path(tmp)
        suite = work / "suite.toml"
        suite.write_text(suite_text(args.seeds, args.rounds))
        measured = {name: measure(name, groups, suite, work) for name, groups in settings.items()}
    reference = measured["lanes-1"].pop("_tiers")
    same = all(m.pop("_tiers") == reference for name, m in measured.items() if name != "lanes-1")
    result = {
        "cores": os.cpu_count(),
        "seeds": args.seeds,
        "rounds": args.rounds,
        "runs": 2 * args.seeds,
        **measured,
        **{
            "speedup_" + name.replace("-", "_"): round(measured["lanes-1"]["suite_s"] / measured[name]["suite_s"], 3)
            for name in measured
            if name != "lanes-1"
        },
        "same_results": same,
    }
    print(json.dumps(result), flush=True)
    write_json_lines(args.out, [result])
    return result


if __name__ == "__main__":
    main()
