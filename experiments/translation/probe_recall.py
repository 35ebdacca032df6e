"""Can a tiny kvtranslate architecture learn content-based retrieval on this CPU budget? Prints one JSON line.

Binding a value to a name ("The job of Timi is baker. ... What is the job of Timi?") needs attention that
matches content (the asked name) and copies what sits next to the match: an induction-style circuit. This
probe trains a fresh tiny model on the bare version of that task, multi-query associative recall: a sequence
of `--pairs` (key, value, separator) triples over 300 keys and 300 values, then `--queries` queries
(marker, key) -> value, loss on the values only. A control task (copy the token 3 positions back, which needs
attention by position only) shows that the same model and optimiser learn attention quickly when no content
matching is needed. Chance on recall is about 1 / pairs once the model knows which values are in the context.

    python -m experiments.translation.probe_recall --model tiny-qwen2 --steps 3000 --lr 1e-3           # HF init: chance
    python -m experiments.translation.probe_recall --model tiny-qwen2 --steps 3000 --lr 1e-3 --init torch  # learns it
    python -m experiments.translation.probe_recall --model tiny-qwen2 --steps 4000 --lr 1e-3 --init torch --gap 2 \
        --out experiments/results/kvtranslate/probe_recall_tiny-qwen2_torch-init_lr1e-3_gap2.json

--gap, --query-gap and --key-tokens add, one at a time or together, what separates the fact corpus from the
bare task: words between a name and its value, words between the asked name and the answer, multi-token names.
Outputs of every setting that was run: experiments/results/kvtranslate/probe_recall_*.json (the JSON line, written
to --out as well when given; a table of the accuracy curves goes to stderr).
"""

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fl_app.io.files import existing_output, write_own_file  # noqa: E402
from kvtranslate.cli import HelpFormatter, print_table  # noqa: E402
from kvtranslate.models import INITS, TINY_SPECS, build_tiny, forward  # noqa: E402
from kvtranslate.tokenization import train_tokenizer  # noqa: E402

KEYS, VALUES, FILLERS, SEP, MARK = range(100, 400), range(400, 700), range(20, 40), 5, 6


def recall_batch(rng, batch, pairs, queries, gap=0, query_gap=0, key_tokens=1, fixed_query_fillers=False):
    """gap / query_gap: filler tokens between a key and its value / between a query's key and the position that
    predicts the value (random ones, or with fixed_query_fillers always the same, like the first corpus format's
    "?\nA:"); key_tokens: tokens per key. That format had all three (" Timi lives in Marton.",
    "Where does Timi live?\nA:", names of 1-3 tokens); 0, 0, 1 is the bare task. The corpus now ends each
    question on the asked name ("...\nA: Timi"), i.e. query_gap 0."""
    rows, targets = [], []
    for _ in range(batch):
        flat = rng.sample(KEYS, pairs * key_tokens)
        keys = [flat[i * key_tokens : (i + 1) * key_tokens] for i in range(pairs)]
        values = [rng.choice(VALUES) for _ in keys]
        seq = [t for k, v in zip(keys, values) for t in (*k, *rng.choices(FILLERS, k=gap), v, SEP)]
        tgt = [-100] * len(seq)
        for _ in range(queries):
            i = rng.randrange(pairs)
            fillers = FILLERS[:query_gap] if fixed_query_fillers else rng.choices(FILLERS, k=query_gap)
            query = [MARK, *keys[i], *fillers]
            seq += query + [values[i]]
            tgt += [-100] * (len(query) - 1) + [values[i], -100]  # the query's last position predicts the value
        rows.append(seq)
        targets.append(tgt)
    return torch.tensor(rows), torch.tensor(targets)


def copy_batch(gen, batch, length=40, offset=3):
    ids = torch.randint(KEYS.start, VALUES.stop, (batch, length), generator=gen)
    tgt = torch.full_like(ids, -100)
    tgt[:, offset:] = ids[:, :-offset]
    return ids, tgt


def train_probe(model, make_batch, steps, lr, every):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98))
    curve = []
    for step in range(steps):
        ids, tgt = make_batch()
        logits = forward(model, ids, torch.ones_like(ids), use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % every == 0:
            sel = tgt != -100
            acc = (logits.argmax(-1)[sel] == tgt[sel]).float().mean().item()
            curve.append(dict(step=step + 1, loss=round(loss.item(), 3), acc=round(acc, 3)))
    return curve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.translation.probe_recall",
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--model", choices=sorted(TINY_SPECS), default="tiny-qwen2", help="tiny architecture probed")
    parser.add_argument("--steps", type=int, default=1500, help="training steps of the recall task")
    parser.add_argument("--control-steps", type=int, default=300, help="training steps of the copy control")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--pairs", type=int, default=4, help="(key, value) pairs per sequence")
    parser.add_argument("--queries", type=int, default=8, help="queries per sequence")
    parser.add_argument("--gap", type=int, default=0, help="filler tokens between each key and its value")
    parser.add_argument(
        "--query-gap",
        type=int,
        default=0,
        help="filler tokens between a query's key and the position that predicts the value",
    )
    parser.add_argument(
        "--fixed-query-fillers",
        action="store_true",
        help="the query gap is always the same tokens (like the corpus's question ending), not random",
    )
    parser.add_argument("--key-tokens", type=int, default=1, help="tokens per key")
    parser.add_argument("--layers", type=int, default=None, help="override the model's number of layers")
    parser.add_argument(
        "--init",
        choices=INITS,
        default="hf",
        help="hf: HF's N(0, 0.02), tied embeddings (the first checkpoints); torch: PyTorch's scales, untied",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model init and the sequences")
    parser.add_argument("--out", help="also write the JSON line to this file")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's own; the committed probes ran with 1)"
    )
    args = parser.parse_args(argv)
    problem = args.out and existing_output(args.out)
    if problem:
        parser.error(problem)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tokenizer = train_tokenizer(1024)  # ids only; every probe token id must fit the vocabulary
    spec = dict(TINY_SPECS[args.model], vocab=1024, **({"layers": args.layers} if args.layers else {}))
    TINY_SPECS[args.model] = spec
    result = dict(model=args.model, spec=spec, **{k: v for k, v in vars(args).items() if k not in ("model", "out")})
    start = time.time()
    model, _ = build_tiny(args.model, args.seed, tokenizer, init=args.init)
    gen = torch.Generator().manual_seed(args.seed)
    result["control_copy"] = train_probe(
        model, lambda: copy_batch(gen, args.batch), args.control_steps, args.lr, every=100
    )
    model, _ = build_tiny(args.model, args.seed, tokenizer, init=args.init)
    rng = random.Random(args.seed)
    layout = dict(
        gap=args.gap, query_gap=args.query_gap, key_tokens=args.key_tokens, fixed_query_fillers=args.fixed_query_fillers
    )
    result["recall"] = train_probe(
        model, lambda: recall_batch(rng, args.batch, args.pairs, args.queries, **layout), args.steps, args.lr, every=250
    )
    result["minutes"] = round((time.time() - start) / 60, 2)
    print(json.dumps(result))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        write_own_file(args.out, (json.dumps(result) + "\n").encode())
    print_table(
        ["task", "step", "loss", "acc"],
        [[task, p["step"], p["loss"], p["acc"]] for task in ("control_copy", "recall") for p in result[task]],
    )


if __name__ == "__main__":
    main()
