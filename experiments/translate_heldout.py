"""Which held-out part costs a translated cache its quality: unseen names or unseen fact/question phrasings.

Evaluates direct reading and a trained translator on 300 passages for each combination of names (training /
held-out) and templates (training / held-out); translators train on training names and templates only, so the
gap between the four rows locates what does not generalise. Prints one JSON line per combination and writes
them all to experiments/results/kvtranslate/heldout_<source>__<target>.json.

    python -m kvtranslate train --source tiny-gpt2 --target tiny-qwen2 --out /tmp/mot
    python experiments/translate_heldout.py --source tiny-gpt2 --target tiny-qwen2 --translator /tmp/mot
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvtranslate.corpus import make_dataset  # noqa: E402
from kvtranslate.evaluate import qa_scores  # noqa: E402
from kvtranslate.models import load_model  # noqa: E402
from kvtranslate.train import encode_pair_items, load_translator  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kvtranslate")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--translator", required=True, help="folder written by `python -m kvtranslate train`")
    parser.add_argument("--n", type=int, default=300, help="passages per combination")
    parser.add_argument("--seed", type=int, default=99)
    args = parser.parse_args()
    torch.set_num_threads(1)
    source, source_tok = load_model(args.source)
    target, target_tok = load_model(args.target)
    translator = load_translator(source, target, args.translator)[0]
    models = (source, source_tok, target, target_tok)
    rows = []
    for names in ("train", "eval"):
        for templates in ("train", "eval"):
            items = make_dataset(args.n, seed=args.seed, split=names, template_split=templates)
            data = encode_pair_items(source_tok, target_tok, items)
            row = dict(names=names, templates=templates, items=len(data))
            for mode, tr in (("direct", None), ("translated", translator)):
                scores = qa_scores(data, mode, *models, tr)[0]
                row.update({f"{mode}_{k}": scores[k] for k in ("acc", "binding_acc", "f1")})
            row["retention_f1"] = row["translated_f1"] / max(row["direct_f1"], 1e-9)
            print(json.dumps(row), flush=True)
            rows.append(row)
    os.makedirs(RESULTS, exist_ok=True)
    out = os.path.join(RESULTS, f"heldout_{args.source}__{args.target}.json".replace("/", "_"))
    with open(out, "w") as f:
        json.dump(
            dict(source=args.source, target=args.target, translator=args.translator, seed=args.seed, rows=rows),
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
