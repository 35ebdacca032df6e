"""The lanes benchmark: its suite and its refusals (the measurement: python -m experiments.benchmarks.bench_lanes)."""

from __future__ import annotations

import pytest

from experiments.benchmarks import bench_lanes
from experiments.runner.suite import load_suite


def test_the_benchmark_suite_is_the_smoke_suite_with_the_asked_seeds_and_rounds(tmp_path):
    path = tmp_path / "suite.toml"
    path.write_text(bench_lanes.suite_text(seeds=6, rounds=5))
    suite, smoke = load_suite(path), load_suite(bench_lanes.SMOKE)
    assert suite.seeds == [0, 1, 2, 3, 4, 5] and suite.base["num-server-rounds"] == 5
    assert {k: v for k, v in suite.base.items() if k != "num-server-rounds"} == {
        k: v for k, v in smoke.base.items() if k != "num-server-rounds"
    }
    assert suite.federation == smoke.federation and suite.methods == smoke.methods


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--seeds", "4"], "--seeds 4"),
        (["--rounds", "0"], "--rounds 0"),
        (["--settings", "lanes-2-shared-ray"], "--settings lanes-2-shared-ray: lanes-1 and any of"),
        (["--settings", "lanes-1,lanes-3"], "lanes-1-shared-ray"),
    ],
)
def test_uneven_seeds_no_rounds_and_unknown_settings_are_refused(argv, fragment, capsys):
    with pytest.raises(SystemExit):
        bench_lanes.main(argv)
    assert fragment in capsys.readouterr().err
