"""Local training against the processor's limit: images/s and achieved FLOP/s of one client step, and the machine's
measured peak for the same kind of work on the same threads.

    python -m experiments.benchmarks.bench_train                  # this tree, CPU-scale supernet, batch 32, one thread
    python -m experiments.benchmarks.bench_train --base BASE_DIR  # before/after: the old tree's step, interleaved
    python -m experiments.benchmarks.bench_train --profile        # plus where the time goes (torch.profiler)

The committed results (``BASE_DIR``: a checkout of the commit before the change measured; the closing notes name it):

    python -m experiments.benchmarks.bench_train --base BASE_DIR --workers 3 --steps 4 --repeats 3 \
        --out experiments/results/bench/train.json
    python -m experiments.benchmarks.bench_train --profile --workers 1 --steps 4 --repeats 2 --skip-fedtopo \
        --levels 490304,1339631,13538882 --out experiments/results/bench/train_profile.json
    python -m experiments.benchmarks.bench_train --base BASE_DIR --workers 3 --steps 4 --repeats 3 \
        --out experiments/results/bench/train_plain_reference.json    # with the plain reference (489c460)

The plain reference (on by default, ``--skip-plain`` to leave it out): the same FEAST step (``train_subnets`` with
the same plan, data and settings) on static dense models of plain ``nn.Conv2d`` / ``nn.BatchNorm2d`` with exactly each
subnet's shapes, no weight sharing and no slicing, in channels-last and contiguous activations, measured alternately
with the step in the same process. The faster of the two is ``plain_images_per_s``; ``of_plain`` = step / plain:
what this eager PyTorch does for these shapes on this processor. Separate dense models give the optimizer more
tensors than the shared supernet does, so forward + backward are also timed alone (``model_ms_per_step``,
``model_of_plain``), and ``eager_limit_images_per_s`` is the step with its forward + backward replaced by the plain
models' (or the whole plain step, if faster): the fastest eager form of each part. With ``--base``,
``plain_over_old`` and ``limit_over_old`` are what those forms give over the old step, and ``goal_over_limit`` how
far beyond the limit a 2x speed-up would be.

FEAST: the client step of ``clients.feast.train_subnets`` (local max + min + one random in-between subnet with
in-place KD, crop/flip augmentation, SGD) at every budget level of the default run (8 clients, Zipf budgets), on the
sub-supernet routed to that budget. FedTopo family: ``clients.fedtopo.local_train`` with the topology loss on the
first ``cpu`` family architecture. FLOPs are analytic (``torch.utils.flop_counter``: convolutions and matmuls of
forward and backward, counted over exactly the timed steps). Peaks: a large matmul and a large convolution
timed in the same process with the same threads, in fp32 (bf16 with ``--bf16``). ``ratio`` = achieved / matmul peak.

With ``--base``, each repeat runs one worker process on the old tree and one on this tree, alternating, and the
medians over repeats are reported side by side (``speedup`` = new / old images/s), so both sides see the same load.
Prints one JSON line (and the load average at start and end, since the machine may be shared) and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fl_app.io.cli import tool_parser
from fl_app.io.files import existing_output, write_own_file

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CLIENTS = 8  # the README's default federation
# activation layouts of the plain reference; the faster one is the reference (the supernet itself uses channels-last)
PLAIN_LAYOUTS = {"plain_channels_last": "channels_last", "plain_contiguous": "contiguous_format"}
# where a module lived before fl_app's subpackages, so that --base can measure a checkout from before them
FORMERLY = {"fl_app.run.config": "fl_app.config", "fl_app.supernet.federation": "fl_app.federation"}
FORMERLY["fl_app.data.images"] = "fl_app.data"
FORMERLY["fl_app.supernet.shared_setup"] = "fl_app.supernet.federation"  # its class was Federation there


def _module(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return _module(FORMERLY[name]) if FORMERLY[name] in FORMERLY else importlib.import_module(FORMERLY[name])


def _supernet_setup(run, clients: int):
    """``SupernetSetup.build`` (``Federation.build`` in a checkout from before its rename)."""
    module = _module("fl_app.supernet.shared_setup")
    return (getattr(module, "SupernetSetup", None) or module.Federation).build(run, clients)


def _timed(fn, repeats: int, clock=time.perf_counter) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        started = clock()
        fn()
        times.append(clock() - started)
    return statistics.median(times)


def machine_peaks(device, repeats: int = 3, size: int = 1024, dtype=None) -> dict:
    """GFLOP/s of a large dense matmul and a large 3x3 convolution (forward) on ``device``."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    x = torch.randn(32, 128, 16, 16, device=device, dtype=dtype)
    w = torch.randn(128, 128, 3, 3, device=device, dtype=dtype)

    def matmul():
        a @ b
        sync()

    def conv():
        F.conv2d(x, w, padding=1)
        sync()

    matmul_flops = 2 * size**3
    conv_flops = 2 * 32 * 128 * 128 * 9 * 16 * 16
    clock = time.perf_counter if device.type == "cuda" else time.process_time  # as in _measure
    return {
        "matmul_gflops": round(matmul_flops / _timed(matmul, repeats, clock) / 1e9, 2),
        "conv_gflops": round(conv_flops / _timed(conv, repeats, clock) / 1e9, 2),
    }


def default_levels(supernet: str, clients: int) -> list[float]:
    """The distinct client budgets (MACs) of the default run config with ``clients`` clients, cheapest first."""
    run = _module("fl_app.run.config").validate_run_config({"supernet": supernet})
    return sorted({float(b) for b in _supernet_setup(run, clients).budgets})


def random_images(n: int, num_classes: int, hw: int, seed: int = 0):
    """``n`` seeded random uint8 images with random labels."""
    import torch

    ImageData = _module("fl_app.data.images").ImageData
    gen = torch.Generator().manual_seed(seed)
    return ImageData(
        torch.randint(0, 256, (n, 3, hw, hw), dtype=torch.uint8, generator=gen),
        torch.randint(0, num_classes, (n,), generator=gen),
    )


def step_settings(batch: int, steps: int, seed: int = 0):
    """The benchmarked client step: one epoch capped at ``steps`` batches, crop/flip, no Mixup/CutMix, KD 0.5."""
    from clients.feast import LocalSettings  # clients.feast has it in every checkout --base may name

    return LocalSettings(
        epochs=1,
        max_steps=steps,
        batch_size=batch,
        lr=0.05,
        momentum=0.9,
        weight_decay=5e-4,
        kd_ratio=0.5,
        crop_flip=True,
        randaugment=False,
        mixup_alpha=0.0,
        cutmix_alpha=0.0,
        seed=seed,
    )


def _autocast(device, bf16: bool):
    import contextlib

    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _measure(steps_by_name: dict, steps: int, batch: int, repeats: int, device) -> dict:
    """images/s (median over repeats) and analytic FLOPs of each ``step(steps)`` of ``steps_by_name``, each of which
    trains ``steps`` batches; the repeats alternate between the steps, so that all see the same load.

    On the CPU the clock is this process's CPU time (one thread: the time it actually computed, which other
    processes sharing the cores do not inflate); ``images_per_s_wall`` is wall time. On CUDA both are wall time."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    flops, times, walls = {}, {}, {}
    for name, step in steps_by_name.items():
        step(1)  # warm-up: allocator, kernels
        with FlopCounterMode(display=False) as counter:
            step(steps)
        flops[name], times[name], walls[name] = counter.get_total_flops(), [], []
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            sync()
            started, wall_started = clock(), time.perf_counter()
            step(steps)
            sync()
            times[name].append(clock() - started)
            walls[name].append(time.perf_counter() - wall_started)
    rows = {}
    for name in steps_by_name:
        seconds = statistics.median(times[name])
        rows[name] = {
            "images_per_s": round(steps * batch / seconds, 1),
            "gflops": round(flops[name] / seconds / 1e9, 3),
            "gflop_per_step": round(flops[name] / steps / 1e9, 4),
            "images_per_s_wall": round(steps * batch / statistics.median(walls[name]), 1),
        }
    return rows


def feast_step(cfg, cache, budget: float, batch: int, device, bf16: bool, plain_layout=None):
    """A function ``step(n)`` that runs ``n`` FEAST client steps on the sub-supernet routed to ``budget``; with
    ``plain_layout`` (a memory format's name), the same step on ``plain_subnets`` in that activation layout."""
    import torch

    from clients.feast import plan_subnets, train_subnets
    from fl_app.models.elastic_resnet import ElasticResNet

    torch.manual_seed(0)
    bounds = cache.route_bounds(budget)
    plan = plan_subnets(cache, budget, bounds, ("max", "min", "random"))
    model = ElasticResNet(cfg, bounds) if plain_layout is None else plain_subnets(cfg, plan, plain_layout)
    data_by_steps = {}

    def step(n: int):
        if n not in data_by_steps:
            data_by_steps[n] = random_images(n * batch, cfg.n_classes, cfg.initial_input_hw)
        with _autocast(device, bf16):
            train_subnets(model, plan, data_by_steps[n], step_settings(batch, n))

    step.model = model
    return step, plan


def plain_resnet(cfg, arch, layout: str = "channels_last"):
    """The subnet ``arch`` as a static model of plain ``nn.Conv2d`` / ``nn.BatchNorm2d`` / ``nn.Linear`` with exactly
    its shapes: no prefix slices, no dynamic widths. Its state dict has the names and shapes of ``arch``'s extracted
    ``ElasticResNet``, so the two load each other's weights and compute the same logits (tested). ``layout``: the
    activations' memory format (a ``torch`` attribute name)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    memory_format = getattr(torch, layout)

    def conv_bn(c_in, c_out, kernel, stride=1):
        conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
        return conv, nn.BatchNorm2d(c_out)

    class PlainBlock(nn.Module):
        def __init__(self, c_in, mid, out, stride, projection):
            super().__init__()
            self.stride = stride
            self.conv1, self.bn1 = conv_bn(c_in, mid, 3, stride)
            self.conv2, self.bn2 = conv_bn(mid, out, 3)
            if projection:
                self.shortcut_conv, self.shortcut_bn = conv_bn(c_in, out, 1)
            else:
                self.shortcut_conv = None

        def forward(self, x):
            h = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)), inplace=True)))
            if self.shortcut_conv is None:
                return F.relu(h.add_(x), inplace=True)
            pooled = F.avg_pool2d(x, self.stride) if self.stride > 1 else x
            return F.relu(h.add_(self.shortcut_bn(self.shortcut_conv(pooled))), inplace=True)

    class PlainResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = cfg
            stem = cfg.stem_channels(arch)
            self.stem_conv, self.stem_bn = conv_bn(cfg.initial_input_channels, stem, 3, cfg.stem_stride)
            self.stages = nn.ModuleList()
            c_in = stem
            for s in range(cfg.num_stages):
                out, mid = cfg.stage_channels(arch, s), cfg.mid_channels(arch, s)
                blocks = nn.ModuleList()
                for b in range(1 + arch.d[s]):
                    stride = cfg.stage_downsample_factors[s] if b == 0 else 1
                    blocks.append(PlainBlock(c_in if b == 0 else out, mid, out, stride, projection=b == 0))
                self.stages.append(blocks)
                c_in = out
            self.classifier = nn.Linear(c_in, cfg.n_classes)

        def forward(self, x):
            x = F.relu(self.stem_bn(self.stem_conv(x.contiguous(memory_format=memory_format))), inplace=True)
            for blocks in self.stages:
                for block in blocks:
                    x = block(x)
            return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return PlainResNet()


def plain_subnets(cfg, plan, layout: str = "channels_last"):
    """One plain static model per subnet of ``plan``, called as ``model(x, arch)`` like the supernet, so that
    ``clients.feast.train_subnets`` runs the same step (augmentation, KD, clipping, SGD) on dense models: the
    fastest eager form of the same work, without weight sharing or slicing."""
    import torch.nn as nn

    archs = [plan.largest] + ([plan.smallest] if plan.smallest is not None else []) + list(plan.between)

    class PlainSubnets(nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = cfg
            self.archs = archs
            self.models = nn.ModuleList(plain_resnet(cfg, arch, layout) for arch in archs)

        def forward(self, x, arch):
            return self.models[self.archs.index(arch)](x)

    return PlainSubnets()


def fedtopo_step(batch: int, device, bf16: bool):
    import torch

    from clients.fedtopo import local_train, topology_loss
    from fl_app.models.multiarch import architecture_of, client_model

    torch.manual_seed(0)
    model = client_model("cpu", 0, 10, 64).to(device)
    topology = torch.zeros(10, 10, device=device)
    data_by_steps = {}

    def loss_fn(logits, features, labels):
        return topology_loss(logits, labels, topology, 0.5)

    def step(n: int):
        if n not in data_by_steps:
            data_by_steps[n] = random_images(n * batch, 10, 32)
        with _autocast(device, bf16):
            local_train(model, data_by_steps[n], step_settings(batch, n), loss_fn)

    return step, architecture_of("cpu", 0)


# -- where the time goes ---------------------------------------------------------------------------------------------
CATEGORIES = (
    ("convolution", ("conv",)),
    ("batch_norm", ("batch_norm",)),
    (
        "slicing_copies",
        (
            "slice",
            "as_strided",
            "copy_",
            "contiguous",
            "clone",
            "zeros",
            "zero_",
            "fill_",
            "empty",
            "select",
            "index",
            "narrow",
            "view",
            "t",
            "transpose",
            "_to_copy",
        ),
    ),
    ("optimizer_ops", ("_foreach", "linalg_vector_norm")),
)


def cpu_phases(step, steps: int) -> tuple[dict, float]:
    """This thread's CPU seconds per phase of ``step(steps)`` (augmentation = crop/flip + normalisation, forward of
    ``step.model``, backward, optimizer = gradient clipping + SGD step) and in all, after one warm-up step."""
    import torch

    import clients.feast as feast
    import clients.local_training as local_training

    # where the step looks up its augmentation: local_training's batch loop, or clients.feast in older trees
    augmenting = local_training if hasattr(local_training, "augmented_batches") else feast
    spent: dict[str, float] = {}

    def timed(fn, phase):
        def wrapper(*args, **kwargs):
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.thread_time() - started

        return wrapper

    patches = [
        (augmenting, "crop_flip", "augmentation"),
        (augmenting, "normalize", "augmentation"),
        (type(step.model), "forward", "forward"),
        (torch.Tensor, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "optimizer"),
        (getattr(feast, "MomentumSGD", torch.optim.SGD), "step", "optimizer"),  # older trees: torch's
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    step(1)
    try:
        for owner, name, phase in patches:
            setattr(owner, name, timed(getattr(owner, name), phase))
        started = time.thread_time()
        step(steps)
        total = time.thread_time() - started
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    return spent, total


def profile_step(step, steps: int) -> dict:
    """Where a client step's time goes, two ways that hold up on a shared machine.

    ``cpu_share``: this thread's CPU time per phase (``cpu_phases``; other = batch indexing, losses, the Python
    loop), so time spent waiting for a core is not counted. ``op_share``: torch.profiler self time per kind of aten
    op, as a share of all ops' time (convolutions forward and backward, BatchNorm, slicing/copies/allocation, foreach
    optimizer kernels, other ops)."""
    from torch.profiler import ProfilerActivity, profile

    spent, total = cpu_phases(step, steps)
    cpu_share = {k: round(v / total, 3) for k, v in sorted(spent.items())}
    cpu_share["other"] = round(1 - sum(spent.values()) / total, 3)

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(steps)
    ops: dict[str, float] = {}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        op = event.key.removeprefix("aten::")
        category = next(
            (c for c, keys in CATEGORIES if any(k == op or (len(k) > 2 and k in op) for k in keys)), "other_ops"
        )
        ops[category] = ops.get(category, 0.0) + event.self_cpu_time_total
    op_total = sum(ops.values())
    return {
        "cpu_ms_per_step": round(1e3 * total / steps, 2),
        "cpu_share": cpu_share,
        "op_share": {k: round(v / op_total, 3) for k, v in sorted(ops.items())},
    }


# -- one worker: everything measured in one process -------------------------------------------------------------------
def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    run = _module("fl_app.run.config").validate_run_config({"supernet": args.supernet})
    setup = _supernet_setup(run, DEFAULT_CLIENTS)
    levels = args.levels or sorted({float(b) for b in setup.budgets})
    # the peak in the precision the step computes in: bf16 matmuls/convolutions under --bf16
    result = {
        "peak": machine_peaks(device, dtype=torch.bfloat16 if args.bf16 else torch.float32),
        "feast": [],
        "fedtopo": None,
    }
    for budget in levels:
        step, plan = feast_step(setup.cfg, setup.cache, budget, args.batch, device, args.bf16)
        steps_by_name = {"supernet": step}
        if not args.skip_plain:
            for layout, memory_format in PLAIN_LAYOUTS.items():
                steps_by_name[layout] = feast_step(
                    setup.cfg, setup.cache, budget, args.batch, device, args.bf16, memory_format
                )[0]
        rows = _measure(steps_by_name, args.steps, args.batch, args.repeats, device)
        row = {"budget_macs": int(budget), **rows.pop("supernet")}
        if rows:
            row["plain"] = {layout: r["images_per_s"] for layout, r in rows.items()}
            # forward + backward alone, where weight sharing and slicing live (separate dense models also give
            # the optimizer more tensors to step)
            row["model_ms_per_step"] = {}
            for name, timed_step in steps_by_name.items():
                spent, _ = cpu_phases(timed_step, args.steps)
                row["model_ms_per_step"][name] = round(1e3 * (spent["forward"] + spent["backward"]) / args.steps, 2)
        if args.profile:
            row["profile"] = profile_step(step, args.steps)
        result["feast"].append(row)
    if not args.skip_fedtopo:
        step, name = fedtopo_step(args.batch, device, args.bf16)
        rows = _measure({"fedtopo": step}, args.steps, args.batch, args.repeats, device)
        result["fedtopo"] = {"architecture": name, **rows["fedtopo"]}
    return result


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _median_rows(runs: list[dict], batch: int) -> dict:
    """Per-measurement medians over worker runs (same structure as one run)."""

    def med(values):
        return round(statistics.median(values), 3)

    out = {"peak": {k: med([r["peak"][k] for r in runs]) for k in runs[0]["peak"]}, "feast": []}
    for i, row in enumerate(runs[0]["feast"]):
        merged = {"budget_macs": row["budget_macs"], "gflop_per_step": row["gflop_per_step"]}
        for key in ("images_per_s", "gflops", "images_per_s_wall"):
            merged[key] = med([r["feast"][i][key] for r in runs])
        merged["ratio"] = round(merged["gflops"] / out["peak"]["matmul_gflops"], 4)
        if "plain" in row:
            merged["plain"] = {k: med([r["feast"][i]["plain"][k] for r in runs]) for k in row["plain"]}
            merged["plain_images_per_s"] = max(merged["plain"].values())  # the faster layout
            merged["of_plain"] = round(merged["images_per_s"] / merged["plain_images_per_s"], 3)
            model_ms = {k: med([r["feast"][i]["model_ms_per_step"][k] for r in runs]) for k in row["model_ms_per_step"]}
            merged["model_ms_per_step"] = model_ms
            plain_ms = min(v for k, v in model_ms.items() if k != "supernet")
            merged["model_of_plain"] = round(plain_ms / model_ms["supernet"], 3)
            # the fastest eager form of each part: the step with its forward + backward replaced by the plain
            # models' (its optimizer keeps the supernet's shared tensors), or the whole plain step if faster
            step_ms = 1e3 * batch / merged["images_per_s"]
            mixed = 1e3 * batch / (step_ms - model_ms["supernet"] + plain_ms)
            merged["eager_limit_images_per_s"] = round(max(merged["plain_images_per_s"], mixed), 1)
            merged["of_eager_limit"] = round(merged["images_per_s"] / merged["eager_limit_images_per_s"], 3)
        if "profile" in row:
            merged["profile"] = row["profile"]
        out["feast"].append(merged)
    if runs[0].get("fedtopo"):
        top = runs[0]["fedtopo"]
        out["fedtopo"] = {
            "architecture": top["architecture"],
            "gflop_per_step": top["gflop_per_step"],
            **{k: med([r["fedtopo"][k] for r in runs]) for k in ("images_per_s", "gflops", "images_per_s_wall")},
        }
        out["fedtopo"]["ratio"] = round(out["fedtopo"]["gflops"] / out["peak"]["matmul_gflops"], 4)
    return out


def _worker_command(args, root: Path) -> tuple[list[str], dict]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--supernet",
        args.supernet,
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
        "--device",
        args.device,
        "--levels",
        ",".join(str(b) for b in args.levels),
    ]
    command += [
        flag
        for flag, on in (
            ("--bf16", args.bf16),
            ("--profile", args.profile),
            ("--skip-fedtopo", args.skip_fedtopo),
            ("--skip-plain", args.skip_plain),
        )
        if on
    ]
    threads = str(args.threads)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return command, env


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.bench_train", __doc__)
    parser.add_argument("--supernet", default="cpu", help="named supernet (default: cpu)")
    parser.add_argument("--batch", type=int, default=32, help="batch size of the client step (default: 32)")
    parser.add_argument("--steps", type=int, default=5, help="client steps per timed call (default: 5)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per worker, median (default: 3)")
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes per tree, alternating with --base (default: 1)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each worker (default: 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast around the client step (default: off)")
    parser.add_argument(
        "--base", type=Path, help="a checkout of the code before a change, measured alternately (default: none)"
    )
    parser.add_argument(
        "--levels",
        type=lambda text: [float(v) for v in text.split(",") if v],
        default=[],
        help="comma-separated budgets in MACs (default: the default run's levels)",
    )
    parser.add_argument("--profile", action="store_true", help="also where the time goes (default: off)")
    parser.add_argument("--skip-fedtopo", action="store_true", help="skip the FedTopo-family step (default: off)")
    parser.add_argument(
        "--skip-plain", action="store_true", help="skip the plain dense reference of each FEAST step (default: off)"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file (default: none)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    # experiments.benchmarks.common's convention, written out: a --worker runs this file on the checkout --base
    # names, which may predate that module
    problem = args.out and existing_output(args.out)
    if problem:
        parser.error(problem)
    if args.worker:
        print(json.dumps(worker(args)))
        return {}
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device visible")

    if not args.levels:
        args.levels = default_levels(args.supernet, DEFAULT_CLIENTS)
    trees = {"new": ROOT} if args.base is None else {"old": args.base.resolve(), "new": ROOT}
    load_start = _load()
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.workers):
        for name, root in trees.items():
            command, env = _worker_command(args, root)
            out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=root)
            if out.returncode != 0:
                raise RuntimeError(f"worker on {root} failed:\n{out.stderr[-3000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {
        "supernet": args.supernet,
        "batch": args.batch,
        "threads": args.threads,
        "device": args.device,
        "bf16": args.bf16,
        "steps": args.steps,
        "repeats": args.repeats,
        "workers": args.workers,
        "flops": "analytic (torch.utils.flop_counter), forward + backward",
        **{name: _median_rows(r, args.batch) for name, r in runs.items()},
    }
    if "old" in result:
        result["speedup"] = [
            round(n["images_per_s"] / o["images_per_s"], 2)
            for o, n in zip(result["old"]["feast"], result["new"]["feast"])
        ]
        if "plain_images_per_s" in result["new"]["feast"][0]:
            # the most the fastest eager form of the same work gives over the old step; the 2x goal needs
            # goal_over_limit (= 2 / limit_over_old) times more than that form does
            for key, field in (
                ("plain_over_old", "plain_images_per_s"),
                ("limit_over_old", "eager_limit_images_per_s"),
            ):
                result[key] = [
                    round(n[field] / o["images_per_s"], 2)
                    for o, n in zip(result["old"]["feast"], result["new"]["feast"])
                ]
            result["goal_over_limit"] = [round(2 / r, 2) for r in result["limit_over_old"]]
        if result["new"].get("fedtopo"):
            result["speedup_fedtopo"] = round(
                result["new"]["fedtopo"]["images_per_s"] / result["old"]["fedtopo"]["images_per_s"], 2
            )
    result["load_average"] = {"start": load_start, "end": _load()}
    print(json.dumps(result))
    print(_table(result), file=sys.stderr)
    if args.out:
        write_own_file(args.out, (json.dumps(result) + "\n").encode())
    return result


def _table(result: dict) -> str:
    """Per budget level and tree: images per CPU-second, achieved GFLOP/s and its ratio to the matmul peak."""
    trees = [name for name in ("old", "new") if name in result]
    lines = [f"{'budget MMAC':>11} " + " ".join(f"{t + ' img/s':>10} {'GFLOP/s':>8} {'/peak':>6}" for t in trees)]
    for i, row in enumerate(result[trees[0]]["feast"]):
        cells = [result[t]["feast"][i] for t in trees]
        line = f"{row['budget_macs'] / 1e6:>11.2f} "
        line += " ".join(f"{c['images_per_s']:>10.1f} {c['gflops']:>8.2f} {c['ratio']:>6.3f}" for c in cells)
        if "speedup" in result:
            line += f"  x{result['speedup'][i]:.2f}"
        cell = result[trees[-1]]["feast"][i]
        if "plain_images_per_s" in cell:
            line += (
                f"  plain {cell['plain_images_per_s']:.1f}, eager limit {cell['eager_limit_images_per_s']:.1f} img/s"
            )
            line += f": step at {cell['of_eager_limit']:.2f} of it (fwd+bwd at {cell['model_of_plain']:.2f})"
        lines.append(line)
    lines.append("peak GFLOP/s (matmul): " + ", ".join(f"{t} {result[t]['peak']['matmul_gflops']}" for t in trees))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
