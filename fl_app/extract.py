"""Cut the best subnet under a MAC budget out of a trained supernet, without retraining.

    python -m fl_app.extract --checkpoint RUN/supernet.pt --macs 5e6 --out subnet.pt             # search
    python -m fl_app.extract --checkpoint RUN/supernet.pt --macs 5e6 --out subnet.pt --from-cache

By default an evolutionary search over the whole search space (``fl_app.supernet.search``) scores subnets under the
budget on validation accuracy and picks the best; with ``--margin M`` it picks the largest one within M paired
standard errors of the best (a smaller subnet must then beat a larger one beyond the validation split's sampling
error); ``--from-cache`` takes the largest cached subnet under it instead. Either way
the chosen subnet's BatchNorm is recalibrated on the run's calibration split, and only then is the test split read,
once, for the report (the images the run's tiers were scored on: all of it, or the run's ``test-size`` sample).
Saves a standalone model (``ElasticResNet.load_standalone(path)``, or plain ``torch.load``) and prints JSON
``{macs, params, val_accuracy, accuracy, arch, source, candidates, out}``. ``--out`` must be a new file: the command
never overwrites anything (its checkpoint included) and never writes through a symlink.
``--checkpoint`` must be a run's final ``supernet.pt`` with its integrity record (content hash): a damaged, truncated
or unverified file, or a file of another kind (a round ``checkpoint.pt``), is refused naming the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fl_app.io.cli import print_json, tool_parser
from fl_app.io.files import existing_output, write_new_file
from fl_app.models.supernet_space import SupernetConfig, count_costs
from fl_app.run.checkpoint import load_verified
from fl_app.run.config import validate_run_config
from fl_app.supernet.evaluation import accuracy, extract_subnet, recalibrate_bn
from fl_app.supernet.search import ValidationScorer, evolutionary_search, prefer_larger
from fl_app.supernet.shared_setup import dataset_for, server_splits, server_test_set
from fl_app.supernet.subnets import SubnetCache

# --margin's default: 0, the plain best on validation. On the converged FEAST supernet (experiments/results/
# extraction-converged) it gave test accuracy rising with the budget at all six budgets, and a margin of 2 paired
# standard errors (prefer the larger subnet) did worse at five of them: the larger searched subnets were never
# trained as a unit
MARGIN = 0.0

# what each kind of verified file of this app holds: the final supernet is read, the others are named in the error
SUPERNET_KEYS = ("supernet", "state_dict", "run_config")
OTHER_KINDS = {
    "global_state": "a round checkpoint (checkpoint.pt) of a supernet run",
    "strategy": "a round checkpoint (checkpoint.pt) of a model-heterogeneous run",
    "model": "a FedTopo-family client model file",
}


def load_trained(checkpoint: Path) -> tuple[dict, object, SupernetConfig]:
    """(checkpoint blob, its run config, its supernet config) of a run's ``supernet.pt``. Only a verified file is
    read (``load_verified``: integrity record and content hash); anything else raises ``ValueError`` naming it."""
    blob = load_verified(checkpoint, what=f"--checkpoint {checkpoint}")
    missing = [key for key in SUPERNET_KEYS if key not in blob]
    if missing:
        kind = next((name for key, name in OTHER_KINDS.items() if key in blob), "not a trained supernet")
        raise ValueError(
            f"--checkpoint {checkpoint}: {kind}, not the final supernet.pt of a run (it lacks {missing}); "
            "extract from the supernet.pt a finished run wrote"
        )
    try:
        return blob, validate_run_config(blob["run_config"]), SupernetConfig.from_dict(blob["supernet"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"--checkpoint {checkpoint}: its run config or supernet config is unusable: {error}") from None


def choose(
    cfg: SupernetConfig,
    cache: SubnetCache,
    budget: float,
    scorer: ValidationScorer,
    from_cache: bool = False,
    seed: int = 0,
    population: int = 16,
    generations: int = 6,
    margin: float = MARGIN,
) -> dict:
    """The subnet to deploy under ``budget`` and how it was found; scores come from the validation split only. Of the
    searched candidates, the largest one within ``margin`` paired standard errors of the best is chosen
    (``prefer_larger``)."""
    if from_cache:
        chosen = cache.local_max(budget)
        return {"arch": chosen.arch, "val_accuracy": scorer(chosen.arch), "source": "cache", "candidates": 1}
    ranked = evolutionary_search(
        cfg,
        scorer,
        budget,
        seed=seed,
        population=population,
        generations=generations,
        start=[c.arch for c in reversed(cache.under(budget))],
    )
    chosen = prefer_larger(ranked, scorer, margin)
    in_cache = any(c.arch == chosen.arch for c in cache.entries)
    return {
        "arch": chosen.arch,
        "val_accuracy": chosen.val_accuracy,
        "source": "search (cached subnet)" if in_cache else "search",
        "candidates": len(ranked),
        "best_on_validation": {"macs": ranked[0].macs, "val_accuracy": ranked[0].val_accuracy},
    }


def refuse_to_overwrite(out: Path, checkpoint: Path) -> str | None:
    """Why writing ``out`` would destroy something (None when it is a new file)."""
    if out.resolve() == checkpoint.resolve():
        return f"--out {out} is the checkpoint itself"
    return existing_output(out)


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("fl_app.extract", __doc__)
    parser.add_argument("--checkpoint", required=True, type=Path, help="supernet.pt written by a run")
    parser.add_argument("--macs", required=True, type=float, help="inference budget in MACs, e.g. 5e6")
    parser.add_argument("--out", required=True, type=Path, help="new file for the standalone subnet")
    parser.add_argument("--from-cache", action="store_true", help="largest cached subnet under the budget, no search")
    parser.add_argument(
        "--subnet-cache",
        default=None,
        help="cache of --from-cache and of the search's first generation ('cpu', 'paper' or a CSV path; "
        "unset: the run's)",
    )
    add_search_options(parser, population=16, generations=6)
    return parser


def add_search_options(parser: argparse.ArgumentParser, population: int, generations: int) -> None:
    """The evolutionary search's options (``choose``), shared with ``experiments.studies.frontier``."""
    parser.add_argument("--population", type=int, default=population, help="search: candidates per generation")
    parser.add_argument("--generations", type=int, default=generations, help="search: generations")
    parser.add_argument("--seed", type=int, default=0, help="search: random seed")
    parser.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help="search: a smaller subnet wins over a larger one only when better on validation by more than this many "
        "paired standard errors (0: the plain best on validation)",
    )


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)

    if not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    problem = refuse_to_overwrite(args.out, args.checkpoint)
    if problem:
        parser.error(problem)
    if args.population < 2 or args.generations < 1:
        parser.error("--population must be >= 2 and --generations >= 1")
    if not args.margin >= 0:
        parser.error(f"--margin {args.margin}: must be a number >= 0")
    try:
        blob, run, cfg = load_trained(args.checkpoint)
    except ValueError as error:
        parser.error(str(error))
    cache = SubnetCache.load(cfg, args.subnet_cache or run.subnet_cache)
    smallest = cache.min_macs if args.from_cache else count_costs(cfg, cfg.min_subnet())[0]
    if args.macs < smallest:
        parser.error(
            f"--macs {args.macs:.0f}: below the smallest {'cached ' if args.from_cache else ''}subnet ({smallest} MACs)"
        )

    train, whole_test = dataset_for(run, cfg)
    test = server_test_set(run, whole_test)  # the images the run's tiers were scored on
    splits = server_splits(run, train)
    calibration = train.subset(splits.calibration)
    scorer = ValidationScorer(cfg, blob["state_dict"], calibration, train.subset(splits.validation))
    found = choose(
        cfg, cache, args.macs, scorer, args.from_cache, args.seed, args.population, args.generations, args.margin
    )

    model = extract_subnet(cfg, blob["state_dict"], found["arch"])
    recalibrate_bn(model, calibration.images)
    macs, params = count_costs(cfg, found["arch"])
    result = {
        "macs": macs,
        "params": params,
        "val_accuracy": found["val_accuracy"],
        "accuracy": accuracy(model, test),  # the run's test images (test-size), read once for the chosen subnet
        "arch": found["arch"].to_dict(),
        "source": found["source"],
        "candidates": found["candidates"],
        **({"best_on_validation": found["best_on_validation"]} if "best_on_validation" in found else {}),
        "out": str(args.out),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:  # a fresh temporary file linked into place: fails, writing nothing, if --out appeared while we worked
        write_new_file(args.out, model.save_standalone, mode=None)
    except FileExistsError:
        parser.error(f"--out {args.out} appeared meanwhile; nothing written")
    print_json(result, [{k: result[k] for k in ("macs", "params", "val_accuracy", "accuracy", "source", "out")}])
    return result


if __name__ == "__main__":
    main()
