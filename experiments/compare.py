"""FEAST against its baselines (or, with --ablations, FEAST's ablations): the suites ``experiments/suites/compare.toml``
and ``ablations.toml`` run by ``experiments.runner``; every other option is the runner's.

    python -m experiments.compare --out experiments/results/compare-seeds
    python -m experiments.compare --out /tmp/ablations --ablations --seeds 0 --set num-server-rounds=4

Same as ``python -m experiments.runner run experiments/suites/compare.toml --out DIR ...``: each (method, seed) is
one `flwr run`; finished runs are reused only when their settings match, and a folder holding runs with other
settings is refused with the differing keys named.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments import runner

SUITES = Path(__file__).resolve().parent / "suites"
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ablations", action="store_true", help="run suites/ablations.toml instead")
    args, rest = parser.parse_known_args(argv)
    suite = SUITES / ("ablations.toml" if args.ablations else "compare.toml")
    return runner.main(["run", str(suite), *rest])


if __name__ == "__main__":
    sys.exit(main())
