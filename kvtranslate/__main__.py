"""Command line: python -m kvtranslate pretrain|train|eval|demo --help

Every subcommand prints JSON on stdout (one object, or one line per event) and a short table on stderr."""

import argparse
import json
import os
import sys
from typing import Any

from .cli import HelpFormatter, comma_list, print_table
from .files import output_folder, write_json

PROG = "python -m kvtranslate"
FORMATTER = HelpFormatter


# training settings with a plain flag (--kind and --gating have choices), default from train.TRAIN_DEFAULTS
TRAIN_FLAGS = {
    "steps": "training steps",
    "batch": "passages per step",
    "lr": "AdamW learning rate (warm-up, linear decay)",
    "k_layers": "source layers read per target layer",
    "hidden": "hidden width of each expert / projector",
    "window": "target tokens whose embedding lookup the translator reads: each token and window-1 before it",
    "src_window": "target tokens whose source part (aligned K/V or latent) is read: each token and src_window-1 before",
    "embed_dim": "target embeddings wider than this are first projected to it (one shared map)",
    "n_experts": "experts per target layer (mot, mot-latent)",
    "top_k": "experts kept per token with --gating topk",
    "w_rec": "KV reconstruction weight",
    "w_key": "weight of the key channels' squared errors within the KV reconstruction (values: 1)",
    "w_ccl": "context correction loss weight (0 = off)",
    "w_hidden": "CCL hidden-state term weight",
    "w_kl": "CCL next-token KL term weight",
    "ccl_start": "fraction of the steps trained on reconstruction only before the CCL joins",
    "w_balance": "router load-balancing weight",
    "n_train": "training passages",
    "phrase_mix": "share of training facts phrased with random words of the training templates (variety)",
    "long_mix": "share of steps that read long training passages (7 to --long-facts facts, training phrasings)",
    "long_batch": "passages per long step (about the tokens of a short batch)",
    "long_facts": "most facts in a long training passage",
    "seed": "seed of the training passages, init and sampling",
}


def add_flags(p: argparse.ArgumentParser, helps: dict[str, str], defaults: dict[str, Any]) -> None:
    """One --key-name flag per entry of `helps`, typed and defaulted from `defaults`."""
    for key, what in helps.items():
        p.add_argument("--" + key.replace("_", "-"), type=type(defaults[key]), default=defaults[key], help=what)


def add_train_args(p: argparse.ArgumentParser) -> None:
    from .routing import BALANCES
    from .train import TRAIN_DEFAULTS as D
    from .translators import GATINGS, KINDS, TARGET_INPUTS

    p.add_argument("--kind", choices=KINDS, default=D["kind"], help="translator type")
    p.add_argument("--gating", choices=GATINGS, default=D["gating"], help="router of the mot experts")
    p.add_argument(
        "--target-input",
        choices=TARGET_INPUTS,
        default=D["target_input"],
        help="what the translator reads from the target: its embedding lookups, or only its positions (then the "
        "tokens must come from the source cache)",
    )
    p.add_argument(
        "--balance",
        choices=BALANCES,
        default=D["balance"],
        help="router balance term: switch (Switch Transformer) or sharp (+ gate entropy; kvtranslate/routing.py)",
    )
    add_flags(p, TRAIN_FLAGS, D)


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings the command line gives (every TRAIN_DEFAULTS key that has a flag)."""
    from .train import TRAIN_DEFAULTS

    return {key: getattr(args, key) for key in TRAIN_DEFAULTS if hasattr(args, key)}


def add_device_args(p: argparse.ArgumentParser) -> None:
    from .models import DTYPES

    p.add_argument("--device", default="auto", help="cpu, cuda[:N] or auto (CUDA when present)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="dtype the models load in (from_pretrained's dtype); auto: the one their config.json records "
        "(float32 for the tiny checkpoints). Translators compute in float32",
    )
    add_threads_arg(p)


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own choice)")


def add_pair_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="tiny model name, local folder or hub id (e.g. gpt2)")
    p.add_argument("--target", required=True, help="tiny model name, local folder or hub id (e.g. Qwen/Qwen2.5-0.5B)")


def is_committed_checkpoints(folder: str) -> bool:
    from .models import CHECKPOINT_DIR

    return os.path.realpath(folder) == os.path.realpath(CHECKPOINT_DIR)


def pretrain_log_path(args: argparse.Namespace) -> str:
    """--log, else OUT/pretrain_log.jsonl; the committed checkpoints' log lives with the results, not beside them."""
    from .models import RESULTS_DIR

    if args.log:
        return args.log
    return os.path.join(RESULTS_DIR if is_committed_checkpoints(args.out) else args.out, "pretrain_log.jsonl")


# pretraining settings with a plain flag (--steps and --init have their own), default from pretrain.DEFAULTS
PRETRAIN_FLAGS = {
    "batch": "sequences per step",
    "lr": "AdamW peak learning rate",
    "questions": "question/answer turns after each passage, each about a different fact",
    "recall_prob": "share of passages whose facts all have the asked attribute (binding drills)",
    "answer_weight": "extra loss weight of answer tokens (0: every token counts once)",
    "context_weight": "loss weight of the passage and question tokens (1: plain LM loss, 0: answers only)",
    "curriculum": "share of the steps over which facts per passage grow from 1 to 6 (0: all from the start)",
    "seed": "seed of the init and the training passages",
}


def pretrain_settings(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The pretraining settings the command line gives model `name` (--steps may differ per model)."""
    steps = args.steps[name] if isinstance(args.steps, dict) else args.steps
    return dict(steps=steps, init=args.init, **{key: getattr(args, key) for key in PRETRAIN_FLAGS})


def parse_steps(text: str, models: list[str]) -> int | dict[str, int]:
    """--steps 3000 (all models) or --steps tiny-gpt2=3000,tiny-qwen2=5000."""
    values = comma_list(text)
    if len(values) == 1 and "=" not in values[0]:
        return int(values[0])
    steps = {}
    for v in values:
        if "=" not in v:
            raise ValueError(f"--steps takes one number or NAME=STEPS pairs separated by commas, got {v!r}")
        name, n = v.split("=", 1)
        if name not in models:
            raise ValueError(f"--steps names a model not in --models: {name!r} (allowed: {models})")
        steps[name] = int(n)
    missing = [m for m in models if m not in steps]
    if missing:
        raise ValueError(f"--steps has no entry for {missing}")
    return steps


def cmd_pretrain(args: argparse.Namespace) -> None:
    from .models import TINY_SPECS
    from .pretrain import pretrain
    from .tokenization import load_tokenizer

    os.makedirs(args.out, exist_ok=True)
    log_path = pretrain_log_path(args)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    finals = []
    with open(log_path, "a") as log_file:

        def log(line: str) -> None:
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        log(json.dumps(dict(event="command", argv=sys.argv)))
        for name in args.models:
            # models that share a tokenizer reuse the one saved with its owner
            owner = os.path.join(args.out, TINY_SPECS[name]["tokenizer"])
            shared = load_tokenizer(owner) if owner != os.path.join(args.out, name) and os.path.isdir(owner) else None
            final = pretrain(name, out_dir=args.out, log=log, tokenizer=shared, **pretrain_settings(args, name))[2]
            finals.append([name, final["step"], final["closed_acc"], final["binding_acc"], final["open_em"]])
    print_table(["model", "steps", "closed-set acc", "binding acc", "open EM"], finals)


def cmd_train(args: argparse.Namespace) -> None:
    from .models import load_pair
    from .pipeline import save_translator
    from .train import train_translator

    pair = load_pair(args.source, args.target, args.device, args.dtype)
    translator, history, cfg = train_translator(pair, **train_overrides(args))
    cfg.update(source=args.source, target=args.target)
    save_translator(translator, cfg, args.out)
    write_json(os.path.join(args.out, "history.json"), history)  # files.py: never through a link, nothing overwritten
    print(json.dumps(dict(saved=args.out, first=history[0], last=history[-1])))
    terms = [k for k in history[-1] if k not in ("step", "seconds")]
    print_table(["step", "seconds"] + terms, [[h["step"], h["seconds"]] + [h.get(k) for k in terms] for h in history])


def cmd_eval(args: argparse.Namespace) -> None:
    from .corpus import make_dataset
    from .evaluate import TRANSLATOR_MODES, qa_scores, routing_diagnostics
    from .models import load_pair
    from .pipeline import encode_pair_items, load_translator

    pair = load_pair(args.source, args.target, args.device, args.dtype)
    translator = load_translator(pair, args.translator)[0] if args.translator else None
    if translator is not None:
        translator.uniform_gates = args.uniform_gates
    data = encode_pair_items(pair, make_dataset(args.n, seed=args.seed, split="eval"))
    results: dict[str, Any] = {}
    for mode in args.modes:
        tr = translator if mode in TRANSLATOR_MODES else None
        results[mode] = qa_scores(data, mode, pair, tr, args.frac)[0]
    routing = routing_diagnostics(data, pair, translator) if translator is not None else None
    if routing is not None:  # mixture kinds: gate entropy, top gate, expert usage (kvtranslate/routing.py)
        results["routing"] = routing
    write_json(os.path.join(output_folder(args.out), "eval.json"), results)
    print(json.dumps(results))
    metrics = ("acc", "binding_acc", "f1", "em")
    rows = [[mode] + [r[m] for m in metrics] for mode, r in results.items() if mode != "routing"]
    print_table(["mode", *metrics], rows)


DEMO_SIZES = {
    "steps": "translator steps on the main pair",
    "coverage_steps": "translator steps on the other pairs",
    "n_eval": "held-out evaluation passages per pair",
    "n_long": "long passages per pair",
    "n_inject": "passages of the injection study",
}
DEMO_TABLE = (
    "direct_acc",
    "no_context_acc",
    "mot_acc",
    "single_acc",
    "shared_latent_acc",
    "mot_f1",
    "direct_f1",
    "retention",
    "heldout_phrasing_retention",
    "translate_ms",
    "prefill_ms",
)


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    sizes = {k: getattr(args, k) for k in DEMO_SIZES if getattr(args, k) is not None}
    summary = run_demo(
        args.out,
        quick=args.quick,
        seed=args.seed,
        save_translators=args.save_translators,
        device=args.device,
        sizes=sizes,
        pairs=args.pairs,
        jobs=args.jobs,
        threads=args.threads,
        dtype=args.dtype,
    )
    print_table(["pair", *DEMO_TABLE], [[name] + [r.get(k) for k in DEMO_TABLE] for name, r in summary.items()])


def build_parser() -> argparse.ArgumentParser:
    from .demo import JOBS
    from .evaluate import MODES
    from .models import CHECKPOINT_DIR, INITS, TINY_SPECS
    from .pretrain import DEFAULTS as P

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Translate a source LLM's context KV cache into a target LLM's.",
        formatter_class=FORMATTER,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "pretrain", help="build and pretrain the tiny models on the synthetic corpus", formatter_class=FORMATTER
    )
    p.add_argument(
        "--models",
        type=comma_list,
        default=",".join(TINY_SPECS),
        help=f"comma-separated tiny models to pretrain, of {','.join(sorted(TINY_SPECS))}",
    )
    p.add_argument(
        "--steps", default=str(P["steps"]), help="steps for all models, or NAME=STEPS pairs separated by commas"
    )
    p.add_argument(
        "--init",
        choices=INITS,
        default=P["init"],
        help="hf: HF's N(0, 0.02) init, tied embeddings; torch: PyTorch's default scales, untied",
    )
    add_flags(p, PRETRAIN_FLAGS, P)
    p.add_argument(
        "--out",
        required=True,
        help=f"checkpoint folder; the committed one ({CHECKPOINT_DIR}) only with --overwrite-committed",
    )
    p.add_argument(
        "--overwrite-committed",
        action="store_true",
        help="allow --out to be the committed checkpoint folder (replaces the models the demo and tests use)",
    )
    p.add_argument(
        "--log",
        help="JSON-lines log (default OUT/pretrain_log.jsonl; for the committed folder, experiments/results/"
        "kvtranslate/)",
    )
    add_threads_arg(p)
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("train", help="train a translator for one source -> target pair", formatter_class=FORMATTER)
    add_pair_args(p)
    p.add_argument(
        "--out", required=True, help="folder for the translator (config.json, model.safetensors) and history.json"
    )
    add_train_args(p)
    add_device_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "eval", help="closed-set accuracy and extractive F1 on held-out passages", formatter_class=FORMATTER
    )
    add_pair_args(p)
    p.add_argument("--translator", help="folder written by `train` (needed for mode 'translated')")
    p.add_argument(
        "--modes",
        type=comma_list,
        default="direct,no-context,translated",
        help=f"comma-separated modes, of {','.join(MODES)}",
    )
    p.add_argument("--frac", type=float, default=1.0, help="injection point as a fraction of the context")
    p.add_argument("--n", type=int, default=300, help="evaluation passages")
    p.add_argument("--seed", type=int, default=7, help="seed of the evaluation passages")
    p.add_argument(
        "--uniform-gates",
        action="store_true",
        help="ablation: a mixture translator weights every expert 1/M (does the router's choice matter?)",
    )
    p.add_argument("--out", required=True, help="folder for eval.json")
    add_device_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "demo", help="whole offline pipeline at CPU scale; writes OUT/summary.json and plots", formatter_class=FORMATTER
    )
    p.add_argument("--out", required=True, help="folder for summary.json, details.json, CSVs, plot and log")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few minutes instead of ~24 on 2 cores: every pair and part at QUICK sizes (a smoke test; its "
        "briefly trained translators score near the no-context bound)",
    )
    p.add_argument(
        "--save-translators", action="store_true", help="also write every trained translator (OUT/translators/)"
    )
    p.add_argument(
        "--pairs",
        type=comma_list,
        metavar="SOURCE:TARGET,...",
        help="run only these of the demo's pairs (comma-separated), keeping the other pairs already in OUT "
        "(default: all pairs)",
    )
    for key, what in DEMO_SIZES.items():
        p.add_argument("--" + key.replace("_", "-"), type=int, help=f"{what} (default: the full or quick run's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the translators and the evaluation passages")
    p.add_argument(
        "--jobs",
        type=int,
        default=JOBS,
        help="pairs run side by side, one process each with --threads threads (default: torch's thread count "
        "shared among the processes; 2: the main pair in one process, the other pairs in the other; 1 on a machine "
        "shared with other work)",
    )
    add_device_args(p)
    p.set_defaults(func=cmd_demo)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every error the command line can have, raised (naming the flag) before anything loads or is written."""
    from .evaluate import MODES, TRANSLATOR_MODES
    from .models import TINY_SPECS, pick_device, set_threads

    try:
        set_threads(getattr(args, "threads", None))  # torch's own thread count unless --threads is given
        if hasattr(args, "device"):
            args.device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    if args.command == "pretrain":
        from .pretrain import DEFAULTS, check_config

        unknown = [m for m in args.models if m not in TINY_SPECS]
        if unknown or not args.models:
            parser.error(f"--models {unknown or '(empty)'}: choose from {','.join(sorted(TINY_SPECS))}")
        if is_committed_checkpoints(args.out) and not args.overwrite_committed:
            parser.error(
                f"--out {args.out} is the committed checkpoint folder: pretraining there replaces the models "
                f"the demo and the tests use; pass --overwrite-committed to do that, or choose another --out"
            )
        try:
            args.steps = parse_steps(args.steps, args.models)
            for name in args.models:
                check_config({**DEFAULTS, **pretrain_settings(args, name)})
        except ValueError as e:
            parser.error(str(e))
    if args.command == "eval":
        unknown = [m for m in args.modes if m not in MODES]
        if unknown or not args.modes:
            parser.error(f"--modes {unknown or '(empty)'}: choose from {','.join(MODES)}")
        needs = [m for m in args.modes if m in TRANSLATOR_MODES]
        if needs and not args.translator:
            parser.error(f"--modes {','.join(needs)} needs --translator DIR")
    if args.command == "demo" and args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.command == "demo" and args.pairs is not None:
        from .demo import PAIRS

        pairs = [tuple(p.split(":")) for p in args.pairs]
        unknown = [":".join(p) for p in pairs if p not in PAIRS]
        if unknown:
            parser.error(f"--pairs {unknown} not among the demo's pairs: {','.join(':'.join(p) for p in PAIRS)}")
        args.pairs = pairs


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    args.func(args)


if __name__ == "__main__":
    main()
