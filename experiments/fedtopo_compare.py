"""FedTopo against its baselines (or, with --ablations, FedTopo's ablations): the suites
``experiments/suites/fedtopo.toml`` and ``fedtopo-ablations.toml`` run by ``experiments.runner``, each run a real
`flwr run` with 20 simulated SuperNodes; every other option is the runner's.

    python -m experiments.fedtopo_compare --out experiments/results/fedtopo-seeds
    python -m experiments.fedtopo_compare --out /tmp/fedtopo --seeds 0 --set num-server-rounds=4

``--out`` is required: nothing is written to the committed results unless that folder is named, and finished runs
there are reused or refused, never deleted.
"""

from __future__ import annotations

import argparse
import sys

from experiments import runner
from experiments.compare import SUITES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ablations", action="store_true", help="run suites/fedtopo-ablations.toml instead")
    args, rest = parser.parse_known_args(argv)
    suite = SUITES / ("fedtopo-ablations.toml" if args.ablations else "fedtopo.toml")
    return runner.main(["run", str(suite), *rest])


if __name__ == "__main__":
    sys.exit(main())
