"""Injection depth: the two failure modes of injecting a translated cache, per translator kind, with and without the
Context Correction Loss (CCL), over translator seeds.

What injecting means in kvtranslate (evaluate.prefix_and_tails, train.py's `injection_points`): the first p of the
context's target tokens come from the translated cache and the target re-reads ("replays") the rest itself before
the question. The main axis of this study is that injection point p:
- early injection (small p): the replayed tokens attend to the translated prefix, and the error they pick up travels
  along the replay, the *propagated shift*: `replay_hidden_err`, the relative error of the target's last hidden state
  over the replayed tokens against the same split with the target's own cache (evaluate.injection_errors);
- late injection (p = 1): nothing is replayed, the question reads the translated cache directly, the *last-state
  shift*: `answer_kl`, KL(native || translated) of the next-token distribution where the answer starts.
F1 retention (translated F1 / direct F1) is scored at every p on each set.

An injection *layer* is ill-posed for the tiny pairs: the targets have 2 layers (tiny-qwen2; tiny-qwen2-b 3), so a
curve over layers has two points, and one layer's translated K/V can only be injected alone by taking the other
layers' K/V from the target's own prefill (a probe, not a way to run translation). `--layer-probe` (on by default)
scores that probe at p = 1: the translated K/V in one target layer only, F1 retention and answer_kl per layer, which
says whether the first layer's error (read by every layer above it) or the last layer's (read straight into the last
state) costs more.

Each (variant, seed) appends one JSON line to OUT; the summary (`..._summary.json`: mean and 95% t-interval over
seeds per set, point and measure; paired differences, same seed, of each variant to its no-CCL twin and to each
`--baselines` variant) and the plot (`--plot`, default OUT with .png: retention, propagated shift and last-state shift
against p, and retention per translated layer, with 95% seed bands) are rewritten after the runs, or alone with
`--summary`.

    python -m experiments.translation.kvtranslate_injection_depth --seeds 300,301,302 --eval-seed 5000 --threads 1
"""

import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.translation.kvtranslate_retention import (  # noqa: E402
    RESULTS,
    add_run_args,
    eval_sets,
    study_parser,
    study_runs,
    study_setup,
    t_interval,
)
from kvtranslate.cli import comma_list, print_table  # noqa: E402
from kvtranslate.evaluate import injection_errors, qa_scores  # noqa: E402
from kvtranslate.models import kv_geometry  # noqa: E402
from kvtranslate.train import TRAIN_DEFAULTS  # noqa: E402

DEFAULT_OUT = os.path.join(RESULTS, "injection_depth.jsonl")
RECIPE = ":phrase_mix=0.5:w_key=16.0:steps=2000"  # the recipe the retention studies chose (kvtranslate/demo.py)
NO_CCL = ":w_ccl=0.0"  # a variant's twin trained without the CCL
KINDS = ("shared-latent", "mot-latent", "mot", "single")
DEFAULT_VARIANTS = ",".join(f"{k}{RECIPE}{ccl}" for k in KINDS for ccl in ("", NO_CCL))
DEFAULT_BASELINES = ",".join(f"{k}{RECIPE}" for k in ("single", "shared-latent"))
SETS = ("heldout_phrasing", "long")  # of kvtranslate_retention's evaluation sets
POINTS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
MEASURES = ("retention", "acc", "replay_hidden_err", "answer_kl")
# the two failure modes as one number each: the replay's error averaged over the points that replay anything, and
# the answer's KL with nothing replayed
FAILURE_MODES = ("propagated_shift", "last_state_shift")


def failure_modes(points: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """propagated_shift = mean replay_hidden_err over the points p < 1; last_state_shift = answer_kl at p = 1."""
    replay = [r["replay_hidden_err"] for p, r in points.items() if float(p) < 1 and r["replay_hidden_err"] is not None]
    last = points.get("1.0")
    return dict(
        propagated_shift=statistics.fmean(replay) if replay else None,
        last_state_shift=None if last is None else last["answer_kl"],
    )


def score_set(data: list, direct_f1: float, pair: Any, translator: Any, points: list[float], layer_probe: bool) -> dict:
    """Per injection point (key str(p)): retention, acc, replay_hidden_err, answer_kl; the failure modes; per
    target layer (layer probe, p = 1): retention and answer_kl with only that layer translated."""
    by_point = {}
    for p in points:
        scores = qa_scores(data, "translated", pair, translator, frac=p)[0]
        by_point[str(p)] = dict(
            retention=scores["f1"] / max(direct_f1, 1e-9),
            acc=scores["acc"],
            **injection_errors(data, pair, translator, p),
        )
    out: dict[str, Any] = dict(points=by_point, **failure_modes(by_point))
    if layer_probe:
        out["layers"] = {}
        for layer in range(kv_geometry(pair.target)["layers"]):
            scores = qa_scores(data, "translated", pair, translator, frac=1.0, layers=(layer,))[0]
            errors = injection_errors(data, pair, translator, 1.0, layers=(layer,))
            out["layers"][str(layer)] = dict(
                retention=scores["f1"] / max(direct_f1, 1e-9), answer_kl=errors["answer_kl"]
            )
    return out


def flat_measures(row: dict[str, Any]) -> dict[str, float]:
    """A row's numbers under flat keys: SET/p=P/MEASURE, SET/layer=L/MEASURE, SET/FAILURE_MODE."""
    flat = {}
    for s, res in row["sets"].items():
        for p, r in res["points"].items():
            flat.update({f"{s}/p={p}/{m}": v for m, v in r.items() if v is not None})
        for layer, r in res.get("layers", {}).items():
            flat.update({f"{s}/layer={layer}/{m}": v for m, v in r.items() if v is not None})
        flat.update({f"{s}/{m}": res[m] for m in FAILURE_MODES if res.get(m) is not None})
    return flat


def summarise(path: str, baselines: list[str] | None = None) -> dict[str, Any]:
    """Mean and 95% t-interval over seeds of every flat measure per variant, and paired differences (same seed) to
    the variant's no-CCL twin (key `minus_no_ccl`) and to each baseline present in the file. Writes
    ..._summary.json beside `path`."""
    runs = [json.loads(line) for line in open(path)]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    flat = {v: {r["seed"]: flat_measures(r) for r in runs if r["variant"] == v} for v in variants}
    baselines = [b for b in (baselines or []) if b in variants]
    first = runs[0]
    summary: dict[str, Any] = dict(
        source=first["source"],
        target=first["target"],
        eval_seeds=sorted({r["eval_seed"] for r in runs}),
        points=sorted({float(p) for r in runs for s in r["sets"].values() for p in s["points"]}),
        baselines=baselines,
        variants={},
    )

    def stats(values: list[float], seeds: list[int] | None = None) -> dict[str, Any]:
        mean, ci = t_interval(values)
        return dict(mean=mean, ci95=ci, **({} if seeds is None else dict(seeds=seeds)))

    def paired(v: str, b: str) -> dict[str, Any]:
        seeds = sorted(set(flat[v]) & set(flat[b]))
        keys = {k for s in seeds for k in flat[v][s] if all(k in flat[v][t] and k in flat[b][t] for t in seeds)}
        return {k: stats([flat[v][s][k] - flat[b][s][k] for s in seeds], seeds) for k in sorted(keys)} if seeds else {}

    for v in variants:
        seeds = sorted(flat[v])
        keys = sorted({k for s in seeds for k in flat[v][s]})
        rows = [r for r in runs if r["variant"] == v]
        entry: dict[str, Any] = dict(
            kind=rows[0]["overrides"]["kind"],
            ccl=rows[0]["w_ccl"] > 0,
            seeds=seeds,
            parameters=sorted({r["parameters"] for r in rows}),
            commits=sorted({(r["commit"] or "?")[:12] + ("+dirty" if r.get("dirty") else "") for r in rows}),
            measures={k: stats([flat[v][s][k] for s in seeds if k in flat[v][s]]) for k in keys},
            differences={},
        )
        if v + NO_CCL in flat:
            entry["differences"]["no_ccl"] = paired(v, v + NO_CCL)
        for b in baselines:
            if b != v and not v.endswith(NO_CCL):
                entry["differences"][b] = paired(v, b)
        summary["variants"][v] = entry
    with open(path.replace(".jsonl", "_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """Per variant and set: the failure modes and retention at the first and last point (stderr)."""
    first, last = summary["points"][0], summary["points"][-1]
    rows = []
    for v, e in summary["variants"].items():
        for s in SETS:
            m = e["measures"]
            cells = [m.get(k) for k in (f"{s}/propagated_shift", f"{s}/last_state_shift")]
            cells += [m.get(f"{s}/p={p}/retention") for p in (first, last)]
            if any(cells):
                rows.append([v, s] + [None if c is None else c["mean"] for c in cells])
    print_table(["variant", "set", "propagated shift", "last-state shift", f"retention p={first}", f"p={last}"], rows)


def layer_indices(summary: dict[str, Any], set_name: str) -> list[int]:
    """The target layers the summary's layer probe covers on a set."""
    prefix = f"{set_name}/layer="
    keys = [k for e in summary["variants"].values() for k in e["measures"] if k.startswith(prefix)]
    return sorted({int(k[len(prefix) :].split("/")[0]) for k in keys})


def plot(summary: dict[str, Any], out: str) -> None:
    """Per set: F1 retention, propagated shift (replay_hidden_err) and last-state shift (answer_kl) against p, and
    F1 retention per translated layer; one colour per kind, solid with the CCL, dashed without, bands the 95%
    t-interval over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [s for s in SETS if any(f"{s}/p=1.0/retention" in e["measures"] for e in summary["variants"].values())]
    panels = [
        ("retention", "F1 retention (translated / direct)"),
        ("replay_hidden_err", "propagated shift: replayed tokens'\nrelative hidden-state error"),
        ("answer_kl", "KL(native || translated) at the answer's\nfirst token (last-state shift at p = 1)"),
        ("layers", "F1 retention, one target layer translated\n(others native, p = 1)"),
    ]
    fig, axes = plt.subplots(len(sets), len(panels), figsize=(4.4 * len(panels), 3.8 * len(sets)), squeeze=False)
    colours = dict(zip(KINDS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, s in enumerate(sets):
        for col, (measure, label) in enumerate(panels):
            ax = axes[row][col]
            for e in summary["variants"].values():
                m = e["measures"]
                if measure == "layers":
                    xs = [x for x in layer_indices(summary, s) if f"{s}/layer={x}/retention" in m]
                    keys = [f"{s}/layer={x}/retention" for x in xs]
                else:
                    xs = [p for p in summary["points"] if f"{s}/p={p}/{measure}" in m]
                    keys = [f"{s}/p={p}/{measure}" for p in xs]
                if not xs:
                    continue
                mean = [m[k]["mean"] for k in keys]
                half = [m[k]["ci95"] or 0.0 for k in keys]
                style = dict(color=colours.get(e["kind"]), linestyle="-" if e["ccl"] else "--", marker="o", ms=3)
                name = f"{e['kind']}, {'with' if e['ccl'] else 'without'} CCL ({len(e['seeds'])} seeds)"
                ax.plot(xs, mean, label=name, **style)
                lower = [a - b for a, b in zip(mean, half)]
                upper = [a + b for a, b in zip(mean, half)]
                ax.fill_between(xs, lower, upper, color=style["color"], alpha=0.12, linewidth=0)
            ax.set_title(f"{s.replace('_', ' ')} set", fontsize=10)
            ax.set_ylabel(label, fontsize=9)
            if measure == "layers":
                ax.set_xlabel("target layer holding translated K/V")
                ax.set_xticks(layer_indices(summary, s))
            else:
                ax.set_xlabel("injection point p")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        f"{summary['source']} -> {summary['target']}: the first p of the context's tokens from the translated cache, "
        "the rest replayed by the target; mean and 95% t-interval over seeds",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = study_parser(
        "python -m experiments.translation.kvtranslate_injection_depth",
        __doc__,
        DEFAULT_VARIANTS,
        "comma-separated variants (kvtranslate_retention's syntax); a variant's twin without the CCL ends in "
        f"'{NO_CCL}'",
    )
    add_run_args(parser)
    parser.add_argument("--sets", type=comma_list, default=",".join(SETS), help=f"evaluation sets, of {','.join(SETS)}")
    parser.add_argument(
        "--points", type=comma_list, default=",".join(map(str, POINTS)), help="injection points p, each in (0, 1]"
    )
    parser.add_argument("--n", type=int, default=200, help="passages of the short held-out phrasing set")
    parser.add_argument("--n-long", type=int, default=120, help="long passages")
    parser.add_argument(
        "--no-layer-probe", action="store_true", help="skip the per-layer probe (one target layer translated)"
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON-lines file the runs are appended to")
    parser.add_argument("--plot", help="the plot's file (default: OUT with .png)")
    parser.add_argument(
        "--baselines",
        type=comma_list,
        default=DEFAULT_BASELINES,
        help="comma-separated variants every other variant's measures are paired with (those present in OUT)",
    )
    parser.add_argument("--summary", action="store_true", help="only rewrite the summary and plot of OUT")
    args = parser.parse_args(argv)
    plot_path = args.plot or args.out.replace(".jsonl", ".png")
    if args.summary:
        plot(summarise(args.out, args.baselines), plot_path)
        return
    bad_sets = [s for s in args.sets if s not in SETS]
    try:
        points = [float(p) for p in args.points]
    except ValueError:
        parser.error(f"--points must be numbers in (0, 1], got {args.points}")
    if bad_sets or not all(0 < p <= 1 for p in points) or 1.0 not in points:
        parser.error(
            f"--sets must be among {','.join(SETS)} (got {','.join(args.sets)}) and --points numbers in (0, 1] "
            f"including 1 (the late injection), got {','.join(args.points)}"
        )
    variants, pair = study_setup(parser, args)
    data = {k: d for k, d in eval_sets(pair, args.n, args.n_long, args.eval_seed).items() if k in args.sets}
    direct = {k: qa_scores(d, "direct", pair)[0]["f1"] for k, d in data.items()}
    for translator, settings, row in study_runs(args, pair, variants):
        row.update(
            w_ccl=settings.get("w_ccl", TRAIN_DEFAULTS["w_ccl"]),
            direct_f1=direct,
            sets={
                k: score_set(d, direct[k], pair, translator, points, not args.no_layer_probe) for k, d in data.items()
            },
        )
    plot(summarise(args.out, args.baselines), plot_path)


if __name__ == "__main__":
    main()
