"""Analytic MACs/params against the reference cache and against torch's FLOP counter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import count_costs, load_supernet_config
from fl_app.supernet.subnets import read_cache_rows

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "feast"
REFERENCE_CACHE = Path(__file__).resolve().parents[1] / "fl_app" / "supernet_configs" / "paper-cache.csv"


def test_bundled_paper_files_equal_the_shared_reference():
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside this checkout")
    bundled = Path(__file__).resolve().parents[1] / "fl_app" / "supernet_configs"
    assert json.loads((bundled / "paper.json").read_text()) == json.loads(
        (SHARED / "supernet-cifar100.json").read_text()
    )
    assert (bundled / "paper-cache.csv").read_text() == (SHARED / "subnet-cache-25M-600M.csv").read_text()


def test_all_56_reference_subnets_match_macs_and_params():
    cfg = load_supernet_config("paper")
    subnets, rows = read_cache_rows(REFERENCE_CACHE)
    assert len(rows) == 56
    for arch, row in zip(subnets, rows):
        # the reference counts a 10-class classifier
        macs, params = count_costs(cfg, arch, n_classes=10)
        assert abs(macs / int(row["macs"]) - 1) < 1e-3, (arch, macs, row["macs"])
        assert abs(params / int(row["params"]) - 1) < 1e-3, (arch, params, row["params"])


def test_full_paper_supernet_size():
    cfg = load_supernet_config("paper", n_classes=100)
    macs, params = count_costs(cfg, cfg.max_subnet())
    assert 2.6e9 < macs < 2.75e9
    assert 55e6 < params < 56.2e6


def _flop_counted_macs(model, cfg):
    x = torch.randn(1, cfg.initial_input_channels, cfg.initial_input_hw, cfg.initial_input_hw)
    with FlopCounterMode(display=False) as counter:
        model.eval()(x)
    return counter.get_total_flops() // 2


@pytest.mark.parametrize("row", [0, 20, 55])
def test_flop_counter_matches_paper_subnets(row):
    cfg = load_supernet_config("paper")
    arch = read_cache_rows(REFERENCE_CACHE)[0][row]
    model = ElasticResNet(cfg, bounds=arch)  # an extracted subnet
    assert _flop_counted_macs(model, cfg) == count_costs(cfg, arch)[0]
    # parameters: learnable tensors only (BN running statistics are buffers)
    assert sum(p.numel() for p in model.parameters()) == count_costs(cfg, arch)[1]


def test_flop_counter_matches_every_cpu_cached_subnet(cpu_cfg, cpu_cache):
    for entry in cpu_cache.entries:
        model = ElasticResNet(cpu_cfg, bounds=entry.arch)
        assert _flop_counted_macs(model, cpu_cfg) == entry.macs
        assert sum(p.numel() for p in model.parameters()) == entry.params
