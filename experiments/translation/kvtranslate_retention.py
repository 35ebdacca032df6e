"""Retention study: how much of the target's F1 translated caches keep on held-out phrasings and long contexts,
per translator variant and seed, with confidence intervals over seeds.

Each run trains one translator variant for one seed on the pair (training names and templates only), then scores
direct reading and the translated cache on four fixed sets: held-out names with held-out fact/question templates
(`heldout_phrasing`), held-out names with the training templates (`training_phrasing`), long passages of 22
facts (`long`, held-out names and templates) and the same long passages with the training templates
(`long_training_phrasing`). F1 retention = translated F1 / direct F1 on the same set. One JSON line per run is
appended to OUT (default experiments/results/kvtranslate/retention_study.jsonl) and printed; the summary
(`..._summary.json`, rewritten after the runs, or alone with `--summary`) gives per-variant means with 95%
t-intervals over seeds and paired differences (same seed) to each of `--baselines`. A table of the summary goes
to stderr. With `--probe` the held-out phrasing and long sets are also scored with the target's own keys, then
its own values, put into the translated cache (which half of the translation loses the facts).

    python -m experiments.translation.kvtranslate_retention --variants mot,mot:phrase_mix=0.5 --seeds 0,1,2
    python -m experiments.translation.kvtranslate_retention --summary --baselines mot,mot:phrase_mix=0.5

A variant is a translator kind with optional training overrides, each after a colon: `mot`, `single`,
`shared-latent`, `mot:phrase_mix=0.5:w_ccl=3`, `shared-latent:steps=2000` (its own step count instead of `--steps`).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kvtranslate.cli import HelpFormatter, comma_list, int_list, print_table  # noqa: E402
from kvtranslate.corpus import make_dataset  # noqa: E402
from kvtranslate.evaluate import PROBE_MODES, qa_scores  # noqa: E402
from kvtranslate.models import DTYPES, ModelPair, load_pair, pick_device, set_threads  # noqa: E402
from kvtranslate.pipeline import EncodedItem, encode_pair_items, long_items, position_limit  # noqa: E402
from kvtranslate.train import TRAIN_DEFAULTS, train_translator  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "kvtranslate")
DEFAULT_OUT = os.path.join(RESULTS, "retention_study.jsonl")
SETS = ("heldout_phrasing", "training_phrasing", "long", "long_training_phrasing")
PROBE_SETS = ("heldout_phrasing", "long")


def probe_metric(set_name: str, mode: str) -> str:
    """The row key of a set's F1 retention under a probe mode, e.g. ``long_native_keys_retention``."""
    return f"{set_name}_{mode.replace('-', '_')}_retention"


def parse_variant(text: str) -> dict[str, Any]:
    """'mot:phrase_mix=0.5:w_ccl=0' -> {"kind": "mot", "phrase_mix": 0.5, "w_ccl": 0.0}."""
    kind, *rest = text.split(":")
    overrides: dict[str, Any] = dict(kind=kind)
    for part in filter(None, rest):
        key, _, value = part.partition("=")
        if key not in TRAIN_DEFAULTS:
            raise ValueError(f"variant {text!r}: {key!r} is not a training setting (allowed: {sorted(TRAIN_DEFAULTS)})")
        default = TRAIN_DEFAULTS[key]
        overrides[key] = type(default)(value) if not isinstance(default, tuple) else default
    return overrides


def eval_sets(pair: ModelPair, n: int, n_long: int, seed: int = 99) -> dict[str, list[EncodedItem]]:
    """The three fixed evaluation sets (SETS), encoded for the pair."""
    tokenizers = [pair.source_tok, pair.target_tok]
    items = dict(
        heldout_phrasing=make_dataset(n, seed=seed, split="eval", template_split="eval"),
        training_phrasing=make_dataset(n, seed=seed, split="eval", template_split="train"),
        long=long_items(n_long, seed + 1, tokenizers, position_limit(pair.target), 22),
        # the same long passages phrased with the training templates: what length costs without the phrasing
        long_training_phrasing=long_items(
            n_long, seed + 1, tokenizers, position_limit(pair.target), 22, template_split="train"
        ),
    )
    return {k: encode_pair_items(pair, v) for k, v in items.items()}


def t_interval(values: list[float]) -> tuple[float, float | None]:
    """Mean and half-width of the 95% t-interval (None for a single value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(len(values), 2.0)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def summarise(path: str, baselines: list[str] | None = None) -> dict[str, Any]:
    """Per variant: mean and 95% t-interval over seeds of every metric, and the paired difference (same seed) to
    each baseline variant (default: the first variant in the file) with the seeds it pairs. Writes
    ..._summary.json beside `path`."""
    runs = [json.loads(line) for line in open(path)]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    baselines = baselines or variants[:1]
    unknown = [b for b in baselines if b not in variants]
    if unknown:
        raise ValueError(f"--baselines {unknown} have no runs in {path} (variants there: {variants})")
    metrics = [f"{s}_{m}" for s in SETS for m in ("f1", "retention", "acc", "binding_acc")]
    metrics += [probe_metric(s, m) for s in PROBE_SETS for m in PROBE_MODES]
    summary: dict[str, Any] = dict(source=runs[0]["source"], target=runs[0]["target"], baselines=baselines, variants={})
    for v in variants:
        rows = [r for r in runs if r["variant"] == v]
        by_seed = {r["seed"]: r for r in rows}
        entry: dict[str, Any] = dict(seeds=sorted(r["seed"] for r in rows), steps=sorted({r["steps"] for r in rows}))
        for m in metrics:
            values = [r[m] for r in rows if r.get(m) is not None]
            if values:
                entry[m] = dict(zip(("mean", "ci95"), t_interval(values)))
        for b in baselines:
            base = {r["seed"]: r for r in runs if r["variant"] == b}
            for m in metrics:
                seeds = [
                    r["seed"]
                    for r in rows
                    if r["seed"] in base and r.get(m) is not None and base[r["seed"]].get(m) is not None
                ]
                if v != b and seeds:
                    paired = [by_seed[s][m] - base[s][m] for s in seeds]
                    entry[f"{m}_minus_{b}"] = dict(zip(("mean", "ci95"), t_interval(paired)), seeds=sorted(seeds))
        summary["variants"][v] = entry
    out = path.replace(".jsonl", "_summary.json")
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    print_summary(summary)
    return summary


def mean_ci(entry: dict[str, Any], key: str) -> str:
    m = entry.get(key)
    if m is None:
        return "-"
    return f"{m['mean']:.3f}" + ("" if m["ci95"] is None else f" +- {m['ci95']:.3f}")


def print_summary(summary: dict[str, Any]) -> None:
    """Means +- 95% t-interval per variant, then the paired differences to each baseline (stderr)."""
    keys = (
        "heldout_phrasing_retention",
        "training_phrasing_retention",
        "long_retention",
        "long_training_phrasing_retention",
    )
    print_table(
        ["variant", "seeds", *keys],
        [[v, ",".join(map(str, e["seeds"]))] + [mean_ci(e, k) for k in keys] for v, e in summary["variants"].items()],
    )
    rows = [
        [v, b] + [mean_ci(e, f"{k}_minus_{b}") for k in keys]
        for b in summary["baselines"]
        for v, e in summary["variants"].items()
        if f"{keys[0]}_minus_{b}" in e
    ]
    print_table(["variant", "minus", *keys], rows)


def study_parser(prog: str, doc: str, variants: str, variants_help: str) -> argparse.ArgumentParser:
    """The flags every translator-variant study shares: the pair, the variants, device, dtype and threads."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--source", default="tiny-gpt2", help="source model (tiny name, folder or hub id)")
    parser.add_argument("--target", default="tiny-qwen2", help="target model (tiny name, folder or hub id)")
    parser.add_argument("--variants", type=comma_list, default=variants, help=variants_help)
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or auto")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="dtype the models load in (auto: their own)")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's own; the committed studies ran with 1)"
    )
    return parser


def study_setup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[dict[str, dict], ModelPair]:
    """The parsed variants and the loaded pair; a bad variant, device or thread count is a usage error first."""
    try:
        variants = {v: parse_variant(v) for v in args.variants}
        set_threads(args.threads)
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    return variants, load_pair(args.source, args.target, device, args.dtype)


def main(argv: list[str] | None = None) -> None:
    parser = study_parser(
        "python -m experiments.translation.kvtranslate_retention",
        __doc__,
        "mot,single,shared-latent",
        "comma-separated variants: a kind with overrides after colons (mot:phrase_mix=0.5:w_ccl=3)",
    )
    parser.add_argument("--seeds", type=int_list, default="0,1,2", help="comma-separated translator seeds")
    parser.add_argument("--steps", type=int, default=TRAIN_DEFAULTS["steps"], help="translator training steps")
    parser.add_argument("--n", type=int, default=300, help="passages per short set")
    parser.add_argument("--n-long", type=int, default=100, help="long passages")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON-lines file the runs are appended to")
    parser.add_argument(
        "--baselines",
        type=comma_list,
        default=None,
        help="comma-separated variants the summary's paired differences are taken to (default: the first in OUT)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="also score held-out phrasings and long contexts with the target's own keys, then its own values, "
        "put into the translated cache (PROBE_SETS: which half loses the facts)",
    )
    parser.add_argument("--summary", action="store_true", help="only rewrite the summary of OUT")
    args = parser.parse_args(argv)
    if args.summary:
        summarise(args.out, args.baselines)
        return
    variants, pair = study_setup(parser, args)
    data = eval_sets(pair, args.n, args.n_long)
    direct = {k: qa_scores(d, "direct", pair)[0] for k, d in data.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for seed in args.seeds:
        for name, overrides in variants.items():
            t0 = time.time()
            settings = {"steps": args.steps, **overrides, "seed": seed}  # a variant may set its own steps
            translator = train_translator(pair, log=lambda line: None, **settings)[0]
            row = dict(
                source=args.source,
                target=args.target,
                variant=name,
                seed=seed,
                steps=settings["steps"],
                overrides=overrides,
                device=str(pair.device),
            )
            for k, d in data.items():
                scores = qa_scores(d, "translated", pair, translator)[0]
                row.update({f"{k}_{m}": scores[m] for m in ("acc", "binding_acc", "f1")})
                row.update({f"{k}_direct_{m}": direct[k][m] for m in ("acc", "f1")})
                row[f"{k}_retention"] = scores["f1"] / max(direct[k]["f1"], 1e-9)
                for mode in PROBE_MODES if args.probe and k in PROBE_SETS else ():
                    probe = qa_scores(d, mode, pair, translator)[0]
                    row[probe_metric(k, mode)] = probe["f1"] / max(direct[k]["f1"], 1e-9)
            row["minutes"] = round((time.time() - t0) / 60, 2)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    summarise(args.out, args.baselines)


if __name__ == "__main__":
    main()
