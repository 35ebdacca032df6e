"""FedTopo against its baselines (or, with --ablations, FedTopo's ablations): the suites
``experiments/suites/fedtopo.toml`` and ``fedtopo-ablations.toml`` run by ``experiments.runner``, each run a real
`flwr run` with 20 simulated SuperNodes; every other option is the runner's.

    python -m experiments.studies.fedtopo_compare --out experiments/results/fedtopo-seeds
    python -m experiments.studies.fedtopo_compare --out /tmp/fedtopo --seeds 0 --run-config "num-server-rounds=4"

``--out`` is required: nothing is written to the committed results unless that folder is named, and finished runs
there are reused or refused, never deleted.
"""

from __future__ import annotations

import argparse
import sys

from experiments import runner

SUITE, ABLATIONS = "fedtopo.toml", "fedtopo-ablations.toml"


def build_parser() -> argparse.ArgumentParser:
    return runner.suite_parser("experiments.studies.fedtopo_compare", __doc__, ABLATIONS)


def main(argv: list[str] | None = None) -> int:
    return runner.run_named_suite(build_parser(), SUITE, ABLATIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
