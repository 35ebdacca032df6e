"""Where a translated cache loses F1 on long contexts: phrasing, or position in the passage.

Trains each translator variant once (one seed) and scores direct reading and the translated cache on long
passages (held-out names, 22 facts) phrased with the held-out templates (the retention study's long set) and with
the training templates, plus the study's short held-out-phrasing set. F1 is also split by where the asked fact
starts in the target's tokens (POSITION_BUCKETS), beside the longest training passage the translator read: a
loss that grows with the position, on either phrasing, points at positions never seen in training. One JSON
line per variant is appended to OUT and printed; a table goes to stderr.

    python -m experiments.translation.kvtranslate_longcontext \
        --variants mot:phrase_mix=0.5,mot:phrase_mix=0.5:long_mix=0.25
"""

import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.translation.kvtranslate_retention import RESULTS, study_parser, study_setup  # noqa: E402
from kvtranslate.cache import prefill_kv  # noqa: E402
from kvtranslate.cli import print_table  # noqa: E402
from kvtranslate.corpus import QAItem, asked_fact, make_dataset  # noqa: E402
from kvtranslate.evaluate import extractive_f1  # noqa: E402
from kvtranslate.models import ModelPair  # noqa: E402
from kvtranslate.pipeline import collate, encode_pair_items, long_items, position_limit, translate_batch  # noqa: E402
from kvtranslate.scoring import f1_em  # noqa: E402
from kvtranslate.train import train_translator  # noqa: E402

DEFAULT_OUT = os.path.join(RESULTS, "longcontext_probe.jsonl")
POSITION_BUCKETS = (0, 48, 96, 144)  # lower edges, target tokens from the passage's start


def fact_position(item: QAItem, tokenizer: Any) -> int:
    """Target tokens before the sentence stating the asked fact (sentences are '. '-separated, in fact order)."""
    sentences = item.passage.strip().split(". ")
    before = " " + " ".join(sentences[: item.facts.index(asked_fact(item))])
    return len(tokenizer(before, add_special_tokens=False)["input_ids"]) if before.strip() else 0


def bucket(position: int) -> str:
    lower = max(b for b in POSITION_BUCKETS if b <= position)
    upper = [b for b in POSITION_BUCKETS if b > lower]
    return f"{lower}-{upper[0] - 1}" if upper else f">={lower}"


def per_item_f1(data: list, mode: str, pair: ModelPair, translator: Any = None) -> list[float]:
    predictions = extractive_f1(data, mode, pair, translator)[2]
    return [f1_em(p, e["gold"])[0] for p, e in zip(predictions, data)]


@torch.no_grad()
def kv_error_by_position(data: list, pair: ModelPair, translator: Any, batch: int = 32) -> dict[str, float]:
    """Relative error of the translated pre-RoPE K/V, sum over layers of |pred - native|^2 / |native|^2, per bucket
    of the token's own position in the passage: whether translation itself degrades beyond trained positions."""
    err: dict[str, list[float]] = {}
    for i in range(0, len(data), batch):
        b = collate(pair, data[i : i + batch])
        pred, _ = translate_batch(translator, pair, b)
        native = prefill_kv(pair.target, b["tgt_ids"], b["tgt_mask"])
        num = sum((torch.cat(p, 1) - torch.cat(n, 1)).pow(2).sum((1, 3)) for p, n in zip(pred, native))
        den = sum(torch.cat(n, 1).pow(2).sum((1, 3)) for n in native)
        rel, mask = num / den.clamp(min=1e-9), b["tgt_mask"].bool()
        for row in range(rel.shape[0]):
            values = rel[row][mask[row]].tolist()
            for position, value in enumerate(values):
                err.setdefault(bucket(position), []).append(value)
    return {k: sum(v) / len(v) for k, v in err.items()}


def scored_sets(pair: ModelPair, n: int, n_long: int, seed: int = 99) -> dict[str, dict[str, Any]]:
    """Per set: the encoded items, each item's position bucket and the direct F1 per item."""
    tokenizers = [pair.source_tok, pair.target_tok]
    limit = position_limit(pair.target)
    items = dict(
        long_heldout_phrasing=long_items(n_long, seed + 1, tokenizers, limit, 22),
        long_training_phrasing=long_items(n_long, seed + 1, tokenizers, limit, 22, template_split="train"),
        heldout_phrasing=make_dataset(n, seed=seed, split="eval", template_split="eval"),
    )
    sets = {}
    for name, its in items.items():
        data = encode_pair_items(pair, its)
        sets[name] = dict(
            data=data,
            buckets=[bucket(fact_position(i, pair.target_tok)) for i in its],
            direct=per_item_f1(data, "direct", pair),
            tokens=sum(len(e["tgt"]) for e in data) / len(data),
        )
    return sets


def by_bucket(buckets: list[str], values: list[float]) -> dict[str, tuple[float, int]]:
    out = {}
    for b in sorted(set(buckets), key=lambda b: int(b.strip(">=").split("-")[0])):
        picked = [v for v, x in zip(values, buckets) if x == b]
        out[b] = (sum(picked) / len(picked), len(picked))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = study_parser(
        "python -m experiments.translation.kvtranslate_longcontext",
        __doc__,
        "mot:phrase_mix=0.5,mot:phrase_mix=0.5:long_mix=0.25",
        "comma-separated variants as in experiments.translation.kvtranslate_retention",
    )
    parser.add_argument("--seed", type=int, default=0, help="translator seed")
    parser.add_argument("--steps", type=int, default=300, help="translator training steps")
    parser.add_argument("--n", type=int, default=200, help="short held-out-phrasing passages")
    parser.add_argument("--n-long", type=int, default=120, help="long passages per phrasing")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON-lines file the rows are appended to")
    args = parser.parse_args(argv)
    variants, pair = study_setup(parser, args)
    sets = scored_sets(pair, args.n, args.n_long)
    rows = []
    for name, overrides in variants.items():
        t0 = time.time()
        translator, _, cfg = train_translator(
            pair, log=lambda line: None, steps=args.steps, seed=args.seed, **overrides
        )
        row: dict[str, Any] = dict(
            source=args.source,
            target=args.target,
            variant=name,
            seed=args.seed,
            steps=args.steps,
            device=str(pair.device),
        )
        for set_name, s in sets.items():
            translated = per_item_f1(s["data"], "translated", pair, translator)
            direct_f1, f1 = sum(s["direct"]) / len(s["direct"]), sum(translated) / len(translated)
            row[set_name] = dict(
                tokens=round(s["tokens"], 1),
                direct_f1=direct_f1,
                f1=f1,
                retention=f1 / max(direct_f1, 1e-9),
                kv_error_by_token_position=kv_error_by_position(s["data"], pair, translator),
                by_position={
                    b: dict(n=n, direct_f1=d, f1=by_bucket(s["buckets"], translated)[b][0])
                    for b, (d, n) in by_bucket(s["buckets"], s["direct"]).items()
                },
            )
        row["minutes"] = round((time.time() - t0) / 60, 2)
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        rows += [
            [name, set_name, b, v["n"], v["direct_f1"], v["f1"], v["f1"] / max(v["direct_f1"], 1e-9)]
            for set_name in sets
            for b, v in row[set_name]["by_position"].items()
        ]
    print_table(["variant", "set", "fact starts at token", "n", "direct F1", "translated F1", "retention"], rows)


if __name__ == "__main__":
    main()
