"""What every supernet-family client (FEAST and the methods built on the supernet) accepts from the server:
``read_instruction`` checks a training message against what the method (``MESSAGE_SPECS``) and the run config imply
before anything is trained, and returns it as a ``CheckedInstruction``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NoReturn

import numpy as np
import torch

from clients.broadcast import BROADCAST_MAX_ABS, Expect, config_problem, shapes_problem, values_problem
from fl_app.models.early_exit import level_shapes, scalefl_config
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet, SupernetConfig, width_sliced_config
from fl_app.run.config import Range
from fl_app.run.payload import record_to_state
from fl_app.run.records import ARRAYS_RECORD, CONFIG_RECORD
from fl_app.supernet.message import (
    ARCH,
    BOUNDS,
    BUDGET_MACS,
    EARLY_EXIT,
    LR,
    MASK_LABELS,
    MASK_THRESHOLD,
    MODEL,
    PARTITION_BUDGETS,
    PAYLOAD_DTYPE,
    SERVER_ROUND,
    SUPERNET,
    WIDTH_RATE,
    WIDTH_SLICED,
    TrainInstruction,
    subnet_keys,
)
from fl_app.supernet.slicing import subnet_shapes


@dataclass(frozen=True)
class MessageSpec:
    """What a supernet method's server sends each client (``fl_app.supernet.message``): the ``model`` it slices
    (``message.MODELS``),
    whether it assigns the one subnet the client trains (else the client plans FEAST's step under its budget),
    whether BatchNorm running statistics travel (HeteroFL and FedRolex keep static BN: neither sent nor averaged),
    and whether the client masks the logits of labels it does not hold. A test keeps it in step with the strategies
    (every method's own messages pass ``read_instruction``)."""

    model: str
    assigns_subnet: bool
    running_stats: bool
    mask_labels: bool = False  # HeteroFL: only the classifier rows of the labels a client holds are trained
    magnitude_mask: bool = False  # FIARSE: the client trains under the mask |w| >= the config's 'mask-threshold'


MESSAGE_SPECS = {
    "feast": MessageSpec(SUPERNET, assigns_subnet=False, running_stats=True),
    "superfednas": MessageSpec(SUPERNET, assigns_subnet=True, running_stats=True),
    "deepfednas": MessageSpec(SUPERNET, assigns_subnet=True, running_stats=True),
    "heterofl": MessageSpec(WIDTH_SLICED, assigns_subnet=True, running_stats=False, mask_labels=True),
    "fedrolex": MessageSpec(WIDTH_SLICED, assigns_subnet=True, running_stats=False, mask_labels=True),
    "fedavg-min": MessageSpec(SUPERNET, assigns_subnet=True, running_stats=True),
    "fiarse": MessageSpec(SUPERNET, assigns_subnet=True, running_stats=False, magnitude_mask=True),
    # ScaleFL: a level of the depth- and width-scaled model with its early exits (fl_app.models.early_exit)
    "scalefl": MessageSpec(EARLY_EXIT, assigns_subnet=True, running_stats=False),
}
Refusal = Callable[[str], NoReturn]  # raises the client's refusal of this round's broadcast, naming the problem


@dataclass(kw_only=True)
class CheckedInstruction:
    """A checked training message: the model config, the routed bounds, the assigned subnet (None: plan FEAST's
    step), the client's budget, every partition's budget, and the decoded arrays (exactly the routed ones). Built by
    keyword only."""

    cfg: SupernetConfig
    bounds: Subnet
    arch: Subnet | None
    budget: float
    partition_budgets: list[float]
    received: dict[str, np.ndarray]
    server_round: int
    lr: float
    width_rate: float
    mask_labels: bool
    dtype: str
    threshold: float | None = None  # FIARSE's magnitude threshold (None: no mask)


def read_instruction(
    content, run, cfg: SupernetConfig, budget_range: tuple[int, int], pid: int, num: int
) -> CheckedInstruction:
    """What the server sent partition ``pid`` of ``num`` for one round, checked against what its method
    (``MESSAGE_SPECS``) and the run config ``run`` imply before anything is trained: the config values the client uses
    (round, learning rate, payload dtype, budgets within ``budget_range``, subnets of the model it slices), the
    arrays' keys and shapes (those of the routed bounds, from their metadata, before decoding), then finite values
    within ``BROADCAST_MAX_ABS``. Raises ``ValueError`` naming the key: the server counts the reply as failed."""
    spec = MESSAGE_SPECS[run["method"]]
    config = content.config_records.get(CONFIG_RECORD, {})
    model_cfg = {WIDTH_SLICED: width_sliced_config, EARLY_EXIT: scalefl_config}.get(spec.model, lambda c: c)(cfg)

    def refuse(problem: str) -> NoReturn:
        raise ValueError(f"client {pid} refuses the round-{config.get(SERVER_ROUND)} broadcast: {problem}")

    if not spec.assigns_subnet and any(key in config for key in subnet_keys(ARCH)):
        refuse(f"config '{ARCH}-*': method '{run['method']}' assigns no subnet (its client plans its own step)")
    problem = config_problem(config, _config_expects(run, spec, model_cfg, Range(*budget_range), num))
    if problem:
        refuse(problem)
    try:  # the run's checks above are stricter than the message's own: this never refuses what they passed
        instruction = TrainInstruction.from_config(config)
    except ValueError as error:
        refuse(str(error))
    budget, partition_budgets = float(instruction.budget_macs), [float(b) for b in instruction.partition_budgets]
    if budget != partition_budgets[pid]:
        refuse(
            f"config '{BUDGET_MACS}'={budget:g} is not its entry of '{PARTITION_BUDGETS}' ({partition_budgets[pid]:g})"
        )
    bounds, arch = _routed_subnets(instruction, model_cfg, refuse)
    rate = model_cfg.width_multiplier_choices[bounds.w[0]] if spec.model == WIDTH_SLICED else 1.0
    problem = config_problem(config, {WIDTH_RATE: Expect(float, (rate,), required=spec.model != SUPERNET)})
    if problem:
        refuse(problem)
    expected = _expected_shapes(spec, model_cfg, bounds, refuse, run["scalefl-levels"])
    dtype = str(instruction.payload_dtype)
    received = _received_arrays(content.array_records.get(ARRAYS_RECORD), expected, dtype, refuse)
    return CheckedInstruction(
        cfg=model_cfg,
        bounds=bounds,
        arch=arch,
        budget=budget,
        partition_budgets=partition_budgets,
        received=received,
        server_round=int(instruction.server_round),
        lr=float(instruction.lr),
        width_rate=rate,
        mask_labels=bool(instruction.mask_labels or False),
        dtype=dtype,
        threshold=float(instruction.mask_threshold) if spec.magnitude_mask else None,
    )


def _config_expects(run, spec: MessageSpec, model_cfg: SupernetConfig, budgets: Range, num: int) -> dict[str, Expect]:
    """The config values a client of ``spec``'s method uses, with their types and allowed values."""
    return {
        SERVER_ROUND: Expect(int, Range(1, run["num-server-rounds"])),
        LR: Expect(float, Range(0.0, run["lr"])),
        PAYLOAD_DTYPE: Expect(str, (run["payload-dtype"],)),
        BUDGET_MACS: Expect(float, budgets),
        PARTITION_BUDGETS: Expect(float, budgets, length=num),
        MODEL: Expect(str, (spec.model,), required=spec.model != SUPERNET),
        MASK_LABELS: Expect(bool, (spec.mask_labels,), required=spec.mask_labels),
        MASK_THRESHOLD: Expect(
            float, Range(0.0, BROADCAST_MAX_ABS) if spec.magnitude_mask else (), required=spec.magnitude_mask
        ),
        **_subnet_expects(model_cfg, BOUNDS),
        **(_subnet_expects(model_cfg, ARCH) if spec.assigns_subnet else {}),
    }


def _routed_subnets(
    instruction: TrainInstruction, model_cfg: SupernetConfig, refuse: Refusal
) -> tuple[Subnet, Subnet | None]:
    """(routed bounds, assigned subnet or None), each a subnet of ``model_cfg``, the subnet inside the bounds."""
    bounds, arch = instruction.bounds, instruction.arch
    for name, subnet in ((BOUNDS, bounds), (ARCH, arch)):
        try:
            if subnet is not None:
                model_cfg.check_subnet(subnet)
        except ValueError as error:
            refuse(f"config '{name}-*': {error}")
    if arch is not None and not arch.within(bounds):
        refuse(f"config '{ARCH}-*': the assigned subnet is not inside the routed bounds '{BOUNDS}-*'")
    return bounds, arch


def _expected_shapes(
    spec: MessageSpec, model_cfg: SupernetConfig, bounds: Subnet, refuse: Refusal, level_rule: str = "tiers"
) -> dict[str, tuple]:
    """Key -> shape of exactly the arrays routed for ``bounds`` (a ScaleFL level under ``level_rule``)."""
    if spec.model == EARLY_EXIT:  # a ScaleFL level: its parameters and exits (routed bounds not a level: refused)
        try:
            expected = level_shapes(model_cfg, bounds, level_rule)
        except ValueError as error:
            refuse(str(error))
    else:
        expected = subnet_shapes(model_cfg, bounds)
    if not spec.running_stats and spec.model != EARLY_EXIT:
        # BatchNorm statistics are the model's buffers: only its parameters travel
        with torch.device("meta"):
            parameters = {name for name, _ in ElasticResNet(model_cfg, bounds).named_parameters()}
        expected = {k: v for k, v in expected.items() if k in parameters}
    return expected


def _received_arrays(record, expected: dict[str, tuple], dtype: str, refuse: Refusal) -> dict[str, np.ndarray]:
    """The arrays of ``record`` decoded as ``dtype``: keys and shapes checked from the metadata first, then the
    values (finite, within ``BROADCAST_MAX_ABS``)."""
    problem = "no 'arrays' record" if record is None else shapes_problem(record, expected)
    if problem:
        refuse(problem)
    try:
        received = record_to_state(record, dtype)
    except ValueError as error:  # the data's own header disagrees with its metadata
        refuse(str(error))
    problem = values_problem(received)
    if problem:
        refuse(problem)
    return received


def _subnet_expects(cfg: SupernetConfig, name: str) -> dict[str, Expect]:
    """The lists of subnet ``name`` (bounds or arch): depth and expansion ratio per stage, width index per stage and
    the stem."""
    d, e, w = subnet_keys(name)
    stages = cfg.num_stages
    return {d: Expect(int, length=stages), e: Expect(float, length=stages), w: Expect(int, length=stages + 1)}
