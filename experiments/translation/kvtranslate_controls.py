"""Tables of the control studies (kvtranslate_retention.py rows, e.g. with `target_input=positions`): every kind
over seeds, each kind minus the no-source control paired by seed, the mixture against the other kinds, the
uniform-gate ablation and the router's diagnostics per seed.

Read straight from a study's JSON lines (one row per run), so every number in the study log's control sections comes
from a committed row; kvtranslate_report.py writes the blocks into the README. A variant is labelled by its kind plus
the overrides that set it apart from the file's other variants (`shared-latent:steps=400` where steps differ).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.translation.kvtranslate_retention import t_interval  # noqa: E402

# kvtranslate_retention's sets, all about held-out names: training phrasings (like `kvtranslate eval`'s set), held-out
# phrasings, long passages (held-out phrasings, 22 facts)
SETS = {"training_phrasing": "training phrasings", "heldout_phrasing": "held-out phrasings", "long": "long contexts"}
CONTROL = "no-source"  # the kind that never reads the source
MIXTURES = ("mot", "mot-latent")
UNIFORM = "uniform gates"  # a mixture scored with every expert weighted 1/M (a row's SET_uniform_gates_retention)
FIRST_SET = f"{next(iter(SETS))}_retention"  # the set whose row keys say which ablations a study ran
WITHOUT = "without"  # with several sources: scored with one source's layers zeroed (SET_without_NAME_retention)


def read_rows(path):
    """The rows of a JSON-lines file, None when it does not exist."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def labels(rows):
    """variant -> its label: the kind plus the overrides not shared by every variant in `rows`."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    parts = {v: v.split(":") for v in variants}
    common = set.intersection(*(set(p[1:]) for p in parts.values()))
    return {v: ":".join([p[0], *(x for x in p[1:] if x not in common)]) for v, p in parts.items()}


def ablations(row, key):
    """(label suffix, metric) of every evaluation ablation `row` holds for `key` (a SET_retention): the uniform
    gates ('uniform gates'), then each source dropped ('without NAME', SET_without_NAME_retention, with several
    sources)."""
    stem = key.removesuffix("_retention")
    found = [(UNIFORM, f"{stem}_uniform_gates_retention")]
    prefix = f"{stem}_{WITHOUT}_"
    found += [
        (f"{WITHOUT} {m.removeprefix(prefix).removesuffix('_retention')}", m)
        for m in row
        if m.startswith(prefix) and m.endswith("_retention")
    ]
    return [(suffix, m) for suffix, m in found if row.get(m) is not None]


def ablation_value(row, set_name, suffix):
    """The row's retention on `set_name` under the ablation `suffix` (`ablations`), None when it has none."""
    metric = dict(ablations(row, f"{set_name}_retention")).get(suffix)
    return None if metric is None else row[metric]


def by_label(rows, key):
    """label -> {seed: value of `key`} over the rows that have it (a row's ablations under the label
    'KIND, uniform gates' or 'KIND, without NAME', `ablations`)."""
    names, out = labels(rows), {}
    for r in rows:
        label = names[r["variant"]]
        found = ([(label, key)] if r.get(key) is not None else []) + [
            (f"{label}, {suffix}", metric) for suffix, metric in ablations(r, key)
        ]
        for name, metric in found:
            out.setdefault(name, {})[r["seed"]] = r[metric]
    return out


def fmt(x):
    return f"{x:.3f}"


def ci_text(values):
    """'mean ± half-width (lo to hi)' of the 95% t-interval, 'mean (one seed)' for one value."""
    mean, half = t_interval(values)
    if half is None:
        return f"{fmt(mean)} (one seed)"
    return f"{fmt(mean)} ± {fmt(half)} ({fmt(mean - half)} to {fmt(mean + half)})"


def verdict(values):
    """Whether the paired differences' 95% interval excludes 0."""
    mean, half = t_interval(values)
    if half is None:
        return "one seed: no interval"
    if abs(mean) <= half:
        return "within the interval"
    return "beyond the interval, " + ("higher" if mean > 0 else "lower")


def header(rows):
    """The line above a study's tables: pair, evaluation seed, steps, commits and the study's CPU time."""
    commits = sorted({r["commit"][:12] + ("+dirty" if r.get("dirty") else "") for r in rows if r.get("commit")})
    minutes = sum(r.get("cpu_minutes", 0.0) for r in rows)
    return (
        f"`{rows[0]['source']}` -> `{rows[0]['target']}`, evaluation seed "
        f"{', '.join(str(s) for s in sorted({r['eval_seed'] for r in rows}))}, "
        f"steps {', '.join(str(s) for s in sorted({r['steps'] for r in rows}))}, commits "
        f"{', '.join(f'`{c}`' for c in commits) or 'not recorded'}; CPU time of the {len(rows)} runs "
        f"{minutes:.1f} min ({minutes * 60:,.0f} s) on one thread (F1 retention, mean ± 95% t-interval over seeds):"
    )


def kinds_table(rows):
    """One line per variant (and per mixture with uniform gates): parameters, widths, seeds, F1 retention per set,
    CPU minutes per run."""
    names = labels(rows)
    lines = []
    for variant, label in names.items():
        runs = [r for r in rows if r["variant"] == variant]
        widths = " / ".join(f"{k} {runs[0][k]}" for k in ("hidden", "latent") if k in runs[0])
        seeds = ", ".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"]))
        trained = [r for r in runs if r.get("translator") != "loaded"] or runs  # a kept translator only scores
        cpu = sum(r.get("cpu_minutes", 0.0) for r in trained) / len(trained)
        sets = [ci_text([r[f"{s}_retention"] for r in runs]) for s in SETS]
        lines.append([f"`{label}`", f"{runs[0].get('parameters', 0):,}", widths, seeds, *sets, f"{cpu:.1f}"])
        for suffix, _ in ablations(runs[0], FIRST_SET):
            values = [[ablation_value(r, s, suffix) for r in runs] for s in SETS]
            if all(v is not None for vs in values for v in vs):
                lines.append([f"`{label}`, {suffix} at evaluation", "same", "", seeds, *map(ci_text, values), ""])
    head = ["translator", "parameters", "widths", "seeds", *(f"{n} F1 retention" for n in SETS.values())]
    return table([*head, "CPU min per trained run"], lines)


def comparisons(rows):
    """(a, b) label pairs to difference, paired by seed: every kind minus the no-source control, each mixture minus
    every other kind but the control, each mixture with uniform gates minus itself routed."""
    names = list(labels(rows).values())
    control = [n for n in names if n.split(":")[0] == CONTROL]
    mixtures = [n for n in names if n.split(":")[0] in MIXTURES]
    pairs = [(a, c) for c in control for a in names if a != c]
    pairs += [(m, b) for m in mixtures for b in names if b != m and b not in control]
    pairs += [(f"{m}, {UNIFORM}", m) for m in mixtures]
    # with several sources: each translator with one source dropped minus itself
    dropped = [n for n in by_label(rows, FIRST_SET) if n.rsplit(", ", 1)[-1].startswith(f"{WITHOUT} ")]
    pairs += [(d, d.rsplit(", ", 1)[0]) for d in dropped]
    return pairs


def differences_table(rows):
    """a minus b per set, paired by seed (only the seeds both ran), with whether the 95% interval excludes 0."""
    per_set = {s: by_label(rows, f"{s}_retention") for s in SETS}
    lines = []
    for a, b in comparisons(rows):
        cells = []
        seeds = None
        for s in SETS:
            va, vb = per_set[s].get(a, {}), per_set[s].get(b, {})
            shared = sorted(set(va) & set(vb))
            if not shared:
                cells += ["–", "–"]
                continue
            seeds = seeds or shared
            diffs = [va[k] - vb[k] for k in shared]
            cells += [ci_text(diffs), verdict(diffs)]
        if seeds:
            lines.append([f"`{a}`", f"`{b}`", len(seeds), *cells])
    head = ["translator", "minus", "seeds paired"]
    for n in SETS.values():
        head += [f"{n}: difference (95% interval)", f"{n}: verdict"]
    return table(head, lines) if lines else ""


def mixture_verdicts(rows):
    """One generated sentence per mixture comparison: the paired difference on each set and whether its 95%
    interval excludes 0."""
    per_set = {s: by_label(rows, f"{s}_retention") for s in SETS}
    mixtures = {n for n in labels(rows).values() if n.split(":")[0] in MIXTURES}
    lines = []
    for a, b in comparisons(rows):
        if a not in mixtures and a.split(", ")[0] not in mixtures:
            continue
        said = []
        for s, name in SETS.items():
            va, vb = per_set[s].get(a, {}), per_set[s].get(b, {})
            diffs = [va[k] - vb[k] for k in sorted(set(va) & set(vb))]
            if diffs:
                mean, half = t_interval(diffs)
                spread = "" if half is None else f" ± {fmt(half)}"
                said.append(f"{name} {mean:+.3f}{spread} ({verdict(diffs)})")
        if said:
            lines.append(f"- `{a}` minus `{b}`: " + "; ".join(said) + ".")
    return "\n".join(lines)


def routing_table(rows):
    """Per mixture, seed and set: gate entropy / log M (1 uniform), mean top gate (1/M uniform), hard per-expert
    usage, hard balance (1 balanced, M collapsed), and retention routed vs with uniform gates."""
    names, lines = labels(rows), []
    for r in sorted(rows, key=lambda r: (r["variant"], r["seed"])):
        for s, name in SETS.items():
            g = r.get(f"{s}_routing")
            if g is None:
                continue
            uniform = r.get(f"{s}_uniform_gates_retention")
            lines.append(
                [
                    f"`{names[r['variant']]}`",
                    r["seed"],
                    name,
                    fmt(g["gate_entropy"]),
                    fmt(g["gate_top"]),
                    " / ".join(f"{u:.2f}" for u in g["expert_usage"]),
                    fmt(g["hard_balance"]),
                    fmt(r[f"{s}_retention"]),
                    "–" if uniform is None else fmt(uniform),
                ]
            )
    head = ["translator", "seed", "set", "gate entropy / log M", "mean top gate", "hard usage per expert"]
    return table([*head, "hard balance", "F1 retention", f"F1 retention, {UNIFORM}"], lines) if lines else ""


def table(head, lines):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in line) + " |" for line in lines])


def study_block(rows):
    """A control study's block: the header line, the kinds, the paired differences and the routing."""
    parts = [header(rows), kinds_table(rows)]
    differences = differences_table(rows)
    if differences:
        parts += ["Paired by seed (a minus b, only the seeds both ran):", differences]
    verdicts = mixture_verdicts(rows)
    if verdicts:
        parts += ["The mixture against each alternative (generated from the same pairs):", verdicts]
    routing = routing_table(rows)
    if routing:
        parts += ["The mixtures' routing per seed (kvtranslate/routing.py):", routing]
    return "\n\n".join(parts)


def sources_table(rows, alone):
    """Several sources against each alone: every variant of the several-source study (`rows`) minus the same variant
    (the same settings) trained on one of its sources (`alone`: source name -> that study's rows), paired by seed, per
    set. Both must be scored on the same evaluation seed (else an error naming both)."""
    names, lines = labels(rows), []
    for source, other in alone.items():
        seeds_here, seeds_there = {r["eval_seed"] for r in rows}, {r["eval_seed"] for r in other}
        if seeds_here != seeds_there:
            raise ValueError(
                f"evaluation seeds differ: {sorted(seeds_here)} with every source, {sorted(seeds_there)} with "
                f"{source} alone"
            )
        for variant, label in names.items():
            here = {r["seed"]: r for r in rows if r["variant"] == variant}
            there = {r["seed"]: r for r in other if r["variant"] == variant}
            shared = sorted(set(here) & set(there))
            if not shared:
                continue
            cells = []
            for s in SETS:
                diffs = [here[k][f"{s}_retention"] - there[k][f"{s}_retention"] for k in shared]
                cells += [ci_text(diffs), verdict(diffs)]
            lines.append([f"`{label}`", f"`{label}` from `{source}` alone", len(shared), *cells])
    head = ["translator (every source)", "minus", "seeds paired"]
    for n in SETS.values():
        head += [f"{n}: difference (95% interval)", f"{n}: verdict"]
    return table(head, lines) if lines else ""


def short_table(rows):
    """The one-seed short check (`python -m kvtranslate eval` rows: one per kind and target input, plus the
    bounds): accuracy, F1, F1 retention, and the mixture's F1 with uniform gates."""
    bounds = next(r for r in rows if r.get("bounds"))
    lines = []
    for r in (r for r in rows if not r.get("bounds")):
        uniform = r.get("uniform_gates")
        lines.append(
            [
                "embeddings (default)" if r["target_input"] == "embeddings" else "positions only",
                f"`{r['kind']}`",
                fmt(r["translated"]["acc"]),
                fmt(r["translated"]["f1"]),
                fmt(r["retention"]),
                "–" if uniform is None else f"{fmt(uniform['f1'])} (accuracy {fmt(uniform['acc'])})",
            ]
        )
    lines.sort(key=lambda line: line[0] != "embeddings (default)")
    head = ["target input", "kind", "accuracy", "F1", "F1 retention", f"F1 with {UNIFORM}"]
    return (
        f"Seed {rows[0]['seed']}, {rows[0]['steps']} steps, {bounds['eval_n']} held-out passages of evaluation seed "
        f"{bounds['eval_seed']}: direct F1 {fmt(bounds['direct']['f1'])}, no-context F1 "
        f"{fmt(bounds['no_context']['f1'])}.\n\n" + table(head, lines)
    )
