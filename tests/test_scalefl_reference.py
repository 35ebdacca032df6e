"""ScaleFL's levels as the FEAST repository sets them (``scalefl-levels = "reference"``): 0.061, 0.13, 0.25 and 1 of
the whole model's MACs within 15 % either side, the most balanced split; a client below the smallest level trains
it; only the levels some client trains are reported. Against hand computations on the CPU supernet."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_app.models.early_exit import SCALEFL_RATES, level_of, scalefl_config, scalefl_levels
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet_app import train_supernet_client
from strategies.scalefl import ScaleFLStrategy
from tests.harness.training import answered_round, one_step_federation
from tests.test_scalefl import _initial


def test_reference_levels_by_hand_on_the_cpu_supernet(cpu_cfg):
    cfg = scalefl_config(cpu_cfg)
    levels = scalefl_levels(cfg, "reference")
    # 12 blocks (4 stages of 3); by hand: the balanced pairs near 6.1 %, 13 % and 25 % of the whole model's MACs are
    # 5 blocks at width 0.40 (|5/12 - 0.40| = 0.017), 6 at 0.50 (0) and 7 at 0.60 (|7/12 - 0.60| = 0.017)
    assert [(lv.blocks, SCALEFL_RATES[lv.arch.w[0]]) for lv in levels] == [(5, 0.4), (6, 0.5), (7, 0.6), (12, 1.0)]
    full = levels[-1].macs
    for level, fraction in zip(levels, (0.061, 0.13, 0.25, 1.0)):
        assert abs(level.macs / (fraction * full) - 1) <= 0.15
    # no pair of (blocks, width) within 15 % of a target is more balanced than the chosen one (a direct search)
    total, widths = 12, len(cfg.width_multiplier_choices)
    pairs = [level_of(cfg, b, w) for b in range(1, total + 1) for w in range(widths)]
    for level, fraction in zip(levels[:-1], (0.061, 0.13, 0.25)):
        close = [p for p in pairs if abs(p.macs / (fraction * full) - 1) <= 0.15]
        balance = min(abs(p.blocks / total - SCALEFL_RATES[p.arch.w[0]]) for p in close)
        assert abs(level.blocks / total - SCALEFL_RATES[level.arch.w[0]]) == pytest.approx(balance)
    # the project's default is unchanged: 5 levels at HeteroFL's tiers' MACs
    assert len(scalefl_levels(cfg)) == 5 and scalefl_levels(cfg) == scalefl_levels(cfg, "tiers")
    with pytest.raises(ValueError, match="scalefl-levels='paper'"):
        scalefl_levels(cfg, "paper")


def test_clients_below_the_smallest_level_train_it_and_untrained_levels_are_not_reported(cpu_cfg, cpu_cache):
    levels = scalefl_levels(scalefl_config(cpu_cfg), "reference")
    # below level 0 (the fallback), exactly level 0, between levels 1 and 2: levels 2 and 3 are trained by nobody
    budgets = {0: cpu_cache.min_macs, 1: float(levels[0].macs), 2: float(levels[1].macs) + 1}
    assert cpu_cache.min_macs < levels[0].macs
    strategy = ScaleFLStrategy(
        cpu_cfg, cpu_cache, budgets, {p: 10 + p for p in budgets}, clients_per_round=3, seed=0, rule="reference"
    )
    assert [strategy.assign(p, 1)[0] for p in budgets] == [levels[0].arch, levels[0].arch, levels[1].arch]
    assert strategy.tiers == list(levels[:2])
    # the default keeps every level reported, trained or not
    default = ScaleFLStrategy(cpu_cfg, cpu_cache, budgets, {p: 10 + p for p in budgets}, clients_per_round=3, seed=0)
    assert len(default.tiers) == 5


def test_real_clients_train_the_reference_levels_and_the_server_accepts_them(flower_ids):
    num = 4
    run, setup, strategy = one_step_federation(num, method="scalefl", **{"scalefl-levels": "reference"})
    reference = scalefl_levels(strategy.model_cfg, "reference")
    assert strategy.levels == reference
    state = _initial(strategy)
    answered = answered_round(
        strategy, state_to_record(state), lambda m, pid: train_supernet_client(m, run, pid, num, None)
    )
    replies = [reply for _, reply in answered]
    for reply in replies:
        metrics = reply.content.metric_records["metrics"]
        assert metrics["local-steps"] == 1 and math.isfinite(metrics["train-loss"])
        assert metrics["trained-macs"] in [lv.macs for lv in reference]
    record, _ = strategy.aggregate_train(1, replies)
    assert strategy.rounds[1].accepted == list(range(num)) and strategy.rounds[1].rejected == []
    merged = record_to_state(record)
    assert any(not np.array_equal(merged[k], state[k]) for k in state)
