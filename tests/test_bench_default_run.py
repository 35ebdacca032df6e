"""The default-run benchmark's timeline: phases and the clients' schedule bound from a Flower DEBUG log."""

from __future__ import annotations

from datetime import datetime

import pytest

from experiments.benchmarks.bench_default_run import timeline

DAY = "2026-12-01 06:10:"


def line(second: float, text: str) -> str:
    return f"INFO {DAY}{second:06.3f}".replace(".", ",") + f":  {text}"


def stamp(second: float) -> float:
    return datetime.strptime(f"{DAY}{second:06.3f}", "%Y-%m-%d %H:%M:%S.%f").timestamp()


def test_schedule_bound_and_idle_cores_match_a_hand_computation():
    t = stamp
    log = [
        line(1, "Starting Flower Simulation"),
        line(2, "Loading ClientApp `fl_app.client_app:app`"),
        line(3, "Initialising: RayBackend"),
        line(5, "Constructed ActorPool with: 2 actors"),
        line(6, "[ROUND 1/2]"),
        # round 1: one long client (4 s) and two short ones (1 s each) on two cores: the long one bounds the round
        f"client timeline: partition 0 round 1 from {t(6.5)} to {t(10.5)}",
        f"client timeline: partition 1 round 1 from {t(6.5)} to {t(7.5)}",
        f"client timeline: partition 2 round 1 from {t(7.5)} to {t(8.5)}",
        line(11, "└──> {'train-loss': 1.0}"),
        line(12, "evaluation: tiers"),
        line(12.5, "round 1: 6.5s, server memory 1 MiB (peak 1)"),
        line(13, "[ROUND 2/2]"),
        # round 2: three equal clients (2 s) dispatched badly: 4 s of 6 busy seconds over 2 cores = bound 3 s
        f"client timeline: partition 0 round 2 from {t(13)} to {t(15)}",
        f"client timeline: partition 1 round 2 from {t(15)} to {t(17)}",
        f"client timeline: partition 2 round 2 from {t(13)} to {t(15)}",
        line(17.5, "└──> {'train-loss': 1.0}"),
        line(18, "round 2: 5.0s, server memory 1 MiB (peak 1)"),
        line(19, "ServerApp finished running."),
    ]
    result = timeline("\n".join(log), started=t(0), ended=t(20), cores=2)
    assert result["clients_training_s"] == pytest.approx(4.0 + 4.0)
    assert result["client_busy_s"] == pytest.approx(6.0 + 6.0)
    assert result["idle_core_s"] == pytest.approx((2 * 4 - 6) + (2 * 4 - 6))
    assert result["clients_schedule_bound_s"] == pytest.approx(4.0 + 3.0)
    assert result["evaluation_s"] == pytest.approx(1.0)
    assert result["ray_start_s"] == pytest.approx(2.0) and result["shutdown_s"] == pytest.approx(1.0)
