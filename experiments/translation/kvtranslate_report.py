"""Regenerates kvtranslate's number tables and headlines in the READMEs from the committed result files (no number
is typed).

Each block sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` and is replaced whole: the tables
and verdicts in experiments/results/kvtranslate/README.md (the results and study log) and
experiments/results/kvtranslate/checkpoints/README.md, a one-sentence summary in kvtranslate/README.md (the package
reference) and the kvtranslate headline of README.md. Sources, all in experiments/results/kvtranslate/:
demo/summary.json and demo/details.json (the demo); bench_translate_real.json and bench_translate_tiny.json
(experiments/translation/bench_translate.py), heldout_*.json (experiments/translation/translate_heldout.py), the
retention studies' summaries (STUDIES, experiments/translation/kvtranslate_retention.py) and longcontext_probe.jsonl
(experiments/translation/kvtranslate_longcontext.py) where they exist; the checkpoints' own kvtranslate.json
(checkpoints/); history/translator_trials.jsonl. The confirmation, equal-capacity and injection-depth blocks
(confirmation_summary.json, equal_capacity_summary.json: kvtranslate_retention.py; injection_depth_summary.json:
kvtranslate_injection_depth.py) are written only once their files exist.

    python -m experiments.translation.kvtranslate_report          # rewrites the READMEs' generated tables
    python -m experiments.translation.kvtranslate_report --check  # exit 1 if a README is not up to date
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from experiments.translation.kvtranslate_controls import read_rows, short_table, sources_table, study_block  # noqa: E402
from fl_app.io.markdown import replace_blocks  # noqa: E402
from kvtranslate.cli import HelpFormatter, comma_list  # noqa: E402

README = os.path.join(REPO, "kvtranslate", "README.md")  # the package reference: only its summary sentence
TOP_README = os.path.join(REPO, "README.md")  # only its kvtranslate-headline block
EXPERIMENTS = os.path.join(REPO, "experiments", "results", "kvtranslate")
CHECKPOINTS = os.path.join(EXPERIMENTS, "checkpoints")  # the committed tiny models
CHECKPOINTS_README = os.path.join(CHECKPOINTS, "README.md")
DEMO = os.path.join(EXPERIMENTS, "demo")
STUDIES_README = os.path.join(EXPERIMENTS, "README.md")  # the results and study log: every table
READMES = (README, CHECKPOINTS_README, TOP_README, STUDIES_README)
# the one-sentence headline's block in each README that has one, and its link to the study log from there
HEADLINES = {
    "kvtranslate-headline": TOP_README,
    "kvtranslate-summary": README,
}
# retention studies (experiments/translation/kvtranslate_retention.py --out EXPERIMENTS/<stem>.jsonl): README block
# suffix -> file stem and the blocks the study log shows of it (retention-KIND + suffix, KIND of STUDY_BLOCKS); the
# last study that exists gives the headlines
STUDIES = {
    "": ("retention_study", ("study", "verdict")),
    "-screen": ("retention_screen_300_steps", ("study", "probe")),
    "-1000-steps": ("retention_study_1000_steps", ("study", "verdict", "probe", "recipe")),
}
# control studies (kvtranslate_retention.py --out EXPERIMENTS/<stem>.jsonl with target_input=positions): block ->
# file stem, tables from every run's row (kvtranslate_controls.py)
CONTROL_STUDIES = {
    "positions-steps": "positions_steps",
    "positions-study": "positions_study",
    "positions-deep": "positions_deep",
    "positions-deep6": "positions_deep6",  # tiny-qwen2-deep (6 layers) -> tiny-qwen2 (2)
    "positions-two-source": "positions_two_source",  # tiny-qwen2-b + tiny-qwen2-deep -> tiny-qwen2
}
# the several-source study against each of its sources alone (same variants, seeds and evaluation set): block ->
# (its file stem, {source: that source's one-source study stem})
SOURCE_COMPARISONS = {
    "positions-two-source-vs-one": (
        "positions_two_source",
        {"tiny-qwen2-b": "positions_deep", "tiny-qwen2-deep": "positions_deep6"},
    ),
}
DEPTH_POSITIONS = "injection_depth_positions"
POSITIONS_RECIPE = ":phrase_mix=0.5:w_key=16.0:target_input=positions:params=1000000:steps=1200"
LONGCONTEXT_SETS = {
    "long_heldout_phrasing": "long, held-out phrasings",
    "long_training_phrasing": "long, training phrasings",
    "heldout_phrasing": "short, held-out phrasings",
}


def load(path):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pair_of(details, pair, name, key):
    return details[pair]["variants"].get(name, {}).get(key)


def demo_table(summary, details):
    pairs = summary["pairs"]
    names = list(pairs)
    run = summary["run"]

    def row(label, fn, digits=3):
        return [label] + [
            fmt(fn(pairs[p], p), digits) if not isinstance(fn(pairs[p], p), str) else fn(pairs[p], p) for p in names
        ]

    def both(a, b, digits=3):
        return lambda r, p: f"{fmt(r.get(a), digits)} / {fmt(r.get(b), digits)}"

    rows = [
        ["tokenizers"] + ["different" if pairs[p]["cross_tokenizer"] else "same" for p in names],
        row("translator steps", lambda r, p: r["steps"]),
        row("`direct_acc` / `direct_f1` (upper bound)", both("direct_acc", "direct_f1")),
        row("`no_context_acc` / F1 (lower bound)", both("no_context_acc", "no_context_f1")),
        row("**`mot_acc` / `mot_f1`**", both("mot_acc", "mot_f1")),
        row("`single_acc` / F1", both("single_acc", "single_f1")),
        row("`shared_latent_acc` / F1", both("shared_latent_acc", "shared_latent_f1")),
        row(
            "binding accuracy: direct / mot / single / shared-latent",
            lambda r, p: " / ".join(
                fmt(r.get(k))
                for k in ("direct_binding_acc", "mot_binding_acc", "single_binding_acc", "shared_latent_binding_acc")
            ),
        ),
        row("binding items (of `n_eval`)", lambda r, p: r["binding_items"]),
        row(
            "**`heldout_phrasing_retention`** (mot F1 / direct F1, held-out names and phrasings)",
            lambda r, p: r["heldout_phrasing_retention"],
        ),
        row("long context F1: direct / mot", both("direct_long_f1", "mot_long_f1")),
        row("**`retention`** (long-context F1, mot / direct)", lambda r, p: r["retention"]),
        row("accuracy retention (mot / direct)", lambda r, p: r["retention_acc"]),
        row(
            "`translate_ms` / `prefill_ms`, short context",
            lambda r, p: "{} / {} ({} tokens)".format(
                fmt(r["translate_ms"], 2), fmt(r["prefill_ms"], 2), r["timing"]["short"]["tokens"]
            ),
        ),
        row(
            "same, long context",
            lambda r, p: "{} / {} ({} tokens)".format(
                fmt(r["timing"]["long"]["translate_ms"], 2),
                fmt(r["timing"]["long"]["prefill_ms"], 2),
                r["timing"]["long"]["tokens"],
            ),
        ),
        row(
            "translator parameters: mot / single / shared-latent",
            lambda r, p: " / ".join(fmt(pair_of(details, p, v, "params")) for v in ("mot", "single", "shared-latent")),
        ),
    ]
    text = table([""] + [f"`{p}`" for p in names], rows)
    lines = []
    for r in summary.get("runs") or [dict(run, pairs=names)]:
        sizes = ", ".join(f"{k} {v}" for k, v in r["config"].items())
        lines.append(
            f"{', '.join(f'`{p}`' for p in r['pairs'])}: seed {r['seed']}, {sizes}; {r['minutes']} "
            f"minutes on {r['machine']}, {r['threads']} thread, device {r.get('device', 'cpu')}"
            + ("" if r.get("dtype", "auto") == "auto" else f", dtype {r['dtype']}")
        )
    done = "every pair of the demo is in" if run.get("complete") else "INCOMPLETE: not every pair of the demo is in"
    return text + "\n\nRuns: " + "; ".join(lines) + f" ({done}).\n"


def variants_table(summary, details):
    """Every translator of each pair: accuracy, F1, binding, held-out phrasing and long-context retention."""
    rows = []
    for pair, res in summary["pairs"].items():
        for name, v in details[pair]["variants"].items():
            rows.append(
                [
                    f"`{pair}`",
                    f"`{name}`",
                    fmt(v["acc"]),
                    fmt(v["f1"]),
                    fmt(v["binding_acc"]),
                    fmt(v["f1"] / max(res["direct_f1"], 1e-9)),
                    fmt(v["long_f1"] / max(res["direct_long_f1"], 1e-9)),
                    fmt(v["params"]),
                ]
            )
    return table(
        [
            "pair",
            "translator",
            "acc",
            "F1",
            "binding acc",
            "held-out phrasing F1 retention",
            "long-context F1 retention",
            "parameters",
        ],
        rows,
    )


def injection_table(summary, details):
    rows = []
    for pair in summary["pairs"]:
        for name, study in details[pair]["injection"].items():
            for metric in ("acc", "replay_hidden_err", "answer_kl"):
                rows.append([f"`{pair}`", f"`{name}`", metric] + [fmt(study[p][metric]) for p in sorted(study)])
    points = sorted(next((s for d in details.values() for s in d["injection"].values()), {}))
    text = table(["pair", "translator", "measure"] + [f"p={p}" for p in points], rows)
    extra = [
        f"`{p}`: native cache with replay at p=0.5, accuracy {fmt(r['native_half_injection_acc'])} (direct "
        f"{fmt(r['direct_acc'])})"
        for p, r in summary["pairs"].items()
        if p in details and details[p]["injection"]
    ]
    extra += [
        f"`{p}`: multi-agent F1, B answering from A's translated cache {fmt(r['multi_agent_f1'])} vs B reading "
        f"the documents itself {fmt(r['multi_agent_direct_f1'])}"
        for p, r in summary["pairs"].items()
        if "multi_agent_f1" in r
    ]
    return text + "\n\n" + "; ".join(extra) + "."


def bench_table(real, tiny):
    parts = []
    for label, b in (("GPT-2 (124M) -> Qwen2.5-0.5B architectures", real), ("tiny architectures", tiny)):
        if b is None:
            continue
        rows = [
            [n, fmt(t, 1), fmt(p, 1), fmt(r, 3), fmt(f / 1e6, 1), fmt(g / 1e6, 1)]
            for n, t, p, r, f, g in zip(
                b["tokens"],
                b["translate_ms"],
                b["prefill_ms"],
                b["ratio"],
                b["translator_flops_per_token"],
                b["target_flops_per_token"],
            )
        ]
        parts.append(
            f"{label} ({b['device']}, {b['threads']} thread, median of {b['repeats']} interleaved "
            f"repeats; translator {fmt(b['translator_params'])} parameters, target "
            f"{fmt(b['target_params'])} of which {fmt(b['target_params_without_embeddings'])} outside the "
            f"input embedding):\n\n"
            + table(
                [
                    "tokens",
                    "translate ms",
                    "prefill ms",
                    "translate / prefill",
                    "translator MFLOPs / token",
                    "target MFLOPs / token",
                ],
                rows,
            )
        )
    return "\n\n".join(parts)


def format_mean_ci(entry, key):
    """'mean ± half-width' of a summary entry's metric ('–' when absent)."""
    m = entry.get(key)
    return "–" if m is None else fmt(m["mean"]) + ("" if m["ci95"] is None else f" ± {fmt(m['ci95'])}")


def paired_seeds(entry, baseline):
    """The seeds a variant's held-out phrasing difference to `baseline` pairs (summaries before they were recorded:
    the variant's seeds)."""
    return entry[f"heldout_phrasing_retention_minus_{baseline}"].get("seeds", entry["seeds"])


def retention_study_table(study):
    """experiments/translation/kvtranslate_retention.py's summary: each variant over seeds, then the paired differences
    to each baseline variant."""
    if study is None:
        return "Not run yet (`python -m experiments.translation.kvtranslate_retention`)."
    variants = study["variants"]
    baselines = study.get("baselines") or [next(iter(variants))]
    rows = [
        [f"`{name}`", ", ".join(map(str, v["seeds"])), ", ".join(map(str, v.get("steps", [])))]
        + [
            format_mean_ci(v, key)
            for key in (
                "heldout_phrasing_retention",
                "training_phrasing_retention",
                "long_retention",
                "long_training_phrasing_retention",
                "heldout_phrasing_acc",
                "heldout_phrasing_binding_acc",
            )
        ]
        for name, v in variants.items()
    ]
    differences = [
        [f"`{name}`", f"`{b}`", ", ".join(map(str, paired_seeds(v, b)))]
        + [format_mean_ci(v, f"{key}_minus_{b}") for key in ("heldout_phrasing_retention", "long_retention")]
        for i, b in enumerate(baselines)
        for name, v in variants.items()
        if f"heldout_phrasing_retention_minus_{b}" in v and name not in baselines[:i]
    ]
    return (
        f"`{study['source']}` -> `{study['target']}`, mean ± 95% t-interval over seeds:\n\n"
        + table(
            [
                "translator",
                "seeds",
                "steps",
                "held-out phrasing F1 retention",
                "training phrasing F1 retention",
                "long-context F1 retention",
                "long-context, training phrasing F1 retention",
                "held-out phrasing acc",
                "held-out phrasing binding acc",
            ],
            rows,
        )
        + "\n\nPaired differences (same seed; an interval that excludes 0 is beyond seed-to-seed spread):\n\n"
        + table(
            [
                "translator",
                "minus",
                "seeds paired",
                "held-out phrasing retention difference",
                "long-context retention difference",
            ],
            differences,
        )
    )


def spread_verdict(m):
    """Whether a paired difference's 95% interval excludes zero."""
    if m is None or m["ci95"] is None:
        return "one seed: no interval"
    if abs(m["mean"]) <= m["ci95"]:
        return "within seed-to-seed spread"
    return "beyond seed-to-seed spread, " + ("higher" if m["mean"] > 0 else "lower")


def retention_verdict(study, goal=0.9):
    """Generated sentences: the best retention each set reached against the goal, and per baseline which variants
    differ from it beyond seed-to-seed spread (the paired interval excludes 0)."""
    if study is None:
        return "Not run yet."
    variants = study["variants"]
    lines = []
    for key, what in (("heldout_phrasing_retention", "held-out phrasings"), ("long_retention", "long contexts")):
        name, v = max(variants.items(), key=lambda kv: kv[1][key]["mean"])
        reached = "reached" if v[key]["mean"] >= goal else "not reached"
        lines.append(
            f"- F1 retention on {what}: best `{name}` with {format_mean_ci(v, key)} over seeds "
            f"{', '.join(map(str, v['seeds']))}; goal {goal}: **{reached}**."
        )
    baselines = study.get("baselines") or [next(iter(variants))]
    for i, b in enumerate(baselines):
        for name, v in variants.items():
            if name in baselines[:i]:  # already given the other way round
                continue
            held, long_ctx = v.get(f"heldout_phrasing_retention_minus_{b}"), v.get(f"long_retention_minus_{b}")
            if held is None:
                continue
            lines.append(
                f"- `{name}` minus `{b}`: held-out phrasings "
                f"{format_mean_ci(v, f'heldout_phrasing_retention_minus_{b}')} "
                f"({spread_verdict(held)}), long contexts {format_mean_ci(v, f'long_retention_minus_{b}')} "
                f"({spread_verdict(long_ctx)})."
            )
    return "\n".join(lines)


# the retention recipe every kind is compared under (kvtranslate/demo.py RECIPE at the study's 2,000 steps) and the
# kinds that are a mixture of translator experts (kvtranslate/translators.py MIXTURE_KINDS)
RECIPE = ":phrase_mix=0.5:w_key=16.0:steps=2000"
MIXTURES = ("mot", "mot-latent")
RECIPE_SETS = {"heldout_phrasing_retention": "held-out phrasings", "long_retention": "long contexts"}


def interval(m):
    """'lo to hi' of a metric's 95% interval ('–' without one)."""
    return "–" if m is None or m["ci95"] is None else f"{fmt(m['mean'] - m['ci95'])} to {fmt(m['mean'] + m['ci95'])}"


def recipe_kinds(study, recipe=RECIPE):
    """kind -> (variant name, summary entry) for the variants named exactly KIND + recipe."""
    return {
        n[: -len(recipe)]: (n, v)
        for n, v in study["variants"].items()
        if n.endswith(recipe) and ":" not in n[: -len(recipe)]
    }


def mixture_differences(kinds):
    """(mixture kind, its entry, other kind, the other's variant name) for each mixture kind and each other kind
    the summary paired it with."""
    return [
        (a, va, b, nb)
        for a, (_, va) in kinds.items()
        if a in MIXTURES
        for b, (nb, _) in kinds.items()
        if b != a and f"heldout_phrasing_retention_minus_{nb}" in va
    ]


def recipe_table(study, recipe=RECIPE):
    """The kinds trained with one recipe side by side (variants named exactly KIND + recipe): F1 retention per set
    with its interval's ends, then each mixture kind minus each other kind, paired by seed (where the summary has
    that baseline). An interval whose upper end is +x rules out an advantage above x at 95%."""
    if study is None:
        return "Not run yet."
    kinds = recipe_kinds(study, recipe)
    if not kinds:
        return f"No variant trained with `{recipe}` yet."
    rows = [
        [f"`{kind}`", str(len(v["seeds"]))] + [f"{format_mean_ci(v, k)} ({interval(v.get(k))})" for k in RECIPE_SETS]
        for kind, (_, v) in kinds.items()
    ]
    differences = [
        [f"`{a}`", f"`{b}`", str(len(paired_seeds(va, nb)))]
        + [f"{format_mean_ci(va, f'{k}_minus_{nb}')} ({interval(va.get(f'{k}_minus_{nb}'))})" for k in RECIPE_SETS]
        for a, va, b, nb in mixture_differences(kinds)
    ]
    sets = [f"{what} F1 retention (95% interval)" for what in RECIPE_SETS.values()]
    text = f"Every kind trained with `{recipe}` (mean ± 95% t-interval over seeds):\n\n" + table(
        ["translator", "seeds"] + sets, rows
    )
    if differences:
        text += "\n\nMixture of translators minus each other kind, paired by seed:\n\n" + table(
            ["MoT kind", "minus", "seeds paired"] + [f"{w} difference (95% interval)" for w in RECIPE_SETS.values()],
            differences,
        )
    return text


# the studies that check the recipe: a confirmation set never used for a choice, the kinds at equal parameter counts,
# and the injection depth (file stems in EXPERIMENTS; their blocks are written once the summaries exist)
CONFIRMATION, EQUAL_CAPACITY, DEPTH = "confirmation", "equal_capacity", "injection_depth"
SIZE_KEY = ":params="  # kvtranslate_retention.py's sized variants: KIND...:params=N


def commits_of(study):
    """Every commit the study's runs record ('+dirty' where the code differed from it)."""
    commits = sorted({c for v in study["variants"].values() for c in v.get("commits", [])})
    return ", ".join(f"`{c}`" for c in commits) or "not recorded"


def confirmation_table(study, screening, recipe=RECIPE):
    """Each recipe kind's F1 retention on the confirmation set beside the screening set's (the 1,000-step study,
    where the recipe was chosen), then each mixture kind minus each other kind, paired by seed, on both."""
    kinds = recipe_kinds(study, recipe)
    if not kinds:
        return f"No variant trained with `{recipe}` in the confirmation runs."
    screen = recipe_kinds(screening, recipe) if screening else {}

    def both(entry_c, entry_s, key):
        cells = [f"{format_mean_ci(entry_c, key)} ({interval(entry_c.get(key))})"]
        return cells + [format_mean_ci(entry_s, key) if entry_s else "–"]

    rows = []
    for kind, (_, v) in kinds.items():
        s = screen.get(kind, (None, None))[1]
        row = [f"`{kind}`", ", ".join(map(str, v["seeds"])), str(len(s["seeds"])) if s else "–"]
        for key in RECIPE_SETS:
            row += both(v, s, key)
        rows.append(row)
    header = ["translator", "confirmation seeds", "screening seeds"]
    for what in RECIPE_SETS.values():
        header += [f"{what}: confirmation (95% interval)", f"{what}: screening"]
    text = (
        f"`{study['source']}` -> `{study['target']}`, every kind trained with `{recipe}`; confirmation set: evaluation "
        f"seed {', '.join(map(str, study.get('eval_seeds', [])))}, commits {commits_of(study)} (F1 retention, mean ± "
        "95% t-interval over seeds):\n\n" + table(header, rows)
    )
    differences = []
    for a, va, b, nb in mixture_differences(kinds):
        sa = screen.get(a, (None, None))[1]
        row = [f"`{a}`", f"`{b}`", str(len(paired_seeds(va, nb)))]
        for key in RECIPE_SETS:
            diff = f"{key}_minus_{nb}"
            row += [f"{format_mean_ci(va, diff)} ({interval(va.get(diff))})", format_mean_ci(sa, diff) if sa else "–"]
        differences.append(row)
    if differences:
        header = ["MoT kind", "minus", "seeds paired"]
        for what in RECIPE_SETS.values():
            header += [f"{what}: confirmation (95% interval)", f"{what}: screening"]
        text += "\n\nMixture of translators minus each other kind, paired by seed:\n\n" + table(header, differences)
    return text


def sized_variants(study):
    """target parameter count -> kind -> (variant name, summary entry), for the variants named KIND...:params=N."""
    groups = {}
    for name, v in study["variants"].items():
        if SIZE_KEY in name:
            target = int(name.split(SIZE_KEY)[1].split(":")[0])
            groups.setdefault(target, {})[name.split(":")[0]] = (name, v)
    return dict(sorted(groups.items()))


def difference(entry_a, name_b, entry_b, name_a, key):
    """a minus b of `key`, paired by seed, from whichever of the two the summary paired with the other."""
    m = entry_a.get(f"{key}_minus_{name_b}")
    if m is None and entry_b.get(f"{key}_minus_{name_a}") is not None:
        m = dict(entry_b[f"{key}_minus_{name_a}"])
        m["mean"] = -m["mean"]
    return m


def equal_capacity_table(study):
    """The kinds sized to one parameter count each (variants KIND...:params=N): actual parameters and widths, F1
    retention per set, each pair of kinds' paired difference, and which kind is ahead at each size."""
    groups = sized_variants(study)
    if not groups:
        return "No sized variant (`KIND:...:params=N`) in the equal-capacity runs."
    rows, differences, verdicts = [], [], []
    for target, kinds in groups.items():
        for kind, (_, v) in kinds.items():
            widths = " / ".join(f"{k} {', '.join(map(str, w))}" for k, w in v.get("widths", {}).items())
            actual = ", ".join(fmt(p) for p in v.get("parameters", [])) or "–"
            rows.append(
                [fmt(target), f"`{kind}`", actual, widths or "–", ", ".join(map(str, v["seeds"]))]
                + [f"{format_mean_ci(v, k)} ({interval(v.get(k))})" for k in RECIPE_SETS]
            )
        names = list(kinds)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                (na, va), (nb, vb) = kinds[a], kinds[b]
                ms = [difference(va, nb, vb, na, k) for k in RECIPE_SETS]
                if any(m is not None for m in ms):
                    seeds = next(m for m in ms if m is not None).get("seeds", [])
                    differences.append(
                        [fmt(target), f"`{a}`", f"`{b}`", str(len(seeds))]
                        + ["–" if m is None else f"{format_mean_ci({'d': m}, 'd')} ({interval(m)})" for m in ms]
                    )
        for key, what in RECIPE_SETS.items():
            best = max(kinds, key=lambda k: kinds[k][1][key]["mean"] if key in kinds[k][1] else float("-inf"))
            nb, vb = kinds[best]
            against = []
            for other, (no, vo) in kinds.items():
                if other != best:
                    m = difference(vb, no, vo, nb, key)
                    against.append(f"`{other}` {'(not paired)' if m is None else spread_verdict(m)}")
            verdicts.append(
                f"- {fmt(target)} parameters, {what}: highest mean `{best}` ({format_mean_ci(vb, key)}); against "
                + "; ".join(against)
                + "."
            )
    seeds = ", ".join(map(str, study.get("eval_seeds", [])))
    text = (
        f"`{study['source']}` -> `{study['target']}`, evaluation seed {seeds}, "
        f"commits {commits_of(study)} (F1 retention, mean ± 95% t-interval over seeds):\n\n"
        + table(
            ["target parameters", "translator", "parameters", "widths", "seeds"]
            + [f"{what} F1 retention (95% interval)" for what in RECIPE_SETS.values()],
            rows,
        )
    )
    if differences:
        text += "\n\nEach pair of kinds at one size, paired by seed:\n\n" + table(
            ["target parameters", "translator", "minus", "seeds paired"]
            + [f"{what} difference (95% interval)" for what in RECIPE_SETS.values()],
            differences,
        )
    return text + "\n\n" + "\n".join(verdicts)


DEPTH_SETS = {"heldout_phrasing": "held-out phrasings", "long": "long contexts"}
FAILURE_MODES = {"propagated_shift": "propagated shift", "last_state_shift": "last-state shift"}


def depth_name(name, recipe=RECIPE):
    """A depth-study variant without the recipe every variant shares."""
    return name.replace(recipe, "") if recipe in name else name


def injection_depth_table(study, recipe=RECIPE):
    """experiments/translation/kvtranslate_injection_depth.py's summary: F1 retention at each injection point, the
    two failure modes and the per-layer probe per variant and set, and the paired differences (CCL minus no CCL,
    each variant minus each baseline) of the failure modes."""
    variants, points = study["variants"], study["points"]
    shared = all(recipe in n for n in variants)
    parts = [
        f"`{study['source']}` -> `{study['target']}`"
        + (f", every variant trained with `{recipe}`" if shared else "")
        + f"; evaluation seed {', '.join(map(str, study.get('eval_seeds', [])))}, commits {commits_of(study)}. "
        "F1 retention at each injection point p (mean ± 95% t-interval over seeds):"
    ]
    for s, what in DEPTH_SETS.items():
        rows = [
            [f"`{depth_name(n, recipe)}`", ", ".join(map(str, v["seeds"]))]
            + [format_mean_ci(v["measures"], f"{s}/p={p}/retention") for p in points]
            for n, v in variants.items()
            if f"{s}/p=1.0/retention" in v["measures"]
        ]
        if rows:
            parts.append(f"{what}:\n\n" + table(["translator", "seeds"] + [f"p={p}" for p in points], rows))
    layers = sorted(
        {int(k.split("/layer=")[1].split("/")[0]) for v in variants.values() for k in v["measures"] if "/layer=" in k}
    )
    rows = []
    for n, v in variants.items():
        for s, what in DEPTH_SETS.items():
            m = v["measures"]
            if f"{s}/p=1.0/retention" not in m:
                continue
            rows.append(
                [f"`{depth_name(n, recipe)}`", what]
                + [format_mean_ci(m, f"{s}/{k}") for k in FAILURE_MODES]
                + [format_mean_ci(m, f"{s}/layer={j}/retention") for j in layers]
                + [format_mean_ci(m, f"{s}/layer={j}/answer_kl") for j in layers]
            )
    parts.append(
        "The failure modes (propagated shift: the replayed tokens' relative hidden-state error, averaged over p < 1; "
        "last-state shift: KL(native || translated) at the answer's first token at p = 1) and the layer probe (p = 1, "
        "one target layer translated, the others the target's own):\n\n"
        + table(
            ["translator", "set", *FAILURE_MODES.values()]
            + [f"retention, layer {j} translated" for j in layers]
            + [f"answer KL, layer {j} translated" for j in layers],
            rows,
        )
    )
    rows = []
    for n, v in variants.items():
        for b, diffs in v["differences"].items():
            other = n + ":w_ccl=0.0" if b == "no_ccl" else b
            for s, what in DEPTH_SETS.items():
                cells = [diffs.get(f"{s}/{k}") for k in FAILURE_MODES] + [diffs.get(f"{s}/p=1.0/retention")]
                if any(c is not None for c in cells):
                    seeds = next(c for c in cells if c is not None)["seeds"]
                    rows.append(
                        [f"`{depth_name(n, recipe)}`", f"`{depth_name(other, recipe)}`", what, str(len(seeds))]
                        + [
                            "–" if c is None else f"{format_mean_ci({'d': c}, 'd')} ({spread_verdict(c)})"
                            for c in cells
                        ]
                    )
    if rows:
        parts.append(
            "Paired by seed (a lower shift is better: 'lower' beyond the spread means the first variant reduces it):"
            "\n\n"
            + table(
                ["translator", "minus", "set", "seeds paired"]
                + [f"{w} difference" for w in FAILURE_MODES.values()]
                + ["retention at p = 1 difference"],
                rows,
            )
        )
    return "\n\n".join(parts)


PROBES = {
    "native_keys": "target's own keys, translated values",
    "native_values": "translated keys, target's own values",
}


def probe_table(study):
    """The variants scored with --probe: F1 retention of the translated cache and of the same cache with the
    target's own keys or own values put in, on held-out phrasings and long contexts."""
    if study is None:
        return "Not run yet."
    rows = [
        [f"`{name}`", ", ".join(map(str, v["seeds"])), s.replace("_", " ")]
        + [format_mean_ci(v, f"{s}_retention")]
        + [format_mean_ci(v, f"{s}_{p}_retention") for p in PROBES]
        for name, v in study["variants"].items()
        for s in ("heldout_phrasing", "long")
        if f"{s}_native_keys_retention" in v
    ]
    if not rows:
        return "No run with `--probe` yet."
    return "F1 retention, mean ± 95% t-interval over seeds:\n\n" + table(
        ["translator", "seeds", "set", "translated cache"] + list(PROBES.values()), rows
    )


def longcontext_table(path):
    """experiments/translation/kvtranslate_longcontext.py's rows: per variant and set, direct and translated F1
    overall, F1 retention by where the asked fact starts, and the translated K/V's error by the token's own position."""
    if not os.path.isfile(path):
        return "Not run yet (`python -m experiments.translation.kvtranslate_longcontext`)."
    runs = [json.loads(line) for line in open(path)]
    sets = [r[k] for r in runs for k in LONGCONTEXT_SETS]
    facts = list(dict.fromkeys(b for s in sets for b in s["by_position"]))
    tokens = list(dict.fromkeys(b for s in sets for b in s.get("kv_error_by_token_position", {})))
    rows = []
    for r in runs:
        for key, what in LONGCONTEXT_SETS.items():
            s = r[key]
            by_fact = [s["by_position"].get(b) for b in facts]
            errors = s.get("kv_error_by_token_position", {})
            rows.append(
                [f"`{r['variant']}`", r["seed"], r["steps"], what, fmt(s["tokens"], 0), fmt(s["direct_f1"])]
                + [fmt(s["f1"]), fmt(s["retention"])]
                + ["–" if v is None else f"{fmt(v['f1'] / max(v['direct_f1'], 1e-9), 2)} ({v['n']})" for v in by_fact]
                + [fmt(errors.get(b), 2) for b in tokens]
            )
    first = runs[0]
    return (
        f"`{first['source']}` -> `{first['target']}`. F1 retention by the target token where the asked fact starts "
        "(passages in brackets), and the translated K/V's relative error (sum over layers of |translated - native|^2 "
        "/ |native|^2) by the token's own position (– where the run predates that measure):\n\n"
        + table(
            ["translator", "seed", "steps", "set", "tokens", "direct F1", "translated F1", "F1 retention"]
            + [f"retention, fact at {b}" for b in facts]
            + [f"K/V error, tokens {b}" for b in tokens],
            rows,
        )
    )


def checkpoints_table():
    """The committed tiny checkpoints: architecture and the final evaluation their pretraining logged."""
    rows = []
    for name in sorted(os.listdir(CHECKPOINTS)):
        meta = load(os.path.join(CHECKPOINTS, name, "kvtranslate.json"))
        if meta is None:
            continue
        spec, final = meta["spec"], meta["final"]
        rows.append(
            [
                f"`{name}`",
                spec["family"],
                f"{spec['layers']} x {spec['hidden']}",
                f"{spec['heads']} / {spec['kv_heads']}",
                f"{spec['vocab']} (`{spec['tokenizer']}`)",
                fmt(meta["params"]),
                fmt(final["closed_acc"]),
                fmt(final["binding_acc"]),
                fmt(final["open_em"]),
                fmt(meta["pretrain"]["steps"]),
                fmt(final["minutes"], 1),
            ]
        )
    return table(
        [
            "name",
            "family",
            "layers x width",
            "heads (query / KV)",
            "tokenizer entries",
            "parameters",
            "closed-set acc",
            "binding acc",
            "open EM",
            "steps",
            "minutes",
        ],
        rows,
    )


def heldout_table(path):
    """experiments/translation/translate_heldout.py: names x templates from the training or the held-out split."""
    data = load(path)
    if data is None:
        return "Not run (`experiments/translation/translate_heldout.py`)."
    rows = [
        [
            r["names"],
            r["templates"],
            fmt(r["direct_f1"]),
            fmt(r["translated_acc"]),
            fmt(r["translated_binding_acc"]),
            fmt(r["translated_f1"]),
            fmt(r["retention_f1"]),
        ]
        for r in data["rows"]
    ]
    return (
        f"`{data['source']}` -> `{data['target']}`, translator `{data['translator']}`, {data['rows'][0]['items']} "
        f"passages per row (`{os.path.relpath(path, REPO)}`):\n\n"
        + table(
            [
                "names",
                "templates",
                "direct F1",
                "translated acc",
                "translated binding acc",
                "translated F1",
                "F1 retention",
            ],
            rows,
        )
    )


def translator_trials_table(path):
    """history/translator_trials.jsonl (hand-collected, architecture of commit 05bd9e5)."""
    if not os.path.isfile(path):
        return "Missing."
    rows = []
    for line in open(path):
        t = json.loads(line)
        c, r = t["config"], t["translated"]
        rows.append(
            [
                t["what"],
                c["window"],
                c["hidden"],
                fmt(c["steps"]),
                fmt(c["n_train"]),
                fmt(r["acc"]),
                fmt(r["binding_acc"]),
                fmt(r["f1"]),
            ]
        )
    return table(
        [
            "trial (mot, tiny-gpt2 -> tiny-qwen2)",
            "window",
            "hidden",
            "steps",
            "training passages",
            "acc",
            "binding acc",
            "F1",
        ],
        rows,
    )


# how the headline names each translator kind (kvtranslate/translators.py KINDS)
KIND_WORDS = {
    "mot": "a mixture of translators",
    "mot-latent": "a mixture of translators on a shared latent space",
    "shared-latent": "a plain shared latent space",
    "single": "a single projector",
    "no-source": "a translator that never reads the source (shared latent, source zeroed)",
}


def relation(entry, baseline, kind):
    """'level with X', 'ahead of X', 'behind X' (paired 95% interval over seeds on both sets), or the two sets
    told apart when they differ."""
    words = []
    for key in RECIPE_SETS:
        m = entry[f"{key}_minus_{baseline}"]
        beyond = m["ci95"] is not None and abs(m["mean"]) > m["ci95"]
        words.append(("ahead of" if m["mean"] > 0 else "behind") if beyond else "level with")
    if len(set(words)) == 1:
        return f"{words[0]} {KIND_WORDS.get(kind, kind)}"
    first, second = RECIPE_SETS.values()
    return f"{words[0]} {KIND_WORDS.get(kind, kind)} on {first} and {words[1]} it on {second}"


def headline(summary, real, study=None, link="experiments/results/kvtranslate/README.md", confirmation=None):
    """One readable sentence and a link to the study log (`link`, relative to the README it goes in): the
    translator's retention over seeds, whether the mixture of translators is ahead of the strongest other kind
    under the same recipe, and the real-shape cost ratio. With a confirmation study the numbers are its own: the
    kind the screening study (`study`, on which the recipe was chosen) ranked first, scored on the confirmation
    set, which served no choice; without one, the screening study's best (said so); without a study, the demo's
    single seed."""
    parts = []
    chosen = confirmed_choice(study, confirmation) if study and confirmation else None
    if chosen:
        kind, v, kinds = chosen
        seeds = ", ".join(str(s) for s in confirmation.get("eval_seeds", []))
        parts.append(
            f"On the main cross-tokenizer pair ({confirmation['source']} to {confirmation['target']}), the translator "
            f"the screening study ranked first ({KIND_WORDS.get(kind, kind)}) keeps about "
            f"{fmt(v['heldout_phrasing_retention']['mean'], 2)} of the target's F1 on held-out phrasings and about "
            f"{fmt(v['long_retention']['mean'], 2)} on long passages on the confirmation set ({len(v['seeds'])} "
            f"seeds, evaluation seed {seeds}, never used for a choice)"
        )
    elif study:
        kinds = recipe_kinds(study)
        scored = [v for v in study["variants"].values() if all(k in v for k in RECIPE_SETS)]
        v = max(scored, key=lambda v: v["heldout_phrasing_retention"]["mean"])
        parts.append(
            f"On the main cross-tokenizer pair ({study['source']} to {study['target']}), translated caches keep about "
            f"{fmt(v['heldout_phrasing_retention']['mean'], 2)} of the target's F1 on held-out phrasings and about "
            f"{fmt(v['long_retention']['mean'], 2)} on long passages (the best translator of the screening set the "
            f"recipe was chosen on, {len(v['seeds'])} seeds; no confirmation set yet)"
        )
    if study:
        differences = mixture_differences(kinds)
        if differences:
            mixture = max(differences, key=lambda d: len(d[1]["seeds"]))[0]  # the first of the most seeded
            # against the strongest kind that is not itself a mixture (on the set the sentence reports)
            strongest = max(
                (d for d in differences if d[0] == mixture and d[2] not in MIXTURES),
                key=lambda d: kinds[d[2]][1]["heldout_phrasing_retention"]["mean"],
            )
            _, va, b, nb = strongest
            where = " on the confirmation set" if chosen else ""
            parts.append(f"{KIND_WORDS.get(mixture, mixture)} is {relation(va, nb, b)}{where}")
    elif summary:
        main_pair = next(iter(summary["pairs"]))
        r = summary["pairs"][main_pair]
        parts.append(
            f"On the main cross-tokenizer pair ({main_pair.replace('->', ' to ')}), MoT's translated cache keeps "
            f"{fmt(r['heldout_phrasing_retention'], 2)} of the target's F1 on held-out phrasings and "
            f"{fmt(r['retention'], 2)} on long passages (one seed)"
        )
    if real:
        parts.append(
            f"translating costs {fmt(min(real['ratio']), 2)}-{fmt(max(real['ratio']), 2)}x the target's prefill at "
            f"GPT-2 -> Qwen2.5-0.5B shapes"
        )
    if not parts:
        return "No results yet."
    sentence = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]
    if not sentence.startswith("On"):
        sentence = sentence[0].upper() + sentence[1:]
    return f"{sentence} ([results and study log]({link}))."


def confirmed_choice(screening, confirmation):
    """(kind, its confirmation entry, the confirmation's recipe kinds) for the recipe kind the screening study
    ranked first on held-out phrasings, when the confirmation study scored that kind on both sets; else None."""
    screened, confirmed = recipe_kinds(screening), recipe_kinds(confirmation)
    scored = {k: v for k, (_, v) in screened.items() if all(s in v for s in RECIPE_SETS)}
    if not scored:
        return None
    kind = max(scored, key=lambda k: scored[k]["heldout_phrasing_retention"]["mean"])
    if kind not in confirmed or not all(s in confirmed[kind][1] for s in RECIPE_SETS):
        return None
    return kind, confirmed[kind][1], confirmed


# a retention study's blocks: retention-KIND + the study's suffix
STUDY_BLOCKS = dict(study=retention_study_table, verdict=retention_verdict, probe=probe_table, recipe=recipe_table)


def render(demo=DEMO):
    summary, details = load(os.path.join(demo, "summary.json")), load(os.path.join(demo, "details.json"))
    blocks = {}
    if summary and details:
        blocks["demo"] = demo_table(summary, details)
        blocks["variants"] = variants_table(summary, details)
        blocks["injection"] = injection_table(summary, details)
    blocks["bench"] = bench_table(
        load(os.path.join(EXPERIMENTS, "bench_translate_real.json")),
        load(os.path.join(EXPERIMENTS, "bench_translate_tiny.json")),
    )
    studies = {name: load(os.path.join(EXPERIMENTS, f"{stem}_summary.json")) for name, (stem, _) in STUDIES.items()}
    latest = next((s for s in reversed(list(studies.values())) if s), None)
    real = load(os.path.join(EXPERIMENTS, "bench_translate_real.json"))
    confirmation = load(os.path.join(EXPERIMENTS, f"{CONFIRMATION}_summary.json"))
    for name, readme in HEADLINES.items():
        link = os.path.relpath(STUDIES_README, os.path.dirname(readme))
        blocks[name] = headline(summary, real, latest, link, confirmation)
    blocks["checkpoints"] = checkpoints_table()
    blocks["translator-trials"] = translator_trials_table(
        os.path.join(EXPERIMENTS, "history", "translator_trials.jsonl")
    )
    blocks["heldout"] = heldout_table(os.path.join(EXPERIMENTS, "heldout_tiny-gpt2__tiny-qwen2.json"))
    for name, study in studies.items():
        for kind in STUDIES[name][1]:
            blocks[f"retention-{kind}{name}"] = STUDY_BLOCKS[kind](study)
    blocks["longcontext-probe"] = longcontext_table(os.path.join(EXPERIMENTS, "longcontext_probe.jsonl"))
    # the checks of the recipe: only once their runs are committed (no table of nothing)
    if confirmation:
        blocks["confirmation"] = confirmation_table(confirmation, studies["-1000-steps"])
    equal = load(os.path.join(EXPERIMENTS, f"{EQUAL_CAPACITY}_summary.json"))
    if equal:
        blocks["equal-capacity"] = equal_capacity_table(equal)
    depth = load(os.path.join(EXPERIMENTS, f"{DEPTH}_summary.json"))
    if depth:
        blocks["injection-depth"] = injection_depth_table(depth)
    depth = load(os.path.join(EXPERIMENTS, f"{DEPTH_POSITIONS}_summary.json"))
    if depth:  # the same study on the positions-only task (kvtranslate_controls.py's studies)
        blocks["positions-injection-depth"] = injection_depth_table(depth, POSITIONS_RECIPE)
    # the controls (kvtranslate_controls.py): from every run's row, once a study's rows are committed
    short = read_rows(os.path.join(EXPERIMENTS, "controls_short.jsonl"))
    if short:
        blocks["controls-short"] = short_table(short)
    for name, stem in CONTROL_STUDIES.items():
        rows = read_rows(os.path.join(EXPERIMENTS, f"{stem}.jsonl"))
        if rows:
            blocks[name] = study_block(rows)
    for name, (stem, alone) in SOURCE_COMPARISONS.items():
        rows = read_rows(os.path.join(EXPERIMENTS, f"{stem}.jsonl"))
        others = {source: read_rows(os.path.join(EXPERIMENTS, f"{s}.jsonl")) for source, s in alone.items()}
        if rows and all(others.values()):
            blocks[name] = sources_table(rows, others)
    return blocks


def apply(text, blocks):
    return replace_blocks(text, blocks) or text  # a README holds only some of the blocks, or none


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.translation.kvtranslate_report",
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the README's tables are out of date")
    parser.add_argument("--demo", default=DEMO, help="folder of the demo's summary.json and details.json")
    parser.add_argument(
        "--readme",
        type=comma_list,
        default=",".join(READMES),
        help="comma-separated READMEs whose generated blocks are rewritten in place (or checked)",
    )
    args = parser.parse_args(argv)
    blocks, stale = render(args.demo), []
    for path in args.readme:
        with open(path) as f:
            text = f.read()
        new = apply(text, blocks)
        if new != text:
            stale.append(path)
            if not args.check:
                with open(path, "w") as f:
                    f.write(new)
    if args.check and stale:
        print("out of date:", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
