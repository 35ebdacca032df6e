"""Stand-in inputs of a client's local step: its settings (FEAST's or a plain one) and random images."""

from __future__ import annotations

import torch

from clients.local_training import LocalSettings
from fl_app.data.images import ImageData


def feast_settings(**overrides) -> LocalSettings:
    """A short FEAST step (at most 3 batches of 8) with crop/flip, Mixup and CutMix and KD 0.5 at the default
    learning rate; ``overrides`` replace fields."""
    settings = dict(
        epochs=1,
        max_steps=3,
        batch_size=8,
        lr=0.05,
        momentum=0.9,
        weight_decay=5e-4,
        kd_ratio=0.5,
        crop_flip=True,
        randaugment=False,
        mixup_alpha=0.2,
        cutmix_alpha=1.0,
        seed=0,
    )
    return LocalSettings(**(settings | overrides))


def plain_settings(**overrides) -> LocalSettings:
    """A short plain step (at most 2 batches of 8, lr 0.1, momentum 0.9, weight decay 5e-4) without KD or
    augmentation; ``overrides`` replace fields."""
    return feast_settings(
        **(dict(max_steps=2, lr=0.1, kd_ratio=0.0, crop_flip=False, mixup_alpha=0.0, cutmix_alpha=0.0) | overrides)
    )


def random_images(n: int, seed: int = 1) -> ImageData:
    """``n`` random 32x32 RGB images with random labels of 10 classes, the same for the same ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return ImageData(
        torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen),
        torch.randint(0, 10, (n,), generator=gen),
    )


def one_step_federation(num: int, **options):
    """(run config, federation, strategy) of a supernet-family run of ``num`` clients, all sampled, each training one
    batch of 8, every reply needed; ``options`` are run-config values (the method among them)."""
    from fl_app.run.config import validate_run_config
    from fl_app.supernet.shared_setup import SupernetSetup
    from fl_app.supernet_app import make_supernet_strategy, partition_reports

    run = validate_run_config(
        {"clients-per-round": num, "max-local-steps": 1, "batch-size": 8, "min-reply-fraction": 1.0, **options}
    )
    setup = SupernetSetup.build(run, num)
    budgets = setup.client_budgets(run, {})
    examples, held = partition_reports(run, setup, budgets)
    strategy = make_supernet_strategy(run, setup, budgets, {p: 100 + p for p in range(num)}, examples, held)
    return run, setup, strategy


def answered_round(strategy, arrays, train) -> list[tuple]:
    """(partition id, reply) of every round-1 message of ``strategy`` answered by the real client function
    ``train(message, partition id)``, each reply marked as its node's (no Flower runtime)."""
    from flwr.app import ConfigRecord

    from experiments.runner.flower_internals import set_message_id, set_reply_source

    out = []
    for i, message in enumerate(strategy.configure_train(1, arrays, ConfigRecord(), grid=None)):
        set_message_id(message, f"message-{i}")
        pid = next(p for p, node in strategy.node_of_partition.items() if node == message.metadata.dst_node_id)
        reply = train(message, pid)
        set_reply_source(reply, message.metadata.dst_node_id)
        out.append((pid, reply))
    return out
