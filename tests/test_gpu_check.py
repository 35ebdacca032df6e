"""experiments/benchmarks/gpu_check.sh on a machine without CUDA: every part reports, CUDA-only parts say they were
skipped, the training benchmark's figures are consistent and the two FEAST rounds complete."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # two real FEAST rounds through `flwr run`
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path; on CUDA run the script itself")
def test_gpu_check_runs_on_cpu_and_skips_cuda_parts(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "experiments" / "benchmarks" / "gpu_check.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    parts = {}
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        parts[row["part"]] = row
    assert parts["device"]["cuda"] is False
    assert "CUDA only" in parts["train_paper_scale"]["skipped"] and "CUDA only" in parts["kvtranslate"]["skipped"]
    fp32, bf16 = (parts[p]["new"] for p in ("train_fp32", "train_bf16"))
    for bench in (fp32, bf16):
        row = bench["feast"][0]
        # the ratio is two timings' quotient (the step's FLOP rate over a measured matmul peak): it can exceed 1 on
        # a CPU whose load changes between the two, so only its arithmetic is checked, not its size
        assert row["images_per_s"] > 0 and row["ratio"] > 0
        assert row["ratio"] == pytest.approx(row["gflops"] / bench["peak"]["matmul_gflops"], rel=1e-2)
    # analytic FLOPs come from the shapes, not the precision: the same for fp32 and bf16
    assert fp32["feast"][0]["gflop_per_step"] == bf16["feast"][0]["gflop_per_step"]
    rounds = parts["feast_rounds"]
    assert rounds["status"] == "finished:completed", rounds
    assert "num-gpus" not in rounds["federation"] and rounds["tiers"]
    assert all(0.0 <= t["accuracy"] <= 1.0 for t in rounds["tiers"])
