"""Retention study: how much of the target's F1 translated caches keep on held-out phrasings and long contexts,
per translator variant and seed, with confidence intervals over seeds.

Each run trains one translator variant for one seed on the pair (training names and templates only), then scores
direct reading and the translated cache on three fixed sets: held-out names with held-out fact/question templates
(`heldout_phrasing`), held-out names with the training templates (`training_phrasing`) and long passages of 22
facts (`long`). F1 retention = translated F1 / direct F1 on the same set. One JSON line per run is appended to
OUT (default experiments/results/kvtranslate/retention_study.jsonl); `--summary` rewrites the per-variant means
with 95% t-intervals over seeds and paired differences to the first variant (`..._summary.json`).

    python experiments/kvtranslate_retention.py --variants mot mot:phrase_mix=0.5 --seeds 0 1 2
    python experiments/kvtranslate_retention.py --summary

A variant is a translator kind with optional training overrides: `mot`, `single`, `shared-latent`,
`mot:phrase_mix=0.5,w_ccl=0`.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvtranslate.corpus import make_dataset  # noqa: E402
from kvtranslate.demo import long_items  # noqa: E402
from kvtranslate.evaluate import qa_scores  # noqa: E402
from kvtranslate.models import load_model, pick_device, set_threads  # noqa: E402
from kvtranslate.train import TRAIN_DEFAULTS, encode_pair_items, train_translator  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kvtranslate")
DEFAULT_OUT = os.path.join(RESULTS, "retention_study.jsonl")
SETS = ("heldout_phrasing", "training_phrasing", "long")


def parse_variant(text):
    """'mot:phrase_mix=0.5,w_ccl=0' -> {"kind": "mot", "phrase_mix": 0.5, "w_ccl": 0.0}."""
    kind, _, rest = text.partition(":")
    overrides = dict(kind=kind)
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        if key not in TRAIN_DEFAULTS:
            raise ValueError(f"variant {text!r}: {key!r} is not a training setting (allowed: {sorted(TRAIN_DEFAULTS)})")
        default = TRAIN_DEFAULTS[key]
        overrides[key] = type(default)(value) if not isinstance(default, tuple) else default
    return overrides


def eval_sets(source_tok, target_tok, target, n, n_long, seed=99):
    limit = min(
        target.config.max_position_embeddings
        if hasattr(target.config, "max_position_embeddings")
        else target.config.n_positions,
        256,
    )
    items = dict(
        heldout_phrasing=make_dataset(n, seed=seed, split="eval", template_split="eval"),
        training_phrasing=make_dataset(n, seed=seed, split="eval", template_split="train"),
        long=long_items(n_long, seed + 1, [source_tok, target_tok], limit, 22),
    )
    return {k: encode_pair_items(source_tok, target_tok, v) for k, v in items.items()}


def t_interval(values):
    """Mean and half-width of the 95% t-interval (None for a single value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(len(values), 2.0)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def summarise(path):
    runs = [json.loads(line) for line in open(path)]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    metrics = [f"{s}_{m}" for s in SETS for m in ("f1", "retention", "acc", "binding_acc")]
    summary = dict(source=runs[0]["source"], target=runs[0]["target"], variants={})
    base = {r["seed"]: r for r in runs if r["variant"] == variants[0]}
    for v in variants:
        rows = [r for r in runs if r["variant"] == v]
        entry = dict(seeds=sorted(r["seed"] for r in rows))
        for m in metrics:
            values = [r[m] for r in rows if r.get(m) is not None]
            if values:
                entry[m] = dict(zip(("mean", "ci95"), t_interval(values)))
            paired = [r[m] - base[r["seed"]][m] for r in rows if r["seed"] in base and r.get(m) is not None]
            if v != variants[0] and paired:
                entry[f"{m}_minus_{variants[0]}"] = dict(zip(("mean", "ci95"), t_interval(paired)))
        summary["variants"][v] = entry
    out = path.replace(".jsonl", "_summary.json")
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="tiny-gpt2")
    parser.add_argument("--target", default="tiny-qwen2")
    parser.add_argument("--variants", nargs="+", default=["mot", "single", "shared-latent"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=TRAIN_DEFAULTS["steps"])
    parser.add_argument("--n", type=int, default=300, help="passages per short set")
    parser.add_argument("--n-long", type=int, default=100, help="long passages")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--summary", action="store_true", help="only rewrite the summary of OUT")
    args = parser.parse_args(argv)
    if args.summary:
        return summarise(args.out)
    variants = {v: parse_variant(v) for v in args.variants}
    set_threads(args.threads)
    device = pick_device(args.device)
    source, source_tok = load_model(args.source, device=device)
    target, target_tok = load_model(args.target, device=device)
    models = (source, source_tok, target, target_tok)
    data = eval_sets(source_tok, target_tok, target, args.n, args.n_long)
    direct = {k: qa_scores(d, "direct", *models)[0] for k, d in data.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for seed in args.seeds:
        for name, overrides in variants.items():
            t0 = time.time()
            translator = train_translator(*models, log=lambda line: None, steps=args.steps, seed=seed, **overrides)[0]
            row = dict(
                source=args.source,
                target=args.target,
                variant=name,
                seed=seed,
                steps=args.steps,
                overrides=overrides,
                device=str(device),
            )
            for k, d in data.items():
                scores = qa_scores(d, "translated", *models, translator)[0]
                row.update({f"{k}_{m}": scores[m] for m in ("acc", "binding_acc", "f1")})
                row.update({f"{k}_direct_{m}": direct[k][m] for m in ("acc", "f1")})
                row[f"{k}_retention"] = scores["f1"] / max(direct[k]["f1"], 1e-9)
            row["minutes"] = round((time.time() - t0) / 60, 2)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    summarise(args.out)


if __name__ == "__main__":
    main()
