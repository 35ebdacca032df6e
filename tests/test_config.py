"""Run-config validation: every bad input is refused before training, naming the key and what it accepts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fl_app.config import KEYS, validate_run_config
from fl_app.federation import Federation

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_defaults_equal_config_defaults():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    app_config = pyproject["tool"]["flwr"]["app"]["config"]
    assert list(app_config) == list(KEYS)
    for key, spec in KEYS.items():
        assert app_config[key] == spec.default, key
    validate_run_config(app_config)


def test_readme_documents_every_key():
    readme = (ROOT / "README.md").read_text()
    missing = [key for key in KEYS if f"`{key}`" not in readme]
    assert not missing


@pytest.mark.parametrize("override, fragment", [
    ({"num-server-round": 3}, "unknown key 'num-server-round' (did you mean 'num-server-rounds'?)"),
    ({"method": "fedx"}, "method='fedx': allowed values are ['feast'"),
    ({"dataset": "mnist"}, "dataset='mnist': allowed values are ['cifar10', 'cifar100', 'cinic10', 'tinyimagenet']"),
    ({"gamma": -0.5}, "gamma=-0.5: must be >= 0"),
    ({"lr": "fast"}, "lr='fast': expected a float"),
    ({"payload-dtype": "float16"}, "payload-dtype='float16': allowed values are ['float32', 'bfloat16']"),
    ({"train-subnets": "min,random"}, "train-subnets='min,random'"),
    ({"data-source": "local"}, "data-path: required when data-source='local'"),
    ({"dataset": "cifar100"}, "data-source='sample' only bundles cifar10"),
    ({"output-dir": "relative/dir"}, "output-dir='relative/dir': must be an absolute path"),
    ({"kd-ratio": 1.5}, "kd-ratio=1.5: must be in [0, 1]"),
    ({"routing": "yes"}, "routing='yes': expected a bool"),
])
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
    fed = Federation.build(run, 8)
    with pytest.raises(ValueError, match=r"clients-per-round=9: must be <= the number of clients \(8"):
        fed.client_budgets(run, {})
    default = validate_run_config({})
    assert [default.clients_per_round(n) for n in (1, 2, 8, 9)] == [1, 1, 4, 4]
    run = validate_run_config({"clients-per-round": 2})
    fed = Federation.build(run, 4)
    with pytest.raises(ValueError, match="budget-macs=1000 of partition 2 is below the smallest cached subnet"):
        fed.client_budgets(run, {2: 1000.0})
    assert fed.client_budgets(run, {2: 5e6})[2] == 5e6
    with pytest.raises(ValueError, match="budget-max-macs=1000 is below the smallest cached subnet"):
        Federation.build(validate_run_config({"budget-max-macs": 1000.0}), 4)
    with pytest.raises(ValueError, match="supernet: 'tiny'"):
        Federation.build(validate_run_config({"supernet": "tiny"}), 4)
    with pytest.raises(ValueError, match="tiers: 1000 MACs is below"):
        fed.tiers(validate_run_config({"tiers": "1e3,5e6"}))


def test_paper_confs_validate():
    for conf in sorted((ROOT / "experiments" / "conf").glob("*.toml")):
        validate_run_config(tomllib.loads(conf.read_text()))
