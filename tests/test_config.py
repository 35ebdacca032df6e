"""Run-config validation: every bad input is refused before training, naming the key and what it accepts."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from fl_app.run.config import KEYS, RunConfig, validate_run_config
from fl_app.supernet.shared_setup import SupernetSetup

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_defaults_equal_config_defaults():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    app_config = pyproject["tool"]["flwr"]["app"]["config"]
    assert list(app_config) == list(KEYS)
    for key, spec in KEYS.items():
        assert app_config[key] == spec.default, key
    validate_run_config(app_config)


def test_reference_documents_every_key():
    reference = (ROOT / "docs" / "run-config.md").read_text()
    missing = [key for key in KEYS if f"`{key}`" not in reference]
    assert not missing


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"num-server-round": 3}, "unknown key 'num-server-round' (did you mean 'num-server-rounds'?)"),
        ({"method": "fedx"}, "method='fedx': allowed values are ['feast'"),
        (
            {"dataset": "mnist"},
            "dataset='mnist': allowed values are ['cifar10', 'cifar100', 'cinic10', 'tinyimagenet']",
        ),
        ({"gamma": -0.5}, "gamma=-0.5: must be in [0, 10]"),
        ({"lr": "fast"}, "lr='fast': expected a finite number in (0, 10]"),
        ({"payload-dtype": "float16"}, "payload-dtype='float16': allowed values are ['float32', 'bfloat16']"),
        ({"train-subnets": "min,random"}, "train-subnets='min,random'"),
        (
            {"train-subnets": "max,max"},
            "train-subnets='max,max': allowed: a comma list of ['max', 'min', 'random'] without repeats",
        ),
        ({"train-subnets": "max,,min"}, "train-subnets='max,,min': an empty item"),
        (
            {"tiers": "3e6,"},
            "tiers='3e6,': an empty item; allowed: empty, or comma-separated MACs, each a number in [1, 1e12]",
        ),
        ({"tiers": "inf"}, "tiers='inf': inf is out of range"),
        ({"tiers": "nan"}, "tiers='nan': nan is out of range"),
        ({"tiers": "1e30"}, "tiers='1e30': 1e30 is out of range"),
        ({"tiers": "0,3e6"}, "tiers='0,3e6': 0 is out of range"),
        ({"tiers": "3e6;5e6"}, "tiers='3e6;5e6': '3e6;5e6' is not a number"),
        (
            {"faulty-partitions": "1.5"},
            "faulty-partitions='1.5': '1.5' is not a partition id; allowed: empty, or "
            "comma-separated partition ids, each an integer in [0, 100000)",
        ),
        ({"faulty-partitions": "-1"}, "faulty-partitions='-1': '-1' is not a partition id"),
        ({"faulty-partitions": "0,"}, "faulty-partitions='0,': an empty item"),
        ({"budget-levels": 10**9}, "budget-levels=1000000000: must be in [0, 100000]"),
        ({"topo-tau": 1e-45}, "topo-tau=1e-45: must be in [0.001, 100]"),
        ({"lr": float("inf")}, "lr=inf: expected a finite number in (0, 10]"),
        ({"seed": 2**40}, "seed=1099511627776: must be in [0, 4294967295]"),
        ({"budget-levels": 1e9}, "budget-levels=1000000000.0: expected an integer in [0, 100000]"),
        ({"method": 3}, "method=3: expected a string"),
        ({"data-source": "local"}, "data-path: required when data-source='local'"),
        ({"dataset": "cifar100"}, "data-source='sample' only bundles cifar10"),
        ({"output-dir": "relative/dir"}, "output-dir='relative/dir': must be an absolute path"),
        ({"kd-ratio": 1.5}, "kd-ratio=1.5: must be in [0, 1]"),
        ({"routing": "yes"}, "routing='yes': expected a bool (true or false)"),
    ],
)
def test_bad_values_are_named(override, fragment):
    with pytest.raises(ValueError) as err:
        validate_run_config(override)
    assert fragment in str(err.value)


def test_all_errors_are_reported_at_once():
    with pytest.raises(ValueError) as err:
        validate_run_config({"gamma": -1, "batch-size": 0})
    assert "gamma" in str(err.value) and "batch-size" in str(err.value)


def test_federation_level_checks():
    run = validate_run_config({"clients-per-round": 9})
    setup = SupernetSetup.build(run, 8)
    with pytest.raises(ValueError, match=r"clients-per-round=9: must be <= the number of clients \(8"):
        setup.client_budgets(run, {})
    default = validate_run_config({})
    assert [default.clients_per_round(n) for n in (1, 2, 8, 9)] == [1, 1, 4, 4]
    run = validate_run_config({"clients-per-round": 2})
    setup = SupernetSetup.build(run, 4)
    with pytest.raises(ValueError, match=r"partition-id=2 declared budget-macs=1000 in its node-config; allowed: a"):
        setup.client_budgets(run, {2: 1000.0})
    assert setup.client_budgets(run, {2: 5e6})[2] == 5e6
    with pytest.raises(ValueError, match="budget-max-macs=1000 gives a largest budget of 1000 MACs, below the"):
        SupernetSetup.build(validate_run_config({"budget-max-macs": 1000.0}), 4)
    with pytest.raises(ValueError, match="supernet: 'tiny'"):
        SupernetSetup.build(validate_run_config({"supernet": "tiny"}), 4)
    with pytest.raises(ValueError, match="tiers: 1000 MACs is below"):
        setup.tiers(validate_run_config({"tiers": "1e3,5e6"}))


def test_paper_confs_validate():
    for conf in sorted((ROOT / "experiments" / "conf").glob("*.toml")):
        validate_run_config(tomllib.loads(conf.read_text()))


def test_list_keys_are_parsed_once_by_their_check():
    run = validate_run_config({"tiers": " 5e6, 3e6 ", "faulty-partitions": "2, 0", "train-subnets": "max, random"})
    assert run.tier_targets == [5e6, 3e6]
    assert run.faulty_partitions == frozenset({0, 2})
    assert run.train_subnets == ("max", "random")
    # the raw values stay as given (checkpoints and summaries compare them); a rebuilt config parses the same way
    assert run["tiers"] == " 5e6, 3e6 "
    rebuilt = RunConfig(dict(run.values))
    assert rebuilt.parsed == run.parsed and rebuilt == run
    assert validate_run_config({}).tier_targets == [] and validate_run_config({}).faulty_partitions == frozenset()


def test_every_number_has_a_finite_range():
    for key, spec in KEYS.items():
        if isinstance(spec.default, (int, float)) and not isinstance(spec.default, bool):
            assert spec.check is not None, key
            assert spec.check(spec.default), key
            huge, tiny = (10**15, -(10**15)) if isinstance(spec.default, int) else (1e30, -1e30)
            for bad in (huge, tiny):
                with pytest.raises(ValueError, match=re.escape(f"{key}={bad!r}: must be {spec.rule}")):
                    validate_run_config({key: bad})
            if isinstance(spec.default, float):
                for bad in (math.inf, math.nan):
                    with pytest.raises(ValueError, match=re.escape(f"{key}={bad!r}: expected a finite number")):
                        validate_run_config({key: bad})


def test_reference_states_every_range():
    rows = {
        line.split("`")[1]: line
        for line in (ROOT / "docs" / "run-config.md").read_text().splitlines()
        if line.startswith("| `")
    }
    missing = [key for key, spec in KEYS.items() if spec.check and spec.rule not in rows.get(key, "")]
    assert not missing


def test_faulty_partitions_beyond_the_federation_are_refused():
    run = validate_run_config({"faulty-partitions": "1,7"})
    assert run.clients_per_round(8) == 4
    with pytest.raises(
        ValueError,
        match=r"faulty-partitions='1,7': partition ids \[7\] do not exist; allowed: ids "
        r"in \[0, 4\)",
    ):
        run.clients_per_round(4)
    with pytest.raises(ValueError, match="faulty-partitions"):
        SupernetSetup.build(run, 4).client_budgets(run, {})


def test_strategies_and_clients_reject_what_the_registry_rejects():
    """Allowed values live in the registry: code called without a validated run config raises its very error."""
    import numpy as np
    import torch

    from clients.fedtopo import fedtopo_upload
    from fl_app.models.multiarch import family_names
    from strategies.fedtopo import merge_relations
    from strategies.fedtopo_baselines import adaptive_margin

    calls = {
        "topo-weighting": lambda v: merge_relations(np.zeros((1, 3, 3)), np.ones((1, 3)), 0.5, v),
        "tgp-margin": lambda v: adaptive_margin(torch.zeros(3, 2), torch.ones(3, dtype=torch.bool), 1.0, v),
        "topo-source": lambda v: fedtopo_upload(None, None, 3, v, 0, 0),
        "model-family": family_names,
    }
    for key, call in calls.items():
        with pytest.raises(ValueError) as from_registry:
            validate_run_config({"method": "fedtopo", key: "bogus"})
        with pytest.raises(ValueError) as from_code:
            call("bogus")
        assert f"{key}='bogus': allowed values are {list(KEYS[key].choices)}" in str(from_registry.value)
        assert str(from_code.value) == f"{key}='bogus': allowed values are {list(KEYS[key].choices)}"
