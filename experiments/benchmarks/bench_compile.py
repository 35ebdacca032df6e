"""Does `torch.compile` pay off for a FEAST client on the CPU? Its compile time against the time it saves per step.

    python -m experiments.benchmarks.bench_compile            # the smallest budget level, one thread
    python -m experiments.benchmarks.bench_compile --level 5  # the largest of the default run's six levels

The committed result (OMP_NUM_THREADS=1 MKL_NUM_THREADS=1):

    python -m experiments.benchmarks.bench_compile --out experiments/results/bench/compile.json

One forward + backward of the routed model's largest subnet at a budget level of the default run (batch 32): the
first call of the compiled model (Dynamo tracing plus Inductor's C++ code generation and compilation, in CPU seconds
of this process and in wall seconds, which include Inductor's compile workers), then the median per-step time of the
eager and the compiled model, alternating. ``break_even_steps`` = compile wall time / time saved per step; a client
of the default run trains 40 steps per round, and every distinct subnet shape (the min and random subnets of a FEAST
step, each budget's routed model) compiles again. Prints one JSON line and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from experiments.benchmarks.common import add_out_option, refuse_existing_out, write_json_lines
from fl_app.io.cli import tool_parser


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.bench_compile", __doc__)
    parser.add_argument("--level", type=int, default=0, help="index of the budget level, cheapest first (default: 0)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default: 32)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed blocks of 5 steps (default: 5)")
    add_out_option(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_existing_out(parser, args.out)
    # a fresh Inductor cache: the compile time of a machine's first run (later runs may reuse compiled kernels)
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_compile_")

    import torch

    from experiments.benchmarks.bench_train import default_levels
    from fl_app.models.elastic_resnet import ElasticResNet
    from fl_app.run.config import validate_run_config
    from fl_app.supernet.shared_setup import SupernetSetup

    torch.set_num_threads(1)
    setup = SupernetSetup.build(validate_run_config({"supernet": "cpu"}), 8)
    budget = default_levels("cpu", 8)[args.level]
    bounds = setup.cache.route_bounds(budget)
    x = torch.randn(args.batch, 3, setup.cfg.initial_input_hw, setup.cfg.initial_input_hw)

    def model():
        torch.manual_seed(0)
        return ElasticResNet(setup.cfg, bounds).train()

    def step(forward):
        forward(x, bounds).square().sum().backward()

    eager = model()
    compiled = torch.compile(model())
    wall, cpu = time.perf_counter(), time.process_time()
    step(compiled)
    compile_wall, compile_cpu = time.perf_counter() - wall, time.process_time() - cpu
    times = {"eager": [], "compiled": []}
    for _ in range(2):
        step(eager)
        step(compiled)
    for _ in range(args.repeats):
        for name, forward in (("eager", eager), ("compiled", compiled)):
            started = time.process_time()
            for _ in range(5):
                step(forward)
            times[name].append((time.process_time() - started) / 5)
    eager_s, compiled_s = (statistics.median(times[k]) for k in ("eager", "compiled"))
    saved = eager_s - compiled_s
    result = {
        "budget_macs": int(budget),
        "batch": args.batch,
        "threads": 1,
        "compile_wall_s": round(compile_wall, 1),
        "compile_cpu_s": round(compile_cpu, 1),
        "eager_ms_per_step": round(1e3 * eager_s, 2),
        "compiled_ms_per_step": round(1e3 * compiled_s, 2),
        "speedup": round(eager_s / compiled_s, 3),
        "break_even_steps": round(compile_wall / saved) if saved > 0 else None,
    }
    shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps(result))
    print("\n".join(f"{k:<22} {v}" for k, v in result.items()), file=sys.stderr)
    write_json_lines(args.out, [result])
    return result


if __name__ == "__main__":
    main()
