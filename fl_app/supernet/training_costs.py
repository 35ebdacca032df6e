"""What a supernet client's local training cost: the forward MACs of the plan it trained (its largest, smallest and
in-between subnets), turned into reply metrics by the costing every family shares (``fl_app.run.costs``)."""

from __future__ import annotations

from fl_app.models.supernet_space import SupernetConfig, count_macs
from fl_app.run.costs import model_train_costs


def plan_step_macs(cfg: SupernetConfig, largest, smallest, between: list) -> float:
    """Forward MACs of one local step that trains ``largest``, ``smallest`` (when given) and one subnet drawn from
    ``between`` (its expected MACs: the mean over the list). The client and the server both cost a round with it."""
    step_macs = count_macs(cfg, largest) + (count_macs(cfg, smallest) if smallest is not None else 0)
    if between:
        step_macs += sum(count_macs(cfg, arch) for arch in between) / len(between)
    return step_macs


def train_costs(cfg: SupernetConfig, largest, smallest, between: list, samples: int) -> dict:
    """Reply metrics of one round of local training of the plan ``plan_step_macs`` costs."""
    return model_train_costs(plan_step_macs(cfg, largest, smallest, between), count_macs(cfg, largest), samples)
