"""experiments.studies.horizon_check: the verdict of a horizon against the run at twice its rounds, by hand on made-up
runs, and its refusals."""

from __future__ import annotations

import pytest

from experiments.studies.horizon_check import horizon_rows, main, read_horizons
from fl_app.run.outputs import write_csv, write_json


def make_run(folder, rounds, finals, seed=0, completed=True, **config):
    """A FEAST run of ``rounds`` rounds evaluated at each half: finals = (population-weighted, client-subnet) at the
    end; two tiers at the last evaluation; 10 clients of 100 images, each answering rounds // 2 rounds."""
    folder.mkdir(parents=True)
    run_config = {
        "method": "feast",
        "seed": seed,
        "num-server-rounds": rounds,
        "batch-size": 10,
        "local-epochs": 1,
        "max-local-steps": 0,
        **config,
    }
    population, client_subnet = finals
    write_json(
        folder / "summary.json",
        {
            "method": "feast",
            "rounds": rounds,
            "seed": seed,
            "completed": completed,
            "run_config": run_config,
            "population_weighted_accuracy": population,
            "client_subnet_accuracy": client_subnet,
        },
    )
    write_csv(
        folder / "metrics.csv",
        [
            {
                "round": rounds // 2,
                "tier_macs": "",
                "test_accuracy": "",
                "population_weighted_accuracy": 0.1,
                "client_subnet_accuracy": 0.2,
            },
            {
                "round": rounds,
                "tier_macs": 2e6,
                "test_accuracy": 0.7,
                "population_weighted_accuracy": population,
                "client_subnet_accuracy": client_subnet,
            },
            {
                "round": rounds,
                "tier_macs": 5e5,
                "test_accuracy": 0.5,
                "population_weighted_accuracy": population,
                "client_subnet_accuracy": client_subnet,
            },
        ],
    )
    write_csv(
        folder / "clients.csv",
        [{"partition_id": i, "num_examples": 100, "rounds_answered": rounds // 2} for i in range(10)],
    )
    write_json(folder / "run.json", {"label": "feast", "seed": seed, "run_config": run_config, "commit": "abcdef0"})
    return folder


def test_each_horizon_is_judged_against_the_shortest_run_of_twice_its_rounds(tmp_path):
    # 100 -> 0.500, 150 -> 0.540 (not 2x of 100), 200 -> 0.555 (+5.5 from 100: not converged), 400 -> 0.562
    runs = [
        make_run(tmp_path / "r400", 400, (0.1, 0.562)),
        make_run(tmp_path / "r100", 100, (0.9, 0.500)),
        make_run(tmp_path / "r200", 200, (0.9, 0.555)),
        make_run(tmp_path / "r150", 150, (0.9, 0.540)),
    ]
    rows = horizon_rows(read_horizons(runs), tolerance=1.0)
    assert [r["rounds"] for r in rows] == [100, 150, 200, 400]
    # client-subnet accuracy is read, not the population-weighted one that every run also recorded
    assert [r["accuracy"] for r in rows] == [0.5, 0.54, 0.555, 0.562]
    assert rows[0]["verdict"].startswith("not converged: 200 rounds end +5.5 points")
    assert rows[1]["verdict"].startswith("not converged: 400 rounds end +2.2 points")  # 150 x 2 = 300: 400 judges it
    assert rows[2]["verdict"] == "converged: 400 rounds end +0.7 points from it (within 1)"
    assert rows[3]["verdict"] == "no 2x run"
    assert [r["change"] for r in rows[1:]] == [4.0, 1.5, 0.7]
    assert rows[0]["tiers"] == "50.0 / 70.0"  # smallest tier first
    # each client answered rounds // 2 rounds of one epoch over its 100 images, 10 clients of 100
    assert rows[0]["passes"] == 50.0 and rows[3]["passes"] == 200.0


def test_runs_of_other_settings_seeds_or_unfinished_are_refused(tmp_path, capsys):
    a = make_run(tmp_path / "a", 100, (0.5, 0.5))
    with pytest.raises(SystemExit):
        main([str(a), str(make_run(tmp_path / "lr", 200, (0.5, 0.5), lr=0.1))])
    assert "lr: None / 0.1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(make_run(tmp_path / "seed", 200, (0.5, 0.5), seed=1))])
    assert "seed 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(make_run(tmp_path / "same", 100, (0.5, 0.5)))])
    assert "one run per horizon" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(make_run(tmp_path / "open", 200, (0.5, 0.5), completed=False))])
    assert "'completed' is not true" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(make_run(tmp_path / "b", 200, (0.5, 0.5))), "--tolerance", "nan"])
    assert "--tolerance" in capsys.readouterr().err


def test_cli_writes_the_table_plot_and_readme_block(tmp_path, capsys):
    runs = [make_run(tmp_path / "r1", 100, (0.5, 0.600)), make_run(tmp_path / "r2", 200, (0.5, 0.605))]
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- generated:horizon-check -->\nold\n<!-- /generated:horizon-check -->\nafter\n")
    main([*map(str, runs), "--out", str(tmp_path / "out"), "--readme", str(readme)])
    text = readme.read_text()
    assert "old" not in text and "converged: 200 rounds end +0.5 points from it (within 1)" in text
    assert text.startswith("before\n") and text.endswith("after\n")
    assert (tmp_path / "out" / "horizon_check.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 200 | 100.0 | 60.5 |" in (tmp_path / "out" / "horizon_check.md").read_text()
    capsys.readouterr()
