"""The control studies' tables (experiments/translation/kvtranslate_controls.py) on made-up rows: labels, means with
t-intervals, differences paired by seed against the no-source control, the uniform-gate ablation and the routing."""

import json
import math
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments", "translation"))

import kvtranslate_controls  # noqa: E402
import kvtranslate_report  # noqa: E402

BASE = ":w_key=16.0:target_input=positions:params=1000000"
ROUTING = dict(gate_entropy=0.8, gate_top=0.5, hard_balance=1.25, expert_usage=[0.1, 0.2, 0.3, 0.4])


def row(kind, seed, retention, uniform=None, steps=10):
    r = dict(
        source="s",
        target="t",
        variant=f"{kind}{BASE}:steps={steps}",
        seed=seed,
        steps=steps,
        eval_seed=11,
        commit="abcdef0123456789",
        dirty=False,
        parameters=1000000 + seed,
        hidden=200,
        cpu_minutes=1.5,
    )
    for s in kvtranslate_controls.SETS:
        r[f"{s}_retention"] = retention
        if uniform is not None:
            r[f"{s}_uniform_gates_retention"] = uniform
            r[f"{s}_routing"] = ROUTING
    return r


def half(values):
    return 4.30 * statistics.stdev(values) / math.sqrt(len(values))


def test_differences_are_paired_by_seed_against_the_control_and_between_the_kinds():
    rows = [row("mot", s, r, u) for s, r, u in ((0, 0.5, 0.3), (1, 0.6, 0.3), (2, 0.7, 0.5))]
    rows += [row("no-source", s, r) for s, r in ((0, 0.1), (1, 0.1), (2, 0.2), (3, 0.9))]  # seed 3: no mot
    rows += [row("single", s, r) for s, r in ((0, 0.45), (1, 0.62), (2, 0.68))]
    text = kvtranslate_controls.study_block(rows)
    # labels drop what every variant shares; the header sums the CPU time of all 10 runs
    assert "`mot` | 1,000,000 | hidden 200 | 0, 1, 2 |" in text and BASE not in text
    assert "CPU time of the 10 runs 15.0 min (900 s)" in text and "commits `abcdef012345`" in text
    # mot minus no-source over seeds 0-2 only: 0.4, 0.5, 0.5
    d = [0.4, 0.5, 0.5]
    mean, h = statistics.fmean(d), half(d)
    cell = f"{mean:.3f} ± {h:.3f} ({mean - h:.3f} to {mean + h:.3f}) | beyond the interval, higher"
    assert f"| `mot` | `no-source` | 3 | {cell} |" in text
    # mot minus single: 0.05, -0.02, 0.02 -> the interval holds 0
    assert "| `mot` | `single` | 3 | 0.017 ± " in text and "within the interval" in text
    # uniform gates minus routed: -0.2, -0.3, -0.2
    d = [-0.2, -0.3, -0.2]
    assert f"| `mot, uniform gates` | `mot` | 3 | {statistics.fmean(d):.3f} ± {half(d):.3f}" in text
    assert "beyond the interval, lower" in text
    # the kinds table has the mixture's uniform-gate line; the routing table one line per seed and set
    assert "| `mot`, uniform gates at evaluation | same |  | 0, 1, 2 | 0.367 ± " in text
    assert "| `mot` | 1 | long contexts | 0.800 | 0.500 | 0.10 / 0.20 / 0.30 / 0.40 | 1.250 | 0.600 | 0.300 |" in text
    assert text.count("| `mot` | 0 |") == len(kvtranslate_controls.SETS)
    # the generated verdict sentences say the same as the table, per set
    assert "- `mot` minus `no-source`: training phrasings +0.467 ± " in text
    assert "- `mot, uniform gates` minus `mot`: training phrasings -0.233 ± " in text
    assert "(within the interval)" in text.split("- `mot` minus `single`: ")[1].splitlines()[0]


def test_variants_of_one_kind_are_told_apart_by_what_differs():
    rows = [row("shared-latent", 500, 0.4, steps=400), row("shared-latent", 500, 0.5, steps=1200)]
    text = kvtranslate_controls.study_block(rows)
    assert "| `shared-latent:steps=400` |" in text and "| `shared-latent:steps=1200` |" in text
    assert "0.400 (one seed)" in text and "steps 400, 1200" in text


def test_short_table_reads_the_eval_rows_and_the_bounds():
    bounds = dict(source="s", target="t", bounds=True, eval_n=200, eval_seed=7)
    bounds.update(direct=dict(acc=0.9, f1=0.95), no_context=dict(acc=0.3, f1=0.035))
    mot = dict(kind="mot", target_input="positions", steps=400, seed=400, retention=0.49)
    mot.update(translated=dict(acc=0.7, f1=0.465), uniform_gates=dict(acc=0.62, f1=0.355))
    emb = dict(kind="no-source", target_input="embeddings", steps=400, seed=400, retention=0.78)
    emb.update(translated=dict(acc=0.87, f1=0.745))
    text = kvtranslate_controls.short_table([mot, emb, bounds])
    assert "direct F1 0.950, no-context F1 0.035" in text
    lines = text.splitlines()
    assert lines[-2] == "| embeddings (default) | `no-source` | 0.870 | 0.745 | 0.780 | – |"  # embeddings first
    assert lines[-1] == "| positions only | `mot` | 0.700 | 0.465 | 0.490 | 0.355 (accuracy 0.620) |"


def test_the_report_writes_a_control_block_only_once_its_rows_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(kvtranslate_report, "EXPERIMENTS", str(tmp_path))
    studies = {"positions-study", "positions-deep", "positions-deep6", "controls-short"}
    assert not studies & set(kvtranslate_report.render())
    rows = [row("mot", 0, 0.5, 0.3), row("no-source", 0, 0.1)]
    (tmp_path / "positions_study.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    blocks = kvtranslate_report.render()
    assert "positions-study" in blocks and "positions-deep" not in blocks
    assert "| `mot` | `no-source` | 1 | 0.400 (one seed) | one seed: no interval |" in blocks["positions-study"]
