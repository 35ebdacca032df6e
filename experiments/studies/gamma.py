"""γ study (data share ∝ budget^γ): the suite ``experiments/suites/gamma.toml`` (FEAST and DeepFedNAS at
γ = 0, 0.5, 1, 1.5) run by ``experiments.runner``; every option is the runner's.

    python -m experiments.studies.gamma --out experiments/results/gamma-seeds
    python -m experiments.studies.gamma --out /tmp/gamma --methods feast,heterofl --seeds 0

The suite's tables give each (method, γ) cell's mean and interval over seeds and the paired difference against
DeepFedNAS in the same cell.
"""

from __future__ import annotations

import argparse
import sys

from experiments import runner

SUITE = "gamma.toml"


def build_parser() -> argparse.ArgumentParser:
    return runner.suite_parser("experiments.studies.gamma", __doc__)


def main(argv: list[str] | None = None) -> int:
    return runner.run_named_suite(build_parser(), SUITE, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
