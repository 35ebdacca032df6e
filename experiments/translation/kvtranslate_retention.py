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
`shared-latent`, `mot:phrase_mix=0.5:w_ccl=3`, `shared-latent:steps=2000` (its own step count instead of `--steps`),
`mot:params=1000000` (the kind's width knobs sized so the translator has that many parameters, within 2%:
kvtranslate/sizing.py; for comparing kinds at equal capacity).

The evaluation passages come from `--eval-seed` (default 99, the set every study before the confirmation chose its
recipe on). The confirmation set is CONFIRMATION_EVAL_SEED with translator seeds CONFIRMATION_SEEDS, neither used
by any earlier run (tests/kvtranslate/test_kvt_confirmation.py checks both against the code's seeds and the
committed results). Every row records the eval seed, the git commit it ran at and whether kvtranslate's code or
checkpoints differed from that commit (`dirty`: a tracked file under them changed, see
experiments/tools/git_state.py). `--translators DIR` keeps each trained translator in
DIR/<variant>/seed<N> and loads it from there the next time the same variant and seed are asked for (another study,
e.g. kvtranslate_injection_depth.py, can reuse it; a folder trained with other settings is an error).
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

from experiments.tools.git_state import git_state  # noqa: E402
from kvtranslate.cli import HelpFormatter, comma_list, int_list, print_table  # noqa: E402
from kvtranslate.corpus import make_dataset  # noqa: E402
from kvtranslate.evaluate import PROBE_MODES, qa_scores, routing_diagnostics  # noqa: E402
from kvtranslate.models import DTYPES, ModelPair, load_pair, pick_device, set_threads, source_names  # noqa: E402
from kvtranslate.pipeline import (  # noqa: E402
    EncodedItem,
    encode_pair_items,
    load_translator,
    long_items,
    position_limit,
    save_translator,
)
from kvtranslate.sizing import WIDTH_KNOBS, size_for_pair  # noqa: E402
from kvtranslate.train import TRAIN_DEFAULTS, train_translator  # noqa: E402
from kvtranslate.translators import CONFIG_NAME, NO_SOURCE_KINDS, KVTranslator, segment_layers  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "results", "kvtranslate")
DEFAULT_OUT = os.path.join(RESULTS, "retention_study.jsonl")
SETS = ("heldout_phrasing", "training_phrasing", "long", "long_training_phrasing")
PROBE_SETS = ("heldout_phrasing", "long")
SIZE_KEY = "params"  # a variant's target parameter count (kvtranslate/sizing.py), not a training setting
# the evaluation passages' seed of every study before the confirmation (short sets; the long sets start at +1)
SCREENING_EVAL_SEED = 99
# the confirmation set: an evaluation seed and translator seeds no earlier run used, for passages (a translator of
# seed s trains on passages of seed s + 1000 and long ones of s + 2000) or for initialisation
CONFIRMATION_EVAL_SEED = 5000
CONFIRMATION_SEEDS = (300, 301, 302, 303, 304, 305)
# what decides a row's numbers besides the command: the package, the study scripts and the tiny checkpoints
CODE_PATHS = ("kvtranslate", "experiments/translation", "experiments/results/kvtranslate/checkpoints")


def probe_metric(set_name: str, mode: str) -> str:
    """The row key of a set's F1 retention under a probe mode, e.g. ``long_native_keys_retention``."""
    return f"{set_name}_{mode.replace('-', '_')}_retention"


def parse_variant(text: str) -> dict[str, Any]:
    """'mot:phrase_mix=0.5:w_ccl=0' -> {"kind": "mot", "phrase_mix": 0.5, "w_ccl": 0.0}; 'mot:params=1000000' ->
    {"kind": "mot", "params": 1000000}."""
    kind, *rest = text.split(":")
    overrides: dict[str, Any] = dict(kind=kind)
    for part in filter(None, rest):
        key, _, value = part.partition("=")
        if key == SIZE_KEY:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"variant {text!r}: {SIZE_KEY} must be a positive whole number, got {value!r}")
            overrides[key] = int(value)
            continue
        if key not in TRAIN_DEFAULTS:
            raise ValueError(
                f"variant {text!r}: {key!r} is not a training setting (allowed: {sorted(TRAIN_DEFAULTS)} and "
                f"{SIZE_KEY})"
            )
        default = TRAIN_DEFAULTS[key]
        overrides[key] = type(default)(value) if not isinstance(default, tuple) else default
    return overrides


def sized_overrides(pair: ModelPair, overrides: dict[str, Any]) -> dict[str, Any]:
    """A variant's overrides with `params` turned into the width knobs that reach it (kvtranslate/sizing.py); the
    knobs a variant sets itself stay as set. Overrides without `params` come back unchanged."""
    if SIZE_KEY not in overrides:
        return overrides
    settings = {k: v for k, v in overrides.items() if k != SIZE_KEY}
    fixed = {k for k in WIDTH_KNOBS.get(settings["kind"], ()) if k in settings}
    sized = size_for_pair(pair, {**TRAIN_DEFAULTS, **settings}, overrides[SIZE_KEY], fixed)
    return {**settings, **{k: sized[k] for k in WIDTH_KNOBS[settings["kind"]]}}


def eval_items(
    tokenizers: list[Any], limit: int, n: int, n_long: int, seed: int = SCREENING_EVAL_SEED
) -> dict[str, list[Any]]:
    """The four evaluation sets (SETS) of seed `seed` as passages (corpus.QAItem), the long ones fitting every
    tokenizer within `limit` tokens."""
    return dict(
        heldout_phrasing=make_dataset(n, seed=seed, split="eval", template_split="eval"),
        training_phrasing=make_dataset(n, seed=seed, split="eval", template_split="train"),
        long=long_items(n_long, seed + 1, tokenizers, limit, 22),
        # the same long passages phrased with the training templates: what length costs without the phrasing
        long_training_phrasing=long_items(n_long, seed + 1, tokenizers, limit, 22, template_split="train"),
    )


def eval_sets(pair: ModelPair, n: int, n_long: int, seed: int = SCREENING_EVAL_SEED) -> dict[str, list[EncodedItem]]:
    """The four evaluation sets (SETS), encoded for the pair."""
    items = eval_items([pair.source_tok, pair.target_tok], position_limit(pair.target), n, n_long, seed)
    return {k: encode_pair_items(pair, v) for k, v in items.items()}


def translator_folder(root: str, variant: str, seed: int) -> str:
    """Where `--translators root` keeps the translator of `variant` and `seed`."""
    return os.path.join(root, variant.replace(":", "__").replace("=", "-"), f"seed{seed}")


# settings added after translators were committed: those translators were trained with these values
ADDED_SETTINGS = dict(balance="switch", target_input="embeddings")


def comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """Training settings as config.json stores them (tuples as lists), for comparing a saved translator's."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}


def obtain_translator(
    pair: ModelPair, variant: str, settings: dict[str, Any], root: str | None = None
) -> tuple[KVTranslator, str]:
    """(translator, "trained" or "loaded"): trained with `settings` (train_translator's overrides, seed included),
    or loaded from `root`'s folder for the variant and seed when one exists (and saved there after training). A
    saved translator trained with other settings is an error naming the folder and the settings that differ."""
    folder = None if root is None else translator_folder(root, variant, settings["seed"])
    wanted = comparable({**TRAIN_DEFAULTS, **settings})
    if folder is not None and os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        translator, saved = load_translator(pair, folder)
        saved = comparable({**ADDED_SETTINGS, **saved})
        differ = sorted(k for k in wanted if saved.get(k) != wanted[k])
        if differ:
            raise ValueError(
                f"{folder} holds a translator trained with other settings: "
                + ", ".join(f"{k}={saved.get(k)!r} there, {wanted[k]!r} asked" for k in differ)
            )
        return translator, "loaded"
    translator, _, cfg = train_translator(pair, log=lambda line: None, **settings)
    if folder is not None:
        save_translator(translator, cfg, folder)
    return translator, "trained"


def run_record(args: argparse.Namespace, pair: ModelPair, name: str, overrides: dict, settings: dict) -> dict:
    """The fields every study row starts with: pair, variant, seed, steps, sizes, evaluation seed, commit."""
    commit, dirty = git_state(REPO, CODE_PATHS)  # both None outside a git checkout
    return dict(
        source=args.source,
        target=args.target,
        variant=name,
        seed=settings["seed"],
        steps=settings["steps"],
        overrides=overrides,
        device=str(pair.device),
        eval_seed=args.eval_seed,
        commit=commit,
        dirty=dirty,
    )


def finished_runs(path: str, args: argparse.Namespace) -> set[tuple[str, int, int]]:
    """(variant, seed, steps) of the rows OUT already holds for this pair and evaluation seed: a study restarted
    after an interruption trains only what is missing instead of appending a second row for the same run."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {
        (row["variant"], int(row["seed"]), int(row["steps"]))
        for row in rows
        if row.get("source") == args.source
        and row.get("target") == args.target
        and row.get("eval_seed", SCREENING_EVAL_SEED) == args.eval_seed
    }


def study_runs(args: argparse.Namespace, pair: ModelPair, variants: dict[str, dict]):
    """Each (variant, seed) run OUT does not hold yet, as (translator, its settings, its row): the row starts with
    the run's record and training cost; once the caller has added its scores the row gets the run's total time and
    is printed and appended to OUT."""
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    done = finished_runs(args.out, args)
    for seed in args.seeds:
        for name, overrides in variants.items():
            if (name, seed, overrides.get("steps", args.steps)) in done:
                print(f"kept {name} seed {seed}: already in {args.out}", file=sys.stderr)
                continue
            t0, cpu0 = time.time(), time.process_time()
            # a variant may set its own steps
            settings = {"steps": args.steps, **sized_overrides(pair, overrides), "seed": seed}
            translator, origin = obtain_translator(pair, name, settings, args.translators)
            row = run_record(args, pair, name, overrides, settings)
            row.update(
                translator=origin,
                train_minutes=round((time.time() - t0) / 60, 2),
                # this process's CPU time: the cost on one core whatever else the machine runs
                train_cpu_minutes=round((time.process_time() - cpu0) / 60, 2),
                parameters=sum(p.numel() for p in translator.parameters()),
                **{k: translator.config[k] for k in WIDTH_KNOBS[translator.kind]},
            )
            yield translator, settings, row
            row["minutes"] = round((time.time() - t0) / 60, 2)
            row["cpu_minutes"] = round((time.process_time() - cpu0) / 60, 2)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


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
    # rows before the eval seed was recorded were scored on the screening set
    eval_seeds = {
        v: sorted({r.get("eval_seed", SCREENING_EVAL_SEED) for r in runs if r["variant"] == v}) for v in variants
    }
    mixed = {v: s for v, s in eval_seeds.items() if len(s) > 1}
    if mixed:
        raise ValueError(
            f"{path}: a variant's runs were scored on different evaluation sets (eval seeds {mixed}); keep each "
            "evaluation set in its own file"
        )
    baselines = baselines or variants[:1]
    unknown = [b for b in baselines if b not in variants]
    if unknown:
        raise ValueError(f"--baselines {unknown} have no runs in {path} (variants there: {variants})")
    metrics = [f"{s}_{m}" for s in SETS for m in ("f1", "retention", "acc", "binding_acc")]
    metrics += [probe_metric(s, m) for s in PROBE_SETS for m in PROBE_MODES]
    summary: dict[str, Any] = dict(
        source=runs[0]["source"],
        target=runs[0]["target"],
        baselines=baselines,
        eval_seeds=sorted({s[0] for s in eval_seeds.values()}),
        variants={},
    )
    for v in variants:
        rows = [r for r in runs if r["variant"] == v]
        by_seed = {r["seed"]: r for r in rows}
        entry: dict[str, Any] = dict(seeds=sorted(r["seed"] for r in rows), steps=sorted({r["steps"] for r in rows}))
        if any("parameters" in r for r in rows):
            entry["parameters"] = sorted({r["parameters"] for r in rows if "parameters" in r})
            entry["widths"] = {k: sorted({r[k] for r in rows if k in r}) for k in ("hidden", "latent") if k in rows[0]}
        if any(r.get("commit") for r in rows):  # each commit the rows ran at, "+dirty" where the code differed
            entry["commits"] = sorted(
                {r["commit"][:12] + ("+dirty" if r.get("dirty") else "") for r in rows if r.get("commit")}
            )
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


def format_mean_ci(entry: dict[str, Any], key: str) -> str:
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
        [
            [v, ",".join(map(str, e["seeds"]))] + [format_mean_ci(e, k) for k in keys]
            for v, e in summary["variants"].items()
        ],
    )
    rows = [
        [v, b] + [format_mean_ci(e, f"{k}_minus_{b}") for k in keys]
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
    """The parsed variants and the loaded pair; a bad variant, device or thread count is a usage error first, and a
    parameter count out of reach for the pair right after loading it (before any training)."""
    try:
        variants = {v: parse_variant(v) for v in args.variants}
        set_threads(args.threads)
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    pair = load_pair(args.source, args.target, device, args.dtype)
    try:
        for name in variants:
            sized_overrides(pair, variants[name])
    except ValueError as e:
        parser.error(str(e))
    return variants, pair


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The flags of studies that train translators per seed and score them on an evaluation set."""
    parser.add_argument("--seeds", type=int_list, default="0,1,2", help="comma-separated translator seeds")
    parser.add_argument("--steps", type=int, default=TRAIN_DEFAULTS["steps"], help="translator training steps")
    parser.add_argument(
        "--eval-seed",
        type=int,
        default=SCREENING_EVAL_SEED,
        help=f"seed of the evaluation passages ({SCREENING_EVAL_SEED}: the set the recipe was chosen on; "
        f"{CONFIRMATION_EVAL_SEED}: the confirmation set, with --seeds {','.join(map(str, CONFIRMATION_SEEDS))})",
    )
    parser.add_argument(
        "--translators",
        help="folder that keeps each trained translator (DIR/<variant>/seed<N>) and serves it again to any study "
        "asking for the same variant and seed (default: none kept)",
    )


def main(argv: list[str] | None = None) -> None:
    parser = study_parser(
        "python -m experiments.translation.kvtranslate_retention",
        __doc__,
        "mot,single,shared-latent",
        "comma-separated variants: a kind with overrides after colons (mot:phrase_mix=0.5:w_ccl=3)",
    )
    add_run_args(parser)
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
    parser.add_argument(
        "--uniform-gates",
        action="store_true",
        help="also score every mixture with each expert weighted 1/M (SET_uniform_gates_retention: does the "
        "router's choice matter)",
    )
    parser.add_argument(
        "--drop-each-source",
        action="store_true",
        help="with several sources (--source a+b), also score every translator that reads them with each source's "
        "layers zeroed (SET_without_NAME_retention: does it use that source?)",
    )
    parser.add_argument("--summary", action="store_true", help="only rewrite the summary of OUT")
    args = parser.parse_args(argv)
    if args.summary:
        summarise(args.out, args.baselines)
        return
    variants, pair = study_setup(parser, args)
    if args.drop_each_source and not pair.more_sources:
        parser.error(f"--drop-each-source needs several sources (--source a+b), got --source {args.source}")
    data = eval_sets(pair, args.n, args.n_long, args.eval_seed)
    direct = {k: qa_scores(d, "direct", pair)[0] for k, d in data.items()}
    for translator, _, row in study_runs(args, pair, variants):
        for k, d in data.items():
            scores = qa_scores(d, "translated", pair, translator)[0]
            row.update({f"{k}_{m}": scores[m] for m in ("acc", "binding_acc", "f1")})
            row.update({f"{k}_direct_{m}": direct[k][m] for m in ("acc", "f1")})
            row[f"{k}_retention"] = scores["f1"] / max(direct[k]["f1"], 1e-9)
            for mode in PROBE_MODES if args.probe and k in PROBE_SETS else ():
                probe = qa_scores(d, mode, pair, translator)[0]
                row[probe_metric(k, mode)] = probe["f1"] / max(direct[k]["f1"], 1e-9)
            routing = routing_diagnostics(d, pair, translator)
            if routing is not None:  # a mixture: gate entropy, top gate, expert usage (kvtranslate/routing.py)
                row[f"{k}_routing"] = routing
                if args.uniform_gates:  # the ablation: every expert weighted 1/M
                    translator.uniform_gates = True
                    uniform = qa_scores(d, "translated", pair, translator)[0]
                    translator.uniform_gates = False
                    row[f"{k}_uniform_gates_retention"] = uniform["f1"] / max(direct[k]["f1"], 1e-9)
            if args.drop_each_source and translator.kind not in NO_SOURCE_KINDS:
                segments = translator.config["source_geom"]["segments"]
                for i, name in enumerate(source_names(args.source)):
                    translator.zeroed_layers = segment_layers(segments, i)
                    dropped = qa_scores(d, "translated", pair, translator)[0]
                    translator.zeroed_layers = ()
                    row[f"{k}_without_{name}_retention"] = dropped["f1"] / max(direct[k]["f1"], 1e-9)
    summarise(args.out, args.baselines)


if __name__ == "__main__":
    main()
