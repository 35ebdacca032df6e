"""Supernet-family clients (FEAST and its baselines) check what the server sends before training: the arrays' keys
and shapes against what the routed config implies, finite values, and the config values they use. A bad broadcast
is a ValueError naming the key (the reply is an error reply the server counts as failed), never a NaN reply, a
KeyError or a shape error from deep inside the model."""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from clients.broadcast import BROADCAST_MAX_ABS
from clients.supernet_instruction import MESSAGE_SPECS, read_instruction
from fl_app.run.config import SUPERNET_METHODS, validate_run_config
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.shared_setup import SupernetSetup
from fl_app.supernet_app import make_supernet_strategy, train_supernet_client
from strategies.screening import MAX_ABS

NUM = 4
TINY = {"clients-per-round": 2, "max-local-steps": 1, "batch-size": 8}


def _honest(method: str, **overrides) -> tuple:
    """(run, federation, partition id, the round-1 message the method's server sends that partition)."""
    run = validate_run_config({**TINY, "method": method, **overrides})
    setup = SupernetSetup.build(run, NUM)
    budgets = setup.client_budgets(run, {})
    strategy = make_supernet_strategy(run, setup, budgets, {p: 100 + p for p in range(NUM)})
    state = {
        k: v.numpy() for k, v in strategy.global_model().state_dict().items() if not k.endswith("num_batches_tracked")
    }
    message = strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)[0]
    return run, setup, message.metadata.dst_node_id - 100, message


def _resent(message: Message, arrays: dict | None = None, **config) -> Message:
    """The message with its arrays replaced (name -> numpy array, or None to drop it) and config values changed
    (``None`` drops the key)."""
    record = ArrayRecord({k: v for k, v in message.content.array_records["arrays"].items()})
    for name, value in (arrays or {}).items():
        if value is None:
            del record[name]
        else:
            record[name] = Array(np.ascontiguousarray(value))
    values = dict(message.content.config_records["config"])
    for key, value in config.items():
        values.pop(key) if value is None else values.__setitem__(key, value)
    return Message(
        RecordDict({"arrays": record, "config": ConfigRecord(values)}),
        message_type=MessageType.TRAIN,
        dst_node_id=message.metadata.dst_node_id,
    )


def _first(message: Message, suffix: str = "weight") -> tuple[str, np.ndarray]:
    state = record_to_state(message.content.array_records["arrays"])
    name = next(k for k in state if k.endswith(suffix))
    return name, state[name]


def test_every_supernet_method_has_a_message_spec():
    assert set(MESSAGE_SPECS) == set(SUPERNET_METHODS)
    assert BROADCAST_MAX_ABS >= MAX_ABS  # the server never builds a global value a client would refuse


@pytest.mark.parametrize(
    "method, overrides",
    [(m, {}) for m in SUPERNET_METHODS] + [("feast", {"routing": False}), ("feast", {"payload-dtype": "bfloat16"})],
)
def test_what_each_method_sends_passes_the_client_check(flower_ids, method, overrides):
    run, setup, pid, message = _honest(method, **overrides)
    instruction = read_instruction(message.content, run, setup.cfg, setup.budget_range, pid, NUM)
    sent = record_to_state(message.content.array_records["arrays"], run["payload-dtype"])
    assert instruction.received.keys() == sent.keys()
    assert all(np.array_equal(instruction.received[k], v) for k, v in sent.items())
    assert (instruction.arch is None) == (method == "feast")


def _nan(message):
    name, value = _first(message)
    value = value.copy()
    value.flat[0] = np.nan
    return {name: value}


def _inf_bias(message):
    name, value = _first(message, "bias")
    return {name: np.full_like(value, np.inf)}


def _huge(message):
    name, value = _first(message)
    return {name: np.full_like(value, 1e30)}


def _missing(message):
    name, _ = _first(message)
    return {name: None}


def _wrong_shape(message):
    name, value = _first(message)
    return {name: np.zeros((value.shape[0] + 1, *value.shape[1:]), np.float32)}


def _extra(message):
    return {"stem_conv.extra": np.zeros(3, np.float32)}


ARRAY_FAULTS = {
    "nan": (_nan, "is not finite or beyond"),
    "inf": (_inf_bias, "is not finite or beyond"),
    "huge": (_huge, "is not finite or beyond"),
    "missing-key": (_missing, "broadcast keys"),
    "wrong-shape": (_wrong_shape, "has shape"),
    "extra-key": (_extra, "broadcast keys"),
}


@pytest.mark.parametrize("fault", list(ARRAY_FAULTS))
@pytest.mark.parametrize("method", SUPERNET_METHODS)
def test_a_bad_broadcast_array_is_refused_naming_it(flower_ids, method, fault):
    run, _, pid, message = _honest(method)
    change, fragment = ARRAY_FAULTS[fault]
    arrays = change(message)
    with pytest.raises(ValueError, match=f"client {pid} refuses the round-1 broadcast: .*{fragment}") as err:
        train_supernet_client(_resent(message, arrays), run, pid, NUM, context=None)
    assert any(name in str(err.value) for name in arrays) or fault in ("missing-key", "extra-key")


def test_a_negative_running_variance_is_refused(flower_ids):
    run, _, pid, message = _honest("feast")
    name, value = _first(message, "running_var")
    with pytest.raises(ValueError, match=f"broadcast '{name}' has negative values"):
        train_supernet_client(_resent(message, {name: -np.ones_like(value)}), run, pid, NUM, context=None)


CONFIG_FAULTS = [
    ("feast", {"lr": float("nan")}, "config 'lr'=nan"),
    ("feast", {"lr": 5.0}, "config 'lr'=5.0: must be in [0, 0.05]"),
    ("feast", {"lr": None}, "config 'lr' is missing"),
    ("feast", {"server-round": 0}, "config 'server-round'=0"),
    ("feast", {"server-round": "1"}, "config 'server-round'='1': expected an integer"),
    ("feast", {"payload-dtype": "bfloat16"}, "config 'payload-dtype'='bfloat16': allowed: ['float32']"),
    ("feast", {"budget-macs": float("inf")}, "config 'budget-macs'=inf"),
    ("feast", {"budget-macs": 1e13}, "config 'budget-macs'=10000000000000.0: must be in"),
    ("feast", {"budget-macs": 1e3}, "config 'budget-macs'=1000.0: must be in"),
    ("feast", {"partition-budgets": [5e6] * (NUM - 1)}, "config 'partition-budgets'=.*: expected a list of 4 values"),
    ("feast", {"partition-budgets": [float("nan")] * NUM}, "config 'partition-budgets'="),
    ("feast", {"partition-budgets": None}, "config 'partition-budgets' is missing"),
    ("feast", {"bounds-w": None}, "config 'bounds-w' is missing"),
    ("feast", {"bounds-d": [9, 9, 9, 9]}, r"config 'bounds-\*': subnet d="),
    ("feast", {"bounds-e": [0.5]}, "config 'bounds-e'=.*: expected a list of"),
    ("feast", {"arch-d": [0, 0, 0, 0]}, "method 'feast' assigns no subnet"),
    ("feast", {"model": "width-sliced"}, "config 'model'='width-sliced': allowed: ['supernet']"),
    ("feast", {"width-rate": 0.5}, "config 'width-rate'=0.5: allowed: [1.0]"),
    ("feast", {"mask-labels": True}, "config 'mask-labels'=True: allowed: [False]"),
    ("superfednas", {"arch-w": None}, "config 'arch-w' is missing"),
    ("heterofl", {"model": None}, "config 'model' is missing"),
    ("heterofl", {"width-rate": 2.0}, "config 'width-rate'=2.0: allowed: "),
    ("fedrolex", {"mask-labels": None}, "config 'mask-labels' is missing"),
    ("fedavg-min", {"arch-w": [9, 9, 9, 9, 9]}, r"config 'arch-\*': subnet w_indices="),
]


@pytest.mark.parametrize("method, config, fragment", CONFIG_FAULTS, ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_config_value_is_refused_naming_the_key(flower_ids, method, config, fragment):
    run, _, pid, message = _honest(method)
    with pytest.raises(ValueError, match=f"client {pid} refuses the round-.* broadcast: ") as err:
        train_supernet_client(_resent(message, **config), run, pid, NUM, context=None)
    assert fragment in str(err.value) or re.search(fragment, str(err.value))


def test_a_budget_that_is_not_its_own_partition_budget_is_refused(flower_ids):
    run, setup, pid, message = _honest("feast")
    other = [b for b in message.content.config_records["config"]["partition-budgets"]]
    other[pid] = setup.budget_range[0] if other[pid] != setup.budget_range[0] else setup.budget_range[1]
    with pytest.raises(ValueError, match="config 'budget-macs'=.* is not its entry of 'partition-budgets'"):
        train_supernet_client(_resent(message, **{"partition-budgets": [float(b) for b in other]}), run, pid, NUM, None)
