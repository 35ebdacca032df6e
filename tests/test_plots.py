"""fl_app.report.plots: every plot kind rendered (Agg) from a small synthetic result folder, and what makes it honest:
bands clipped to [0, 100] %, dots instead of bands below 3 seeds, a title naming the seeds and the setting, no panel
mixing round counts, no plot of a quantity that was not recorded, and each client's labels and budget."""

from __future__ import annotations

import json

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest

from fl_app.report import ReportError, client_plots, find_runs, load_run, main, plots, report
from fl_app.run.outputs import write_csv, write_json

PNG = b"\x89PNG\r\n\x1a\n"
# accuracies spread so that the 95% t-interval of 3 seeds reaches below 0 and above 100 %
SPREAD = (0.02, 0.50, 0.98)


def make_run(folder, label, seed, final, rounds=4, flops=10.0, tiers=True, method="feast"):
    """A finished run: evaluated every 2 rounds (accuracy rising to ``final``), client FLOPs per round."""
    folder.mkdir(parents=True)
    run_config = {"method": method, "seed": seed, "num-server-rounds": rounds}
    summary = {
        "method": method,
        "dataset": "cifar10",
        "rounds": rounds,
        "seed": seed,
        "num_clients": 8,
        "clients_per_round": 4,
        "completed": True,
        "bytes_down": 3e6 * rounds,
        "bytes_up": 1e6 * rounds,
        "population_weighted_accuracy": final,
        "run_config": run_config,
    }
    if tiers:
        summary["tiers"] = [{"macs": 4.9e5, "accuracy": final}, {"macs": 1.4e7, "accuracy": final}]
    write_json(folder / "summary.json", summary)
    evaluated = range(2, rounds + 1, 2)
    tier_rows = [(4.9e5, 0.8), (1.4e7, 1.0)] if tiers else [(None, None)]  # the small tier at 0.8 of the large
    write_csv(
        folder / "metrics.csv",
        [
            {"round": r, "tier_macs": macs, "test_accuracy": share * final * r / rounds}
            | {"population_weighted_accuracy": final * r / rounds}
            if macs
            else {"round": r, "population_weighted_accuracy": final * r / rounds}
            for r in evaluated
            for macs, share in tier_rows
        ],
    )
    write_csv(
        folder / "rounds.csv",
        [{"round": r, "client_train_flops": flops, "client_seconds": 0.0} for r in range(1, rounds + 1)],
    )
    write_json(
        folder / "run.json",
        {"commit": "c" * 40, "dirty": False, "label": label, "run_config": run_config, "federation": {}},
    )


@pytest.fixture
def suite(tmp_path):
    """feast and fedavg-min (3 seeds, 4 rounds), fedavg-min-long (3 seeds, 8 rounds), feast-kd0 (2 seeds)."""
    for seed, acc in enumerate(SPREAD):
        make_run(tmp_path / f"feast/s{seed}", "feast", seed, acc)
        make_run(tmp_path / f"min/s{seed}", "fedavg-min", seed, acc * 0.9, method="fedavg-min", flops=2.0)
        make_run(
            tmp_path / f"long/s{seed}",
            "fedavg-min-long",
            seed,
            min(1.0, acc * 1.1),
            rounds=8,
            method="fedavg-min",
            flops=2.0,
        )
    for seed in (0, 1):
        make_run(tmp_path / f"kd0/s{seed}", "feast-kd0", seed, 0.4 + seed / 10)
    return tmp_path


def _tables(folder, reference="feast"):
    return report(find_runs([folder]), reference)


def _bands(ax):
    return [c for c in ax.collections if c.__class__.__name__ in ("PolyCollection", "FillBetweenPolyCollection")]


def test_every_plot_kind_is_written_as_a_png(suite, tmp_path):
    out = tmp_path / "out"
    assert main([str(suite), "--reference", "feast", "--out", str(out), "--plots"]) == 0
    names = {p.name for p in out.glob("*.png")}
    assert names == {
        "accuracy_per_round.png",
        "accuracy_per_round_per_tier.png",
        "paired_difference.png",
        "accuracy_vs_compute.png",
        "accuracy_vs_macs.png",
        "traffic.png",
    }
    assert all((out / n).read_bytes()[:8] == PNG for n in names)


def test_accuracy_per_round_clips_bands_names_seeds_and_splits_round_counts(suite):
    fig = plots.figure_accuracy_per_round(_tables(suite))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2  # 4-round and 8-round runs never share an x axis
    for ax in axes:
        low, high = ax.get_ylim()
        assert 0 <= low < high <= 100
        for band in _bands(ax):
            assert all(0 <= y <= 100 for path in band.get_paths() for _, y in path.vertices)
        longest = int(ax.get_title().split()[2])  # "runs of N rounds"
        assert all(max(line.get_xdata()) <= longest for line in ax.get_lines())
    title = fig._suptitle.get_text()
    assert "95 % t-interval over 3 seeds" in title and "8 clients, 4 per round" in title and "4 or 8 rounds" in title
    assert "dots: each seed of rows with fewer than 3" in title
    # the unclipped band of SPREAD goes below 0: the clipped one touches 0 exactly
    four = next(ax for ax in axes if "4 rounds" in ax.get_title())
    assert min(y for band in _bands(four) for path in band.get_paths() for _, y in path.vertices) == 0


def test_below_three_seeds_each_seed_is_a_dot_not_a_band(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / f"a/s{seed}", "feast", seed, 0.3 + seed / 10)
    fig = plots.figure_accuracy_per_round(_tables(tmp_path, None))
    ax = fig.axes[0]
    assert _bands(ax) == []
    dots = [c for c in ax.collections if c.__class__.__name__ == "PathCollection"]
    assert sum(len(c.get_offsets()) for c in dots) == 4  # 2 seeds x 2 evaluated rounds
    assert "dots: each of the 2 seeds" in fig._suptitle.get_text()


def test_paired_difference_plot_has_an_interval_per_method_against_the_reference(suite):
    tables = _tables(suite)
    fig = plots.figure_paired(tables)
    left = fig.axes[0]
    labels = [t.get_text() for t in left.get_yticklabels()]
    assert len(labels) == len(tables["paired"]) == 3
    assert all("− feast" in label for label in labels)
    assert "minus feast" in fig._suptitle.get_text()
    errorbars = [c for c in left.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert len(errorbars) == 2  # fedavg-min and fedavg-min-long have 3 seeds; feast-kd0 (2) is drawn as dots
    assert plots.figure_paired(_tables(suite, None)) is None


def test_accuracy_vs_compute_has_one_mean_line_per_method_and_faint_seeds(suite):
    tables = _tables(suite)
    fig = plots.figure_accuracy_vs_compute(tables)
    ax = fig.axes[0]
    thick = [line for line in ax.get_lines() if line.get_linewidth() >= 2]
    faint = [line for line in ax.get_lines() if line.get_alpha() is not None and line.get_alpha() < 0.5]
    assert len(thick) == len(tables["rows"]) == 4
    assert len(faint) == sum(row.seeds for row in tables["rows"]) == 11
    assert all(min(line.get_xdata()) > 0 for line in thick)
    assert 0 <= ax.get_ylim()[0] < ax.get_ylim()[1] <= 100


def test_no_compute_plot_or_table_on_a_quantity_that_was_not_recorded(tmp_path):
    """Only client_seconds, all zero: not a measurement; no plot with every point at x = 0."""
    for seed in range(3):
        make_run(tmp_path / f"s{seed}", "fedtopo", seed, 0.5, flops=0.0)
    tables = _tables(tmp_path, None)
    assert tables["compute"] == [] and plots.figure_accuracy_vs_compute(tables) is None
    out = tmp_path / "out"
    assert main([str(tmp_path), "--out", str(out), "--plots"]) == 0
    assert not (out / "accuracy_vs_compute.png").exists() and not (out / "compute.csv").exists()


def test_tier_and_traffic_plots_stay_within_their_ranges(suite):
    tables = _tables(suite)
    ax = plots.figure_accuracy_vs_macs(tables).axes[0]
    assert 0 <= ax.get_ylim()[0] < ax.get_ylim()[1] <= 100 and ax.get_xscale() == "log"
    fig = plots.figure_traffic(tables)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "fedavg-min-long (8 rounds)" in ticks  # runs of other lengths are named as such
    assert "mean over 2–3 seeds" in fig._suptitle.get_text()


def test_tier_curves_have_a_panel_per_method_and_a_line_per_tier(suite, tmp_path):
    fig = plots.figure_tier_curves(_tables(suite))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert (
        sorted(ax.get_title() for ax in axes)
        == sorted(["feast", "fedavg-min", "fedavg-min-long (8 rounds)", "feast-kd0"])
        or len(axes) == 4
    )
    feast = next(ax for ax in axes if ax.get_title().startswith("feast") and "kd0" not in ax.get_title())
    lines = {line.get_label(): line for line in feast.get_lines()}
    assert set(lines) == {"0.49 MMACs", "14 MMACs"}
    # by hand: the small tier is 0.8 of the large one at every round; mean over SPREAD at the last round (4)
    assert lines["14 MMACs"].get_ydata()[-1] == pytest.approx(100 * sum(SPREAD) / 3)
    assert lines["0.49 MMACs"].get_ydata()[-1] == pytest.approx(80 * sum(SPREAD) / 3)
    assert len(_bands(feast)) == 2 and all(
        0 <= y <= 100 for b in _bands(feast) for p in b.get_paths() for _, y in p.vertices
    )
    kd0 = next(ax for ax in axes if "kd0" in ax.get_title())
    assert _bands(kd0) == []  # 2 seeds: dots
    assert sum(len(c.get_offsets()) for c in kd0.collections if c.__class__.__name__ == "PathCollection") == 8
    for seed in (0, 1):
        make_run(tmp_path / f"flat/s{seed}", "local", seed, 0.3, tiers=False, method="fedavg-min")
    assert plots.figure_tier_curves(_tables(tmp_path / "flat", None)) is None


def test_client_figure_stacks_each_clients_labels_over_its_budget(tmp_path):
    make_run(tmp_path / "r", "feast", 0, 0.4)
    run = load_run(tmp_path / "r")
    counts = pd.DataFrame(np.arange(40).reshape(4, 10), columns=[f"class {k}" for k in range(10)])
    counts.iloc[3, -1] = 0  # a class the tallest client lacks: an empty layer on top of its stack
    fig = client_plots.figure_clients(run, counts, [4.9e5, 1e6, 4e6, 1.4e7], None)
    top, bottom = fig.axes[:2]
    assert len(top.containers) == 10  # one stacked bar layer per class
    assert top.get_ylim()[1] > counts.sum(axis=1).max()  # the tallest stack is inside the frame, not against it
    assert [round(p.get_height() * 1e6) for p in bottom.patches] == [490000, 1000000, 4000000, 14000000]
    assert "feast seed 0" in fig._suptitle.get_text() and plots.png_bytes(fig)[:8] == PNG


def test_client_labels_are_redrawn_from_the_run_config_and_checked_against_clients_csv(tmp_path):
    """A run on the bundled sample: the redrawn partitions' sizes must equal what the run recorded."""
    from fl_app.run.config import validate_run_config
    from fl_app.supernet.shared_setup import SupernetSetup

    folder = tmp_path / "runs/feast/seed0"
    make_run(folder, "feast", 0, 0.4)
    config = validate_run_config({"method": "feast", "seed": 0, "gamma": 1.0}).to_dict()
    budgets = [float(b) for b in SupernetSetup.build(validate_run_config(config), 4).budgets]
    summary = json.loads((folder / "summary.json").read_text())
    write_json(folder / "summary.json", {**summary, "num_clients": 4, "run_config": config, "budgets": budgets})
    record = json.loads((folder / "run.json").read_text())
    write_json(folder / "run.json", {**record, "run_config": config})
    counts, drawn, _ = client_plots.client_partitions(load_run(folder))
    assert drawn == budgets and counts.shape == (4, 10) and list(counts.columns[:2]) == ["airplane", "automobile"]
    sizes = [int(n) for n in counts.sum(axis=1)]
    assert sizes[int(np.argmax(budgets))] > sizes[int(np.argmin(budgets))]  # γ = 1: data share follows the budget

    write_csv(folder / "clients.csv", [{"partition_id": p, "num_examples": n} for p, n in enumerate(sizes)])
    out = tmp_path / "out"
    assert main([str(folder), "--clients", "--out", str(out)]) == 0
    assert (out / "clients_feast_seed0.png").read_bytes()[:8] == PNG

    write_csv(folder / "clients.csv", [{"partition_id": p, "num_examples": n + (p == 1)} for p, n in enumerate(sizes)])
    with pytest.raises(ReportError, match=r"clients.csv: partition 1 held \d+ examples in the run"):
        client_plots.client_partitions(load_run(folder))


def test_each_method_keeps_one_hue_in_every_figure_and_no_two_methods_share_one(suite):
    from fl_app.report.plots import METHOD_HUES, colours

    rows = _tables(suite)["rows"]
    colour = colours(rows)
    by_name = {row.name: row for row in rows}
    # feast and feast-kd0 train feast: shades of one hue; fedavg-min and its long setting: another hue
    assert colour["feast"] != colour["feast-kd0"]
    hues = {name: max(range(3), key=lambda i: colour[name][i]) for name in colour}
    assert hues["feast"] == hues["feast-kd0"] == 2  # blue dominates both
    assert colour["fedavg-min"] not in (colour["feast"], colour["feast-kd0"])
    # the same method has the same colour whatever else a figure holds
    alone = colours([by_name["fedavg-min"]])
    assert alone["fedavg-min"] == pytest.approx(matplotlib.colors.to_rgb(METHOD_HUES["fedavg-min"]))
    assert len(set(METHOD_HUES.values())) == len(METHOD_HUES)


def test_matched_rows_whose_seeds_evaluate_at_different_rounds_get_a_mean_line(tmp_path):
    from fl_app.report.plots import figure_accuracy_vs_compute

    for seed, rounds in enumerate((6, 8, 10)):  # a matched row: each seed its own horizon and evaluation rounds
        folder = tmp_path / f"m/s{seed}"
        make_run(folder, "fedavg-min-matched", seed, 0.5, rounds=rounds, method="fedavg-min")
        record = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**record, "match_compute": {"reference": "feast"}}))
    fig = figure_accuracy_vs_compute(_tables(tmp_path, reference=None))
    thick = [line for line in fig.axes[0].lines if line.get_linewidth() == 2]
    assert len(thick) == 1 and len(thick[0].get_xdata()) == 3  # each seed's 1st, 2nd and 3rd evaluation


def test_traffic_spanning_orders_of_magnitude_is_drawn_on_a_log_axis(suite):
    from fl_app.report.plots import figure_traffic

    tables = _tables(suite)
    for i, row in enumerate(tables["accuracy"]):
        row["mb_down"], row["mb_up"] = 1000.0 if i == 0 else 3.0, 2.0
    assert figure_traffic(tables).axes[0].get_yscale() == "log"
