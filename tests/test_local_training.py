"""The batch order every client's local training uses (``clients.local_training.local_batches``), and its settings: each
run-config key in its field, by keyword."""

from __future__ import annotations

import torch

from clients.local_training import LocalSettings, local_batches
from tests.harness.training import plain_settings


def settings(epochs: int, max_steps: int, batch_size: int) -> LocalSettings:
    return plain_settings(
        epochs=epochs, max_steps=max_steps, batch_size=batch_size, weight_decay=0.0, kd_ratio=0.5, crop_flip=True
    )


def test_batches_follow_the_seeded_permutation_and_skip_a_last_single_sample():
    batches = list(local_batches(9, settings(1, 0, 4), torch.Generator().manual_seed(3)))
    order = torch.randperm(9, generator=torch.Generator().manual_seed(3))
    assert [b.tolist() for b in batches] == [order[:4].tolist(), order[4:8].tolist()]  # order[8:] alone: skipped


def test_the_step_cap_spans_epochs_and_every_epoch_still_draws_its_permutation():
    generator = torch.Generator().manual_seed(5)
    batches = list(local_batches(9, settings(3, 3, 4), generator))
    reference = torch.Generator().manual_seed(5)
    first, second = torch.randperm(9, generator=reference), torch.randperm(9, generator=reference)
    torch.randperm(9, generator=reference)  # the third epoch's, drawn although the cap is reached
    assert [b.tolist() for b in batches] == [first[:4].tolist(), first[4:8].tolist(), second[:4].tolist()]
    assert torch.equal(generator.get_state(), reference.get_state())


def test_augmentation_draws_interleave_as_in_a_nested_loop():
    """A caller drawing from the same generator per batch (crop and flip do) sees the sequence of the nested loop
    over epochs and batches with both of the loops' historic check orders (short batch first, cap first)."""

    def nested(short_first: bool) -> list:
        generator, seen, steps = torch.Generator().manual_seed(11), [], 0
        for _ in range(2):
            order = torch.randperm(7, generator=generator)
            for start in range(0, 7, 3):
                idx = order[start : start + 3]
                if short_first and len(idx) < 2:
                    continue
                if steps >= 3:
                    break
                if len(idx) < 2:
                    continue
                seen.append((idx.tolist(), torch.rand(1, generator=generator).item()))
                steps += 1
        return seen

    generator = torch.Generator().manual_seed(11)
    seen = [
        (idx.tolist(), torch.rand(1, generator=generator).item())
        for idx in local_batches(7, settings(2, 3, 3), generator)
    ]
    assert seen == nested(True) == nested(False)
    assert len(seen) == 3


def test_settings_are_built_by_keyword_each_run_key_in_its_field():
    import pytest

    from fl_app.run.config import validate_run_config

    run = validate_run_config(
        {
            "local-epochs": 3,
            "max-local-steps": 7,
            "batch-size": 16,
            "momentum": 0.8,
            "weight-decay": 1e-3,
            "kd-ratio": 0.25,
            "crop-flip": False,
            "randaugment": True,
            "mixup-alpha": 0.3,
            "cutmix-alpha": 0.6,
        }
    )
    assert LocalSettings.from_run(run, lr=0.02, seed=11) == LocalSettings(
        epochs=3,
        max_steps=7,
        batch_size=16,
        lr=0.02,
        momentum=0.8,
        weight_decay=1e-3,
        kd_ratio=0.25,
        crop_flip=False,
        randaugment=True,
        mixup_alpha=0.3,
        cutmix_alpha=0.6,
        seed=11,
    )
    with pytest.raises(TypeError):
        LocalSettings(3, 7, 16, 0.02, 0.8, 1e-3, 0.25, False, True, 0.3, 0.6, 11)
