"""The whole offline pipeline at CPU scale, from the committed tiny checkpoints.

Pairs (PAIRS): every family is a source and a target at least once, three of the four pairs cross tokenizers:
tiny-gpt2 -> tiny-qwen2 (learned positions -> RoPE, MHA -> GQA), tiny-qwen2-b -> tiny-qwen2 (same family and
tokenizer, 3 -> 2 layers, different widths), tiny-opt -> tiny-gpt2 and tiny-qwen2 -> tiny-opt (RoPE -> learned
positions, GQA -> MHA). Per pair: bounds, the translators (mot, single, shared-latent, all trained with varied
phrasings; on the first pair also mot-latent; `mot-noccl` and `mot-training-phrasings` are available in
VARIANTS), closed-set and extractive QA on held-out names and templates, long-context generation and
translate-vs-prefill timing; the injection-point study and a multi-agent run on the first pair. Writes
OUT/summary.json, OUT/details.json and plots.
"""

import csv
import json
import multiprocessing
import os
import platform
import random
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import torch

from .corpus import QAItem, make_dataset, make_item, questions_about
from .evaluate import (
    closed_set_accuracy,
    extractive_f1,
    injection_errors,
    multi_agent,
    qa_scores,
    time_translate_vs_prefill,
)
from .models import check_dtype, load_pair
from .pipeline import encode_pair_items, long_items, position_limit, save_translator
from .train import train_translator

Log = Callable[[str], Any]
# half of the training facts phrased with random words of the training templates (held-out ones untouched): more
# retention on held-out phrasings for every kind, beyond seed-to-seed spread (experiments/results/kvtranslate/README.md)
PHRASE_MIX = 0.5
# the key channels weigh 16x in the KV reconstruction: long-context retention beyond seed-to-seed spread (the keys
# are what loses the facts; experiments/results/kvtranslate/README.md)
W_KEY = 16.0
RECIPE = dict(phrase_mix=PHRASE_MIX, w_key=W_KEY)
VARIANTS: dict[str, dict[str, Any]] = {  # name -> training overrides
    "mot": dict(kind="mot", **RECIPE),
    "single": dict(kind="single", **RECIPE),
    "shared-latent": dict(kind="shared-latent", **RECIPE),
    "mot-latent": dict(kind="mot-latent", **RECIPE),
    "mot-noccl": dict(kind="mot", **RECIPE, w_ccl=0.0),
    "mot-training-phrasings": dict(kind="mot"),  # the training templates only, as the demo's translators once were
}
COMPARED = ("mot", "single", "shared-latent")
# (source, target) -> translators trained, those that run the injection study, whether the multi-agent run
# happens, and whether the pair trains for `steps` (the main pair) or `coverage_steps` (the study parts and
# the longer training cost time; the other pairs show that every family works on both sides)
PAIRS: dict[tuple[str, str], dict[str, Any]] = {
    ("tiny-gpt2", "tiny-qwen2"): dict(
        variants=COMPARED + ("mot-latent",), injection=COMPARED, multi_agent=True, main=True
    ),
    ("tiny-qwen2-b", "tiny-qwen2"): dict(variants=COMPARED, injection=(), multi_agent=False, main=False),
    ("tiny-opt", "tiny-gpt2"): dict(variants=COMPARED, injection=(), multi_agent=False, main=False),
    ("tiny-qwen2", "tiny-opt"): dict(variants=COMPARED, injection=(), multi_agent=False, main=False),
}
INJECTION_POINTS = (0.25, 0.5, 0.75, 1.0)
# sized for <= 30 minutes on 2 otherwise idle cores with JOBS processes: the main pair (4 translators x `steps`,
# the injection study, the multi-agent run) in one, the three other pairs (9 translators x `coverage_steps`) in
# the other; measured at 18.6 and 23.9 minutes end to end on two machines (experiments/results/kvtranslate/README.md)
FULL = dict(
    steps=2000, coverage_steps=450, n_train=3000, n_eval=300, n_long=100, n_inject=160, n_docs=40, long_facts=22
)
JOBS = 2  # the command line's default --jobs
QUICK = dict(steps=15, coverage_steps=10, n_train=200, n_eval=40, n_long=16, n_inject=32, n_docs=4, long_facts=22)


def run_pair(
    source_name: str,
    target_name: str,
    cfg: dict[str, int],
    out_dir: str,
    seed: int,
    log: Log,
    parts: dict[str, Any],
    save_translators: bool = False,
    device: str | torch.device = "cpu",
    dtype: str = "auto",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Bounds, translators, QA, long context and timing of one pair; `parts` is its PAIRS entry; the models load
    in `dtype` (models.DTYPES)."""
    pair = load_pair(source_name, target_name, device, dtype)
    source_tok, target_tok = pair.source_tok, pair.target_tok
    label = pair_name(source_name, target_name)
    eval_data = encode_pair_items(pair, make_dataset(cfg["n_eval"], seed=seed + 7, split="eval"))
    limit = position_limit(pair.target)
    long_data = encode_pair_items(
        pair, long_items(cfg["n_long"], seed + 8, [source_tok, target_tok], limit, cfg["long_facts"])
    )
    inject_data = eval_data[: cfg["n_inject"]]
    steps = cfg["steps"] if parts["main"] else cfg["coverage_steps"]
    res: dict[str, Any] = dict(
        pair=label,
        cross_tokenizer=source_tok.get_vocab() != target_tok.get_vocab(),
        steps=steps,
    )
    t0 = time.time()
    direct, _ = qa_scores(eval_data, "direct", pair)
    res["direct_acc"] = direct["acc"]
    res["no_context_acc"] = closed_set_accuracy(eval_data, "no-context", pair)
    res["binding_items"] = sum(e["needs_binding"] for e in eval_data)
    res["direct_binding_acc"] = direct["binding_acc"]
    res["direct_f1"], res["direct_em"] = direct["f1"], direct["em"]
    res["no_context_f1"], _, _ = extractive_f1(eval_data, "no-context", pair)
    res["direct_long_f1"], _, _ = extractive_f1(long_data, "direct", pair)
    res["long_context_tokens"] = sum(len(e["tgt"]) for e in long_data) / len(long_data)
    log(json.dumps(dict(bounds_seconds=round(time.time() - t0, 1), **res)))
    details = dict(train={}, injection={}, variants={})
    translators = {}
    for name in parts["variants"]:
        translator, history, tcfg = train_translator(
            pair, log=log, steps=steps, n_train=cfg["n_train"], seed=seed, **VARIANTS[name]
        )
        translators[name] = translator
        if save_translators:
            folder = os.path.join(out_dir, "translators", label.replace("->", "__"), name)
            save_translator(translator, dict(tcfg, source=source_name, target=target_name), folder)
        details["train"][name] = history
        scores, preds = qa_scores(eval_data, "translated", pair, translator)
        long_f1, _, _ = extractive_f1(long_data, "translated", pair, translator)
        details["variants"][name] = dict(
            **scores,
            long_f1=long_f1,
            params=sum(p.numel() for p in translator.parameters()),
            train_seconds=history[-1]["seconds"],
            examples=preds[:5],
        )
        study = {}
        for frac in INJECTION_POINTS if name in parts["injection"] else ():
            errors = injection_errors(inject_data, pair, translator, frac)
            study[str(frac)] = dict(
                acc=closed_set_accuracy(inject_data, "translated", pair, translator, frac), **errors
            )
        if study:
            details["injection"][name] = study
        log(json.dumps(dict(pair=label, variant=name, **details["variants"][name], injection=study)))
    for name, scores in details["variants"].items():
        prefix = name.replace("-", "_")
        res.update(
            {
                f"{prefix}_acc": scores["acc"],
                f"{prefix}_f1": scores["f1"],
                f"{prefix}_binding_acc": scores["binding_acc"],
                f"{prefix}_long_f1": scores["long_f1"],
            }
        )
    # retention: long-context cache-augmented generation, translated / direct quality; on the held-out phrasings
    # of the evaluation set (held-out names, fact and question templates) for short contexts
    res["retention"] = res["mot_long_f1"] / max(res["direct_long_f1"], 1e-9)
    res["heldout_phrasing_retention"] = res["mot_f1"] / max(res["direct_f1"], 1e-9)
    res["retention_acc"] = res["mot_acc"] / max(res["direct_acc"], 1e-9)
    res["native_half_injection_acc"] = closed_set_accuracy(inject_data, "native", pair, None, 0.5)  # == direct
    # timing on a short context and on a long one, batch 1
    short_text = make_dataset(1, seed=seed + 9, split="eval")[0].passage
    long_text = long_items(1, seed + 10, [source_tok, target_tok], limit, cfg["long_facts"])[0].passage
    timing = {
        k: time_translate_vs_prefill(pair, translators["mot"], t)
        for k, t in (("short", short_text), ("long", long_text))
    }
    res["translate_ms"], res["prefill_ms"] = timing["short"]["translate_ms"], timing["short"]["prefill_ms"]
    res["timing"] = timing
    if parts["multi_agent"]:
        docs = [encode_pair_items(pair, d) for d in multi_agent_docs(cfg["n_docs"], seed + 11)]
        res["multi_agent_f1"], details["multi_agent_transcript"] = multi_agent(docs, pair, translators["mot"])
        res["multi_agent_direct_f1"] = extractive_f1([e for d in docs for e in d], "direct", pair)[0]
    return res, details


def multi_agent_docs(n_docs: int, seed: int, per_doc: int = 3) -> list[list[QAItem]]:
    """Documents with several questions each (same passage, different asked facts)."""
    rng = random.Random(seed)
    return [questions_about(rng, make_item(rng, 6, "eval"), per_doc) for _ in range(n_docs)]


def write_csv(summary: dict[str, dict[str, Any]], details_by_pair: dict[str, dict[str, Any]], out_dir: str) -> None:
    """summary.csv: one row per pair; injection.csv: one row per (pair, translator, injection point)."""
    keys = [k for k in next(iter(summary.values())) if not isinstance(next(iter(summary.values()))[k], dict)]
    with open(os.path.join(out_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for res in summary.values():
            w.writerow(res)
    with open(os.path.join(out_dir, "injection.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pair", "translator", "p", "acc", "replay_hidden_err", "answer_kl"])
        for pair, details in details_by_pair.items():
            for name, study in details["injection"].items():
                for p, r in study.items():
                    w.writerow([pair, name, p, r["acc"], r["replay_hidden_err"], r["answer_kl"]])


def plot(details_by_pair: dict[str, dict[str, Any]], out_dir: str) -> None:
    """injection_study.png: accuracy and the two errors against the injection point, per pair with the study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    details_by_pair = {pair: d for pair, d in details_by_pair.items() if d["injection"]}  # pairs with the study
    if not details_by_pair:
        return
    fig, axes = plt.subplots(len(details_by_pair), 3, figsize=(13, 3.6 * len(details_by_pair)), squeeze=False)
    for row, (pair, details) in enumerate(details_by_pair.items()):
        for col, metric in enumerate(["acc", "replay_hidden_err", "answer_kl"]):
            ax = axes[row][col]
            for name, study in details["injection"].items():
                points = [(float(p), r[metric]) for p, r in study.items() if r[metric] is not None]
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
            ax.set_xlabel("injection point p (fraction of context from translated cache)")
            ax.set_title(f"{pair}: {metric}")
            if metric != "acc":
                ax.set_yscale("log")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "injection_study.png"), dpi=110)
    plt.close(fig)


def run_pair_logged(
    source_name: str,
    target_name: str,
    cfg: dict[str, int],
    out_dir: str,
    seed: int,
    log_path: str,
    save_translators: bool,
    device: str,
    threads: int,
    dtype: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """run_pair in a worker process (demo --jobs): its log lines are appended to the run's demo_log.jsonl."""
    torch.set_num_threads(threads)
    with open(log_path, "a") as log_file:

        def log(line: str) -> None:
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        parts = PAIRS[(source_name, target_name)]
        return run_pair(source_name, target_name, cfg, out_dir, seed, log, parts, save_translators, device, dtype)


def pair_name(source: str, target: str) -> str:
    return f"{source}->{target}"


def worker_threads(threads: int | None, jobs: int) -> int:
    """Threads of each of `jobs` worker processes: --threads, else this process's thread count (torch's choice:
    one per core) shared among them, since torch's default in every worker would put jobs x cores threads on
    the cores."""
    return threads if threads is not None else max(1, torch.get_num_threads() // jobs)


def run_demo(
    out_dir: str,
    quick: bool = False,
    seed: int = 0,
    save_translators: bool = False,
    device: str | torch.device = "cpu",
    sizes: dict[str, int] | None = None,
    pairs: list[tuple[str, str]] | None = None,
    jobs: int = 1,
    threads: int | None = None,
    dtype: str = "auto",
) -> dict[str, dict[str, Any]]:
    """sizes: overrides of FULL / QUICK (steps, coverage_steps, n_eval, ...), recorded in summary.json's run.
    pairs: the (source, target) keys of PAIRS to run (default: all). With a subset, the other pairs an earlier
    run wrote to out_dir are kept, and this run is added to summary.json's `runs` (each names its pairs).
    threads: of each worker process with jobs > 1 (see `worker_threads`; with one job this process's count
    applies). dtype: the models' (models.DTYPES)."""
    selected = list(PAIRS) if pairs is None else [tuple(p) for p in pairs]
    unknown = [p for p in selected if p not in PAIRS]
    if unknown:
        raise ValueError(f"--pairs {unknown} not among the demo's pairs: {[':'.join(p) for p in PAIRS]}")
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    check_dtype(dtype)
    pair_threads = torch.get_num_threads() if jobs == 1 else worker_threads(threads, jobs)
    torch.manual_seed(seed)
    cfg = {**(QUICK if quick else FULL), **(sizes or {})}
    os.makedirs(out_dir, exist_ok=True)
    summary, details_by_pair, runs = {}, {}, []
    previous = os.path.join(out_dir, "summary.json")
    if pairs is not None and os.path.isfile(previous):
        with open(previous) as f:
            old = json.load(f)
        with open(os.path.join(out_dir, "details.json")) as f:
            old_details = json.load(f)
        again = {pair_name(*p) for p in selected}
        summary = {p: r for p, r in old["pairs"].items() if p not in again}
        details_by_pair = {p: d for p, d in old_details.items() if p not in again}
        runs = old.get("runs") or [dict(old["run"], pairs=list(old["pairs"]))]
        runs = [dict(r, pairs=[p for p in r["pairs"] if p not in again]) for r in runs]  # who wrote what now
        runs = [r for r in runs if r["pairs"]]
    log_path = os.path.join(out_dir, "demo_log.jsonl")
    if pairs is None:
        open(log_path, "w").close()  # a full run starts a fresh log
    # append mode for the parent too: the worker processes append to the same file, and a handle that writes at
    # its own offset would overwrite their lines
    log_file = open(log_path, "a")

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    selected_names = [pair_name(*p) for p in selected]
    log(json.dumps(dict(event="command", pairs=selected_names, seed=seed, config=cfg, jobs=jobs, threads=pair_threads)))
    start, done = time.time(), []

    def finished(res: dict[str, Any], details: dict[str, Any]) -> None:
        summary[res["pair"]] = res
        details_by_pair[res["pair"]] = details
        done.append(res["pair"])
        # written after every pair: a run stopped early keeps the pairs it finished (run.complete says whether
        # every pair of the demo is in the summary)
        minutes = (time.time() - start) / 60
        order = [pair_name(*p) for p in PAIRS if pair_name(*p) in summary]
        meta = dict(
            seed=seed,
            quick=quick,
            config=cfg,
            minutes=round(minutes, 2),
            threads=pair_threads,
            jobs=jobs,
            device=str(device),
            dtype=dtype,
            pairs=done,
            complete=len(order) == len(PAIRS),
            machine=f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
            torch=torch.__version__,
        )
        write_results(
            {p: summary[p] for p in order}, {p: details_by_pair[p] for p in order}, meta, runs + [meta], out_dir
        )

    common = (cfg, out_dir, seed)
    if jobs == 1:
        for source_name, target_name in selected:
            parts = PAIRS[(source_name, target_name)]
            finished(*run_pair(source_name, target_name, *common, log, parts, save_translators, device, dtype))
    else:
        # one process per pair at a time; the pairs' numbers do not depend on which process ran them (every
        # translator and passage set is seeded)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [
                pool.submit(
                    run_pair_logged,
                    source_name,
                    target_name,
                    *common,
                    log_path,
                    save_translators,
                    str(device),
                    pair_threads,
                    dtype,
                )
                for source_name, target_name in selected  # the main pair first: it is the longest
            ]
            for future in as_completed(futures):
                finished(*future.result())
    log(json.dumps(dict(event="done", minutes=round((time.time() - start) / 60, 2))))
    log_file.close()
    return summary


def write_results(
    summary: dict[str, dict[str, Any]],
    details_by_pair: dict[str, dict[str, Any]],
    meta: dict[str, Any],
    runs: list[dict[str, Any]],
    out_dir: str,
) -> None:
    """summary.json, summary.csv, details.json, injection.csv and the plot in out_dir."""
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(dict(pairs=summary, run=meta, runs=runs, **summary), f, indent=1)
    write_csv(summary, details_by_pair, out_dir)
    with open(os.path.join(out_dir, "details.json"), "w") as f:
        json.dump(details_by_pair, f, indent=1)
    plot(details_by_pair, out_dir)
