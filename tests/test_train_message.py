"""The supernet family's TRAIN message (``fl_app.supernet.message``): every method's server writes it through
``TrainInstruction`` with exactly the keys and values recorded before the message had one definition
(``tests/data/supernet_train_configs.json``), ``from_config`` reads back what ``to_config`` wrote, and a config
``from_config`` cannot read is refused naming the key, its value and what is allowed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fl_app.models.supernet_space import Subnet
from fl_app.supernet.message import TrainInstruction
from tests.harness.train_messages import CASES, train_configs

RECORDED = json.loads((Path(__file__).parent / "data" / "supernet_train_configs.json").read_text())


def _same(a, b) -> bool:
    """Equal values of equal types (1 and 1.0, True and 1 differ on the wire)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("case", list(CASES))
def test_each_method_sends_what_it_sent_before_and_reads_it_back(flower_ids, case):
    configs = train_configs(case)
    assert set(configs) == set(RECORDED[case])
    for pid, config in configs.items():
        recorded = RECORDED[case][pid]
        assert list(config) == list(recorded)  # the same keys, in the same order
        assert all(_same(config[key], recorded[key]) for key in recorded), (case, pid)
        instruction = TrainInstruction.from_config(config)
        assert instruction.to_config() == config
        assert TrainInstruction.from_config(instruction.to_config()) == instruction


def _instruction(**changes) -> TrainInstruction:
    fields = dict(
        server_round=3,
        lr=0.05,
        budget_macs=2e6,
        partition_budgets=(2e6, 5e6),
        bounds=Subnet((1, 2), (0.25, 0.5), (0, 1, 2)),
        payload_dtype="float32",
        arch=Subnet((0, 1), (0.25, 0.25), (0, 1, 1)),
        model="width-sliced",
        width_rate=0.5,
        mask_labels=True,
        mask_threshold=0.01,
    )
    return TrainInstruction(**{**fields, **changes})


def test_every_field_survives_the_round_trip_and_unset_ones_are_not_sent():
    full = _instruction()
    assert TrainInstruction.from_config(full.to_config()) == full
    bare = _instruction(arch=None, model=None, width_rate=None, mask_labels=None, mask_threshold=None)
    config = bare.to_config()
    assert not {"arch-d", "arch-e", "arch-w", "model", "width-rate", "mask-labels", "mask-threshold"} & set(config)
    assert TrainInstruction.from_config(config) == bare
    with pytest.raises(TypeError):
        TrainInstruction(3, 0.05, 2e6, (2e6,), Subnet((1,), (0.5,), (0, 1)), "float32")  # keywords only


BAD_CONFIGS = [
    ({"server-round": None}, r"config 'server-round' is missing: expected an integer"),
    ({"server-round": 1.0}, r"config 'server-round'=1.0: expected an integer"),
    ({"server-round": True}, r"config 'server-round'=True: expected an integer"),
    ({"lr": math.nan}, r"config 'lr'=nan: expected a finite number"),
    ({"lr": "0.1"}, r"config 'lr'='0.1': expected a finite number"),
    ({"budget-macs": None}, r"config 'budget-macs' is missing"),
    ({"payload-dtype": "float16"}, r"config 'payload-dtype'='float16': allowed values are \['float32', 'bfloat16'\]"),
    ({"model": "resnet"}, r"config 'model'='resnet': allowed values are \['supernet', 'width-sliced', 'early-exit'\]"),
    ({"partition-budgets": 2e6}, r"config 'partition-budgets'=2000000.0: expected a list of values, each a finite"),
    ({"partition-budgets": [2e6, math.inf]}, r"config 'partition-budgets'=.*: expected a list of values, each a fin"),
    ({"bounds-w": None}, r"config 'bounds-w' is missing: expected a list of values, each an integer"),
    ({"bounds-d": [1, 2.5]}, r"config 'bounds-d'=\[1, 2.5\]: expected a list of values, each an integer"),
    ({"arch-e": None}, r"config 'arch-e' is missing"),  # a subnet's three lists come together
    ({"mask-labels": 1}, r"config 'mask-labels'=1: expected a bool"),
    ({"mask-threshold": -math.inf}, r"config 'mask-threshold'=-inf: expected a finite number"),
    ({"width-rate": [0.5]}, r"config 'width-rate'=\[0.5\]: expected a finite number"),
]


@pytest.mark.parametrize(
    "change, message", BAD_CONFIGS, ids=[next(iter(c)) + "-" + str(i) for i, (c, _) in enumerate(BAD_CONFIGS)]
)
def test_a_config_it_cannot_read_is_refused_naming_the_key_and_what_is_allowed(change, message):
    config = _instruction().to_config()
    for key, value in change.items():
        config.pop(key) if value is None else config.__setitem__(key, value)
    with pytest.raises(ValueError, match=message):
        TrainInstruction.from_config(config)


def test_keys_the_message_does_not_define_are_ignored():
    config = {**_instruction().to_config(), "run-extra": "kept by the server's train config, unused by clients"}
    assert TrainInstruction.from_config(config) == _instruction()
