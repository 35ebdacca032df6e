"""experiments.studies.traffic: the FEAST repository's routing (depth and width cut, expansion kept full) never sends
less than this project's (depth, width and expansion cut)."""

from __future__ import annotations

import numpy as np

from experiments.studies.traffic import main, routed_traffic
from fl_app.data.partition import draw_budgets


def test_depth_width_routing_sends_at_least_the_projects_routed_size(cpu_cfg, cpu_cache):
    budgets = draw_budgets(12, cpu_cache.min_macs, cpu_cache.max_macs, 1.2, seed=0)
    ours = routed_traffic(cpu_cfg, cpu_cache, budgets)
    reference_way = routed_traffic(cpu_cfg, cpu_cache, budgets, "depth-width")
    assert ours["full"] == reference_way["full"]
    for budget in budgets:  # client by client, not only in total
        each = [
            routed_traffic(cpu_cfg, cpu_cache, [budget], s)["routed"] for s in ("depth-width-expansion", "depth-width")
        ]
        assert each[1] >= each[0]
    # a client below the top routes strictly more when expansion is kept: the two ways differ
    assert reference_way["routed"] > ours["routed"] and reference_way["routed_bf16"] > ours["routed_bf16"]


def test_both_slicings_are_reported_and_the_projects_keys_stay(capsys):
    result = main(["--supernet", "cpu", "--clients", "6", "--num-seeds", "2", "--max-macs", "0"])
    assert result["slicing"] == "depth-width-expansion"
    assert 1 <= result["depth_width"]["ratio_mean"] <= result["ratio_mean"]
    only = main(
        ["--supernet", "cpu", "--clients", "6", "--num-seeds", "2", "--max-macs", "0", "--slicing", "depth-width"]
    )
    assert "depth_width" not in only and np.isclose(only["ratio_mean"], result["depth_width"]["ratio_mean"])
