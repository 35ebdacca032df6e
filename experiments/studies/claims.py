"""What a converged comparison says of one method's claims, in words generated from its runs: whether the method's
larger tiers beat its smaller ones, whether it leads each baseline at equal rounds, and whether it still leads each
baseline trained to its compute (the suite's match-compute runs, ``<label>-matched``).

    python -m experiments.studies.claims experiments/results/converged/runs --method feast \\
        --readme README.md --readme docs/results.md --readme experiments/results/converged/README.md

Prints the reading; ``--readme FILE`` rewrites the blocks FILE has of ``claims-headline`` (one paragraph) and
``claims`` (one line per comparison, with each seed's difference). A difference is the baseline's accuracy minus the
method's (a tier's minus the next smaller tier's), paired by seed, with its 95% t-interval; "beyond the interval"
when the interval excludes zero, as in ``fl_app.report``'s verdicts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from fl_app.io.cli import add_readme_option, tool_parser
from fl_app.io.markdown import rewrite_each
from fl_app.report import MixedCommits, ReportError, Row, find_runs, report, signed
from fl_app.run.stats import paired_difference

BLOCKS = ("claims-headline", "claims")  # the generated blocks ``--readme`` rewrites


@dataclass
class Versus:
    """One baseline row against the method's row, paired by seed."""

    name: str
    difference: float
    half_width: float
    seeds: dict[int, float]  # seed -> the baseline's accuracy minus the method's
    verdict: str  # "better", "worse" or "not distinguishable ...", for the baseline
    compute_ratio: float = float("nan")  # a matched row's client training FLOPs over the method's (mean over seeds)

    def text(self, shown: str) -> str:
        """``shown``: "name", "difference" (with its interval) or "seeds" (and each seed's difference)."""
        if shown == "name":
            return self.name
        seeds = ", ".join(f"{100 * d:+.1f}" for d in self.seeds.values())
        tail = f"; seeds {seeds})" if shown == "seeds" else ")"
        return f"{self.name} ({signed(self.difference, self.half_width)}{tail}"


def versus(row: Row, ref: Row, compute_ratio: float = float("nan")) -> Versus:
    mine, theirs = row.by_seed(), ref.by_seed()
    paired = paired_difference(mine, theirs)
    return Versus(
        row.first.label,
        paired.difference.mean,
        paired.difference.half_width,
        {s: mine[s] - theirs[s] for s in paired.seeds},
        paired.verdict,
        compute_ratio,
    )


@dataclass
class Claims:
    method: str
    seeds: int
    tier_gains: list[dict]  # fl_app.report's tier-gains rows of the method
    equal: list[Versus]  # every baseline at the method's rounds
    matched: list[Versus]  # every baseline trained to the method's compute


def read_claims(folder: Path, method: str, allow_mixed_commits: bool = False) -> Claims:
    tables = report(find_runs([folder]), method, allow_mixed_commits)
    rows = tables["rows"]
    own = [r for r in rows if r.first.label == method]
    if len(own) != 1:
        found = ", ".join(sorted({r.first.label for r in rows}))
        raise ValueError(
            f"--method '{method}': {len(own)} rows of it in {folder}; allowed: a label with exactly one row "
            f"(labels there: {found})"
        )
    ref = own[0]
    ratios = {r["method"]: r["compute_ratio"] for r in tables["matched"]}
    others = [r for r in rows if r is not ref]
    return Claims(
        method,
        ref.seeds,
        [g for g in tables["tier_gains"] if g["method"] == ref.name],
        [versus(r, ref) for r in others if r.first.matched_to is None],
        [versus(r, ref, ratios.get(r.name, float("nan"))) for r in others if r.first.matched_to == method],
    )


def by_verdict(items: list, verdict) -> dict[str, list]:
    """``items`` split by their paired verdict (``verdict(item)``): "better", "level" (not distinguishable) and
    "worse" beyond the interval, each in the order given."""
    groups = {"better": [], "level": [], "worse": []}
    for item in items:
        groups.get(verdict(item), groups["level"]).append(item)
    return groups


def listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def tier_text(gain: dict) -> str:
    difference = signed(gain["difference"], gain["difference_ci95"])
    return (
        f"{gain['vs_tier_mmacs']:.2f} to {gain['tier_mmacs']:.2f} MMACs "
        f"({difference} points, larger ahead at {gain['wins']}/{gain['n']} seeds)"
    )


def tiers_sentence(claims: Claims) -> str:
    """Each tier against the next smaller one, grouped by verdict ("" for a method without tiers)."""
    gains = claims.tier_gains
    if not gains:
        return ""
    groups = by_verdict(gains, lambda g: g["verdict"])
    parts = [
        f"{what} " + listed([f"from {tier_text(g)}" for g in groups[key]])
        for key, what in (
            ("better", "better beyond the interval"),
            ("level", "level"),
            ("worse", "worse beyond the interval"),
        )
        if groups[key]
    ]
    return f"Each larger tier of {claims.method} against the next smaller one: " + "; ".join(parts) + "."


def baseline_groups(versus: list[Versus], method: str, shown: str) -> str:
    """The baselines behind the method beyond the interval, level with it, and ahead of it beyond the interval."""
    groups = by_verdict(versus, lambda v: v.verdict)
    return "; ".join(
        f"{what}: {listed([v.text(shown) for v in groups[key]])}"
        for key, what in (
            ("worse", f"behind {method} beyond the interval"),
            ("level", f"level with {method}"),
            ("better", f"ahead of {method} beyond the interval"),
        )
        if groups[key]
    )


def every_seed(versus: list[Versus], method: str) -> str:
    """How many baselines the method leads at every seed (each seed's difference below zero)."""
    led = [v for v in versus if v.seeds and all(d < 0 for d in v.seeds.values())]
    count = f"all {len(versus)}" if len(led) == len(versus) else f"{len(led)} of the {len(versus)}"
    return f"{method} is ahead of {count} baselines at every seed"


def compute_range(versus: list[Versus]) -> str:
    ratios = [v.compute_ratio for v in versus if v.compute_ratio == v.compute_ratio]
    if not ratios:
        return ""
    lo, hi = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
    return f" ({lo}×" + (f" to {hi}×" if hi != lo else "") + " of them, mean over seeds)"


def headline(claims: Claims) -> str:
    """The comparison in one paragraph (baseline minus method, paired by seed)."""
    text = tiers_sentence(claims)
    if claims.equal:
        text += (
            f"{' ' * bool(text)}At equal rounds {every_seed(claims.equal, claims.method)}; the baselines are "
            f"{baseline_groups(claims.equal, claims.method, 'name')}."
        )
    if claims.matched:
        text += (
            f" Each baseline trained to {claims.method}'s client training FLOPs{compute_range(claims.matched)} is "
            f"{baseline_groups(claims.matched, claims.method, 'difference')}."
        )
    return (
        text + f" ({claims.seeds} seeds; a difference is the baseline's accuracy minus {claims.method}'s, in points, "
        "with its 95% paired interval.)"
    )


def detail(claims: Claims) -> str:
    """One line per comparison, with each seed's difference."""
    lines = [f"- {tiers_sentence(claims)}"] if claims.tier_gains else []
    if claims.equal:
        lines.append(
            f"- At equal rounds {every_seed(claims.equal, claims.method)}. The baselines are "
            f"{baseline_groups(claims.equal, claims.method, 'seeds')}."
        )
    if claims.matched:
        lines.append(
            f"- Trained to {claims.method}'s client training FLOPs{compute_range(claims.matched)}, the baselines are "
            f"{baseline_groups(claims.matched, claims.method, 'seeds')}."
        )
    return "\n".join(lines)


def build_parser():
    parser = tool_parser("experiments.studies.claims", __doc__)
    parser.add_argument("folder", type=Path, help="a suite folder or a folder of its runs")
    parser.add_argument("--method", required=True, help="the label whose claims are read (e.g. feast)")
    parser.add_argument("--allow-mixed-commits", action="store_true", help="as in fl_app.report")
    add_readme_option(parser, "claims blocks")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        claims = read_claims(args.folder, args.method, args.allow_mixed_commits)
        texts = dict(zip(BLOCKS, (headline(claims), detail(claims))))
        print("\n\n".join(texts.values()))
        rewrite_each(args.readme, texts)
    except (MixedCommits, ReportError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
