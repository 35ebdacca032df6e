"""Run-config sizes and tiers refused before training, naming the key: repeated tiers, tiers outside the cached
subnets, and sizes that would build a model or generator beyond MAX_MODEL_BYTES."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from fl_app.data.images import DATASETS
from fl_app.io.resources import bundled_file
from fl_app.models.multiarch import build_model, family_names
from fl_app.models.supernet_space import NAMED_SUPERNETS
from fl_app.run.config import KEYS, MAX_MODEL_BYTES, MODEL_SIZES, validate_run_config
from fl_app.supernet.shared_setup import TIER_ROUNDING, SupernetSetup
from strategies.fedtopo_baselines import PrototypeGenerator

ROOT = Path(__file__).resolve().parents[1]


# -- tiers ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tiers", ["5e6,3e6,5e6", "5e6,5000000", "2e6, 2e6"])
def test_a_repeated_tier_is_refused(tiers):
    with pytest.raises(ValueError, match=rf"tiers='{tiers}': .* given more than once; allowed: .*without repeats"):
        validate_run_config({"tiers": tiers})


def test_two_tiers_naming_the_same_cached_subnet_are_refused(cpu_cache):
    run = validate_run_config({"clients-per-round": 2})
    setup = SupernetSetup.build(run, 4)
    macs = setup.cache.entries[5].macs
    with pytest.raises(ValueError, match=f"both name the cached subnet of {macs} MACs; allowed: one tier per"):
        setup.tiers(validate_run_config({"tiers": f"{macs},{macs + 1}"}))


@pytest.mark.parametrize("factor", [1.05, 2.0, 1e4])
def test_a_tier_above_the_largest_cached_subnet_is_refused(factor):
    setup = SupernetSetup.build(validate_run_config({}), 4)
    above = setup.cache.max_macs * factor
    with pytest.raises(ValueError, match=r"tiers: \d+ MACs is above the largest cached subnet \(\d+ MACs\); allowed"):
        setup.tiers(validate_run_config({"tiers": f"{setup.cache.min_macs},{above}"}))


def test_tiers_inside_the_cached_range_name_each_their_subnet():
    setup = SupernetSetup.build(validate_run_config({}), 4)
    low, high = setup.cache.min_macs, setup.cache.max_macs
    # a tier written as the rounded MACs of the end subnets still names them
    run = validate_run_config({"tiers": f"{low * (1 - TIER_ROUNDING / 2)},{high * (1 + TIER_ROUNDING / 2)}"})
    assert [t.macs for t in setup.tiers(run)] == [low, high]


CONFIGS = [p for p in sorted((ROOT / "experiments" / "conf").glob("*.toml")) if "tiers" in tomllib.loads(p.read_text())]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_committed_config_names_distinct_cached_tiers(path):
    run = validate_run_config(tomllib.loads(path.read_text()))
    assert len(SupernetSetup.build(run, 10).tiers(run)) == len(run.tier_targets)


# -- memory ceiling ------------------------------------------------------------------------------------------------
def test_a_fedtgp_feature_dim_beyond_the_ceiling_is_refused():
    with pytest.raises(ValueError) as err:
        validate_run_config({"method": "fedtgp", "feature-dim": 65536})
    message = str(err.value)
    assert "feature-dim=65536: FedTGP's prototype generator would hold" in message
    assert "(32 GiB), beyond the 2 GiB ceiling on one model; allowed: feature-dim <=" in message
    allowed = int(message.split("feature-dim <= ")[1].split()[0])
    validate_run_config({"method": "fedtgp", "feature-dim": allowed})  # the largest allowed value is allowed
    with pytest.raises(ValueError, match=f"feature-dim={allowed + 1}: FedTGP's prototype generator"):
        validate_run_config({"method": "fedtgp", "feature-dim": allowed + 1})
    validate_run_config({"method": "fedproto", "feature-dim": 65536})  # no generator: no ceiling reached


@pytest.mark.parametrize("dataset, dim", [("cifar10", 64), ("tinyimagenet", 333), ("cifar100", 4096)])
def test_the_generator_estimate_counts_the_generator(dataset, dim):
    (_, _, params_of) = MODEL_SIZES["fedtgp"][0]
    with torch.device("meta"):
        generator = PrototypeGenerator(DATASETS[dataset].num_classes, dim)
    counted = sum(p.numel() for p in generator.parameters())
    assert params_of({"dataset": dataset, "feature-dim": dim}) == counted


def test_model_heterogeneous_backbones_stay_under_the_ceiling_at_the_largest_feature_dim():
    """Why only FedTGP's generator has a size check: the backbones grow linearly with feature-dim."""
    largest = int(KEYS["feature-dim"].check.high)
    classes = max(d.num_classes for d in DATASETS.values())
    for family in ("cpu", "paper"):
        for name in family_names(family):
            with torch.device("meta"):
                model = build_model(family, name, classes, largest)
            assert 4 * sum(p.numel() for p in model.parameters()) <= MAX_MODEL_BYTES, (family, name)


def test_a_supernet_json_beyond_the_ceiling_is_refused(tmp_path):
    data = json.loads(bundled_file(NAMED_SUPERNETS["cpu"]).read_text())
    data["original_stage_base_channels"] = [c * 64 for c in data["original_stage_base_channels"]]
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(data))
    run = validate_run_config({"supernet": str(path), "subnet-cache": "cpu"})
    with pytest.raises(ValueError, match=f"supernet='{path}': its largest subnet holds .* beyond the 2 GiB ceiling"):
        SupernetSetup.build(run, 4)
    for name in NAMED_SUPERNETS:  # the bundled supernets are far below it
        SupernetSetup.build(validate_run_config({"supernet": name, "subnet-cache": name}), 4)
