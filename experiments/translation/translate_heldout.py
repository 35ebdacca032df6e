"""Which held-out part costs a translated cache its quality: unseen names or unseen fact/question phrasings.

Evaluates direct reading and a trained translator on 300 passages for each combination of names (training /
held-out) and templates (training / held-out); translators train on training names and templates only, so the
gap between the four rows locates what does not generalise. Prints one JSON line per combination (and a table
on stderr) and writes them all to --out (default experiments/results/kvtranslate/heldout_<source>__<target>.json).

    python -m kvtranslate train --source tiny-gpt2 --target tiny-qwen2 --out /tmp/mot
    python -m experiments.translation.translate_heldout --source tiny-gpt2 --target tiny-qwen2 --translator /tmp/mot
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fl_app.io.files import existing_output, write_own_file  # noqa: E402
from kvtranslate.cli import HelpFormatter, print_table  # noqa: E402
from kvtranslate.corpus import make_dataset  # noqa: E402
from kvtranslate.evaluate import qa_scores  # noqa: E402
from kvtranslate.models import DTYPES, load_pair, set_threads  # noqa: E402
from kvtranslate.pipeline import encode_pair_items, load_translator  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "kvtranslate")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.translation.translate_heldout",
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--source", required=True, help="source model (tiny name, folder or hub id)")
    parser.add_argument("--target", required=True, help="target model (tiny name, folder or hub id)")
    parser.add_argument("--translator", required=True, help="folder written by `python -m kvtranslate train`")
    parser.add_argument("--n", type=int, default=300, help="passages per combination")
    parser.add_argument("--seed", type=int, default=99, help="seed of the evaluation passages")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="dtype the models load in (auto: their own)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own)")
    parser.add_argument(
        "--out", help="JSON file (default: experiments/results/kvtranslate/heldout_SOURCE__TARGET.json)"
    )
    args = parser.parse_args(argv)
    out = args.out or os.path.join(RESULTS, f"heldout_{args.source}__{args.target}.json".replace("/", "_"))
    problem = existing_output(out)
    if problem:
        parser.error(problem)
    set_threads(args.threads)
    pair = load_pair(args.source, args.target, dtype=args.dtype)
    translator = load_translator(pair, args.translator)[0]
    rows = []
    for names in ("train", "eval"):
        for templates in ("train", "eval"):
            items = make_dataset(args.n, seed=args.seed, split=names, template_split=templates)
            data = encode_pair_items(pair, items)
            row = dict(names=names, templates=templates, items=len(data))
            for mode, tr in (("direct", None), ("translated", translator)):
                scores = qa_scores(data, mode, pair, tr)[0]
                row.update({f"{mode}_{k}": scores[k] for k in ("acc", "binding_acc", "f1")})
            row["retention_f1"] = row["translated_f1"] / max(row["direct_f1"], 1e-9)
            print(json.dumps(row), flush=True)
            rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    record = dict(source=args.source, target=args.target, translator=args.translator, seed=args.seed, rows=rows)
    write_own_file(out, json.dumps(record, indent=1).encode())
    keys = ("direct_f1", "translated_acc", "translated_binding_acc", "translated_f1", "retention_f1")
    print_table(["names", "templates", *keys], [[r["names"], r["templates"]] + [r[k] for k in keys] for r in rows])


if __name__ == "__main__":
    main()
