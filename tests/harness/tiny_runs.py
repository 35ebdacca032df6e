"""The two-round FEAST run the end-to-end tests start through `flwr run` (tiny shapes, the bundled sample), shared by
the test files that each start such runs (one file per pytest-xdist worker, so runs in two files train side by side)."""

from __future__ import annotations

from experiments.runner.flower_runs import flwr_run as run_app
from experiments.runner.flower_runs import format_run_config

TINY_VALUES = {
    "num-server-rounds": 2,
    "clients-per-round": 2,
    "max-local-steps": 3,
    "batch-size": 16,
    "eval-every": 1,
    "val-size": 200,
    "calib-size": 200,
    "tiers": "0.5e6,2e6,13.6e6",
    "checkpoint-every": 1,
}
TINY = format_run_config(TINY_VALUES)
NUM_SUPERNODES = 4
FEDERATION = f"num-supernodes={NUM_SUPERNODES} client-resources-num-cpus=1"


def flwr_run(env, run_config: str, timeout: int = 600) -> tuple[str, str]:
    """Run the app, wait for it (--stream) and return (run id, final status from `flwr ls`)."""
    return run_app(run_config, FEDERATION, env=env, timeout=timeout)
