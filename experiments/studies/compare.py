"""FEAST against its baselines (or, with --ablations, FEAST's ablations): the suites ``experiments/suites/compare.toml``
and ``ablations.toml`` run by ``experiments.runner``; every other option is the runner's.

    python -m experiments.studies.compare --out experiments/results/compare-seeds
    python -m experiments.studies.compare --out /tmp/ablations --ablations --seeds 0 --run-config "num-server-rounds=4"

Same as ``python -m experiments.runner run experiments/suites/compare.toml --out DIR ...``: each (method, seed) is
one `flwr run`; finished runs are reused only when their settings match, and a folder holding runs with other
settings is refused with the differing keys named.
"""

from __future__ import annotations

import argparse
import sys

from experiments import runner

SUITE, ABLATIONS = "compare.toml", "ablations.toml"


def build_parser() -> argparse.ArgumentParser:
    return runner.suite_parser("experiments.studies.compare", __doc__, ABLATIONS)


def main(argv: list[str] | None = None) -> int:
    return runner.run_named_suite(build_parser(), SUITE, ABLATIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
