"""The supernet family's TRAIN message, defined once for the server that writes it (``strategies.supernet_base``
and its subclasses) and the client that reads it (``clients.supernet_instruction.read_instruction``): the arrays
routed to the client travel in the record ``fl_app.run.records.ARRAYS_RECORD``, what it is told to do in
``CONFIG_RECORD`` as the keys below, written by ``TrainInstruction.to_config`` and read back,
checked, by ``TrainInstruction.from_config``.

``from_config`` checks what any reader needs: every key there, of its kind, a ``model`` and ``payload-dtype`` among
the allowed values, a subnet's three lists complete. What the values must be for one run (ranges, list lengths, the
method's model) is the client's own check (``clients.supernet_instruction``). Keys the message does not define are
ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from fl_app.models.supernet_space import Subnet
from fl_app.run.config import is_kind
from fl_app.run.payload import PAYLOAD_DTYPES

# -- the config keys ----------------------------------------------------------------------------------------------
SERVER_ROUND, LR, PAYLOAD_DTYPE = "server-round", "lr", "payload-dtype"
BUDGET_MACS, PARTITION_BUDGETS = "budget-macs", "partition-budgets"  # the client's budget; every partition's
MODEL, WIDTH_RATE = "model", "width-rate"  # the model the client slices (when not the supernet); HeteroFL's scaler
MASK_LABELS = "mask-labels"  # HeteroFL: train only the classifier rows of the labels held
MASK_THRESHOLD = "mask-threshold"  # FIARSE: train under the mask |w| >= threshold
BOUNDS, ARCH = "bounds", "arch"  # a subnet travels as three lists, ``<name>-d``, ``<name>-e``, ``<name>-w``
SUBNET_KEYS = ("d", "e", "w")  # depth and expansion ratio per stage; width index per stage and the stem

# -- the models a client slices -----------------------------------------------------------------------------------
SUPERNET, WIDTH_SLICED, EARLY_EXIT = "supernet", "width-sliced", "early-exit"
MODELS = (SUPERNET, WIDTH_SLICED, EARLY_EXIT)


def subnet_keys(name: str) -> tuple[str, ...]:
    """The config keys of subnet ``name`` (``BOUNDS`` or ``ARCH``)."""
    return tuple(f"{name}-{k}" for k in SUBNET_KEYS)


@dataclass(frozen=True, kw_only=True)
class TrainInstruction:
    """What the server tells one client for one round: the round, its learning rate, the client's budget and every
    partition's (the client rebuilds its γ-allocated partition from them), the routed ``bounds`` (the arrays sent
    are their slice), the wire dtype, and, per method, the one subnet to train (``arch``; None: the client plans
    FEAST's step), the model it slices (None: the supernet), HeteroFL's width scaler and label masking, FIARSE's
    magnitude threshold. A None field is not sent."""

    server_round: int
    lr: float
    budget_macs: float
    partition_budgets: tuple[float, ...]
    bounds: Subnet
    payload_dtype: str
    arch: Subnet | None = None
    model: str | None = None
    width_rate: float | None = None
    mask_labels: bool | None = None
    mask_threshold: float | None = None

    def to_config(self) -> dict:
        """The config record's values: the method's own keys first, then those every message carries, then the
        assigned subnet (the order the strategies have always written them in)."""
        own = {MODEL: self.model, WIDTH_RATE: self.width_rate, MASK_LABELS: self.mask_labels}
        own[MASK_THRESHOLD] = None if self.mask_threshold is None else float(self.mask_threshold)
        config = {key: value for key, value in own.items() if value is not None}
        config.update(
            {
                SERVER_ROUND: self.server_round,
                LR: float(self.lr),
                BUDGET_MACS: float(self.budget_macs),
                **_subnet_values(BOUNDS, self.bounds),
                PAYLOAD_DTYPE: self.payload_dtype,
                PARTITION_BUDGETS: [float(b) for b in self.partition_budgets],
            }
        )
        if self.arch is not None:
            config.update(_subnet_values(ARCH, self.arch))
        return config

    @staticmethod
    def from_config(config: Mapping) -> "TrainInstruction":
        """The instruction a config record holds. Raises ``ValueError`` naming the key, its value and what is
        allowed when a key is missing, of the wrong kind, or not an allowed value."""
        return TrainInstruction(
            server_round=_value(config, SERVER_ROUND, int),
            lr=_value(config, LR, float),
            budget_macs=_value(config, BUDGET_MACS, float),
            partition_budgets=tuple(_list(config, PARTITION_BUDGETS, float)),
            bounds=_subnet(config, BOUNDS),
            payload_dtype=_value(config, PAYLOAD_DTYPE, str, PAYLOAD_DTYPES),
            arch=_subnet(config, ARCH) if any(key in config for key in subnet_keys(ARCH)) else None,
            model=_value(config, MODEL, str, MODELS, required=False),
            width_rate=_value(config, WIDTH_RATE, float, required=False),
            mask_labels=_value(config, MASK_LABELS, bool, required=False),
            mask_threshold=_value(config, MASK_THRESHOLD, float, required=False),
        )


def _subnet_values(name: str, subnet: Subnet) -> dict:
    return {f"{name}-d": list(subnet.d), f"{name}-e": list(subnet.e), f"{name}-w": list(subnet.w)}


KIND_NAMES = {bool: "a bool", int: "an integer", float: "a finite number", str: "a string"}


def _value(config: Mapping, key: str, kind: type, allowed: tuple | None = None, required: bool = True):
    if key not in config:
        if required:
            raise ValueError(f"config '{key}' is missing: expected {KIND_NAMES[kind]}")
        return None
    value = config[key]
    if not is_kind(value, kind):
        raise ValueError(f"config '{key}'={value!r}: expected {KIND_NAMES[kind]}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"config '{key}'={value!r}: allowed values are {list(allowed)}")
    return value


def _list(config: Mapping, key: str, kind: type) -> list:
    if key not in config:
        raise ValueError(f"config '{key}' is missing: expected a list of values, each {KIND_NAMES[kind]}")
    value = config[key]
    if not isinstance(value, list) or not all(is_kind(item, kind) for item in value):
        raise ValueError(f"config '{key}'={value!r}: expected a list of values, each {KIND_NAMES[kind]}")
    return value


def _subnet(config: Mapping, name: str) -> Subnet:
    """Subnet ``name``: its three lists, each item of its kind (whether it is a subnet of the model is the
    reader's check: ``SupernetConfig.check_subnet``)."""
    d, e, w = (_list(config, key, kind) for key, kind in zip(subnet_keys(name), (int, float, int)))
    return Subnet(d, e, w)
