"""FEAST client: train the local-max, the min and a random in-between subnet in one step (sandwich + in-place KD).

Also what every supernet-family client (FEAST and its baselines) accepts from the server: ``read_routed`` checks a
training message against what the method and the run config imply before anything is trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NoReturn

import numpy as np
import torch

from clients.broadcast import BROADCAST_MAX_ABS, Expect, config_problem, shapes_problem, values_problem
from clients.local_training import GRAD_CLIP_NORM, LocalSettings, MomentumSGD, augmented_batches
from fl_app.data.augment import soft_cross_entropy
from fl_app.data.images import ImageData
from fl_app.models.early_exit import level_shapes, scalefl_config
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet, SupernetConfig, width_sliced_config
from fl_app.run.config import Range
from fl_app.run.device import preferred_device
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
from fl_app.supernet.subnets import SubnetPlan, plan_subnets  # noqa: F401 (the plan clients train)


def masked(logits: torch.Tensor, logit_mask: torch.Tensor | None) -> torch.Tensor:
    # a large finite negative (not -inf) keeps 0 * log-prob finite in the soft cross-entropy
    return logits if logit_mask is None else logits.masked_fill(~logit_mask, -1e9)


def train_subnets(
    model: ElasticResNet,
    plan: SubnetPlan,
    data: ImageData,
    settings: LocalSettings,
    logit_mask: torch.Tensor | None = None,
) -> dict:
    """Local training; returns metrics. One Mixup/CutMix draw per step is shared by all subnets of that step.

    ``logit_mask`` (bool per class), when given, keeps only those classes' logits (HeteroFL's label masking)."""
    generator = torch.Generator().manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    device = preferred_device()
    model.to(device)
    if logit_mask is not None:
        logit_mask = logit_mask.to(device)
    optimizer = MomentumSGD(model.parameters(), settings.lr, settings.momentum, settings.weight_decay)
    num_classes = model.cfg.n_classes
    model.train()
    steps, loss_sum = 0, 0.0
    for images, targets in augmented_batches(data, settings, generator, rng, num_classes, device):
        logits = masked(model(images, plan.largest), logit_mask)
        loss = soft_cross_entropy(logits, targets)
        loss.backward()
        teacher = torch.softmax(logits.detach(), dim=1)
        students = [plan.smallest] if plan.smallest is not None else []
        if plan.between:
            students.append(plan.between[rng.integers(len(plan.between))])
        for arch in students:
            out = masked(model(images, arch), logit_mask)
            student_loss = (1 - settings.kd_ratio) * soft_cross_entropy(
                out, targets
            ) + settings.kd_ratio * soft_cross_entropy(out, teacher)
            student_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP_NORM, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        loss_sum += loss.item()
    model.cpu()
    return {"train-loss": loss_sum / max(steps, 1), "local-steps": steps}


# -- what a client accepts from the server ------------------------------------------------------------------------
@dataclass(frozen=True)
class Routing:
    """What a supernet method's server sends each client (``fl_app.supernet.message``): the ``model`` it slices
    (``message.MODELS``),
    whether it assigns the one subnet the client trains (else the client plans FEAST's step under its budget),
    whether BatchNorm running statistics travel (HeteroFL and FedRolex keep static BN: neither sent nor averaged),
    and whether the client masks the logits of labels it does not hold. A test keeps it in step with the strategies
    (every method's own messages pass ``read_routed``)."""

    model: str
    assigns_subnet: bool
    running_stats: bool
    mask_labels: bool = False  # HeteroFL: only the classifier rows of the labels a client holds are trained
    magnitude_mask: bool = False  # FIARSE: the client trains under the mask |w| >= the config's 'mask-threshold'


ROUTING = {
    "feast": Routing(SUPERNET, assigns_subnet=False, running_stats=True),
    "superfednas": Routing(SUPERNET, assigns_subnet=True, running_stats=True),
    "deepfednas": Routing(SUPERNET, assigns_subnet=True, running_stats=True),
    "heterofl": Routing(WIDTH_SLICED, assigns_subnet=True, running_stats=False, mask_labels=True),
    "fedrolex": Routing(WIDTH_SLICED, assigns_subnet=True, running_stats=False, mask_labels=True),
    "fedavg-min": Routing(SUPERNET, assigns_subnet=True, running_stats=True),
    "fiarse": Routing(SUPERNET, assigns_subnet=True, running_stats=False, magnitude_mask=True),
    # ScaleFL: a level of the depth- and width-scaled model with its early exits (fl_app.models.early_exit)
    "scalefl": Routing(EARLY_EXIT, assigns_subnet=True, running_stats=False),
}
Refusal = Callable[[str], NoReturn]  # raises the client's refusal of this round's broadcast, naming the problem


@dataclass(kw_only=True)
class Routed:
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


def read_routed(content, run, cfg: SupernetConfig, budget_range: tuple[int, int], pid: int, num: int) -> Routed:
    """What the server sent partition ``pid`` of ``num`` for one round, checked against what its method
    (``ROUTING``) and the run config ``run`` imply before anything is trained: the config values the client uses
    (round, learning rate, payload dtype, budgets within ``budget_range``, subnets of the model it slices), the
    arrays' keys and shapes (those of the routed bounds, from their metadata, before decoding), then finite values
    within ``BROADCAST_MAX_ABS``. Raises ``ValueError`` naming the key: the server counts the reply as failed."""
    routing = ROUTING[run["method"]]
    config = content.config_records.get(CONFIG_RECORD, {})
    model_cfg = {WIDTH_SLICED: width_sliced_config, EARLY_EXIT: scalefl_config}.get(routing.model, lambda c: c)(cfg)

    def refuse(problem: str) -> NoReturn:
        raise ValueError(f"client {pid} refuses the round-{config.get(SERVER_ROUND)} broadcast: {problem}")

    if not routing.assigns_subnet and any(key in config for key in subnet_keys(ARCH)):
        refuse(f"config '{ARCH}-*': method '{run['method']}' assigns no subnet (its client plans its own step)")
    problem = config_problem(config, _config_expects(run, routing, model_cfg, Range(*budget_range), num))
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
    rate = model_cfg.width_multiplier_choices[bounds.w[0]] if routing.model == WIDTH_SLICED else 1.0
    problem = config_problem(config, {WIDTH_RATE: Expect(float, (rate,), required=routing.model != SUPERNET)})
    if problem:
        refuse(problem)
    expected = _expected_shapes(routing, model_cfg, bounds, refuse, run["scalefl-levels"])
    dtype = str(instruction.payload_dtype)
    received = _received_arrays(content.array_records.get(ARRAYS_RECORD), expected, dtype, refuse)
    return Routed(
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
        threshold=float(instruction.mask_threshold) if routing.magnitude_mask else None,
    )


def _config_expects(run, routing: Routing, model_cfg: SupernetConfig, budgets: Range, num: int) -> dict[str, Expect]:
    """The config values a client of ``routing``'s method uses, with their types and allowed values."""
    return {
        SERVER_ROUND: Expect(int, Range(1, run["num-server-rounds"])),
        LR: Expect(float, Range(0.0, run["lr"])),
        PAYLOAD_DTYPE: Expect(str, (run["payload-dtype"],)),
        BUDGET_MACS: Expect(float, budgets),
        PARTITION_BUDGETS: Expect(float, budgets, length=num),
        MODEL: Expect(str, (routing.model,), required=routing.model != SUPERNET),
        MASK_LABELS: Expect(bool, (routing.mask_labels,), required=routing.mask_labels),
        MASK_THRESHOLD: Expect(
            float, Range(0.0, BROADCAST_MAX_ABS) if routing.magnitude_mask else (), required=routing.magnitude_mask
        ),
        **_subnet_expects(model_cfg, BOUNDS),
        **(_subnet_expects(model_cfg, ARCH) if routing.assigns_subnet else {}),
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
    routing: Routing, model_cfg: SupernetConfig, bounds: Subnet, refuse: Refusal, level_rule: str = "tiers"
) -> dict[str, tuple]:
    """Key -> shape of exactly the arrays routed for ``bounds`` (a ScaleFL level under ``level_rule``)."""
    if routing.model == EARLY_EXIT:  # a ScaleFL level: its parameters and exits (routed bounds not a level: refused)
        try:
            expected = level_shapes(model_cfg, bounds, level_rule)
        except ValueError as error:
            refuse(str(error))
    else:
        expected = subnet_shapes(model_cfg, bounds)
    if not routing.running_stats and routing.model != EARLY_EXIT:
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
