"""kvtranslate on CUDA gives the CPU's numbers: train a MoT translator and evaluate one pair on both, compare.

Trains tiny-gpt2 -> tiny-qwen2 (cross-family, cross-tokenizer, the MoT translator with its balance loss and the
correction loss) for --steps steps from the same seed on CUDA and on the CPU, evaluates both on --n-eval held-out
passages, and prints one JSON line with both sets of numbers, their differences and `ok` (every difference within
its tolerance: float32 sums run in a different order on the GPU, so the two runs drift apart a little over 100
steps). Exit status 1 when a difference is out of tolerance.

Without CUDA the CUDA part is skipped (said in the JSON line) and the CPU part still runs, at a tiny size unless
--steps / --n-eval are given.

    python experiments/translation/gpu_check_kvtranslate.py     # GPU machine: 100 steps, 100 passages
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kvtranslate.corpus import make_dataset  # noqa: E402
from kvtranslate.evaluate import qa_scores  # noqa: E402
from kvtranslate.models import load_pair, set_threads  # noqa: E402
from kvtranslate.pipeline import encode_pair_items  # noqa: E402
from kvtranslate.train import train_translator  # noqa: E402

# largest allowed |cuda - cpu| per number (accuracy and F1 on 100 passages move in steps of 0.01)
TOLERANCE = dict(last_loss_rel=0.15, acc=0.05, f1=0.05, direct_acc=0.02)


def run(device, steps, n_eval, source_name, target_name):
    t0 = time.time()
    pair = load_pair(source_name, target_name, device)
    translator, history, _ = train_translator(
        pair, log=lambda line: None, steps=steps, seed=0, n_train=max(64, 16 * steps)
    )
    data = encode_pair_items(pair, make_dataset(n_eval, seed=7, split="eval"))
    translated = qa_scores(data, "translated", pair, translator)[0]
    direct = qa_scores(data, "direct", pair)[0]
    return dict(
        device=str(device),
        steps=steps,
        n_eval=n_eval,
        last_loss=history[-1]["loss"],
        last_rec=history[-1]["rec"],
        acc=translated["acc"],
        f1=translated["f1"],
        direct_acc=direct["acc"],
        seconds=round(time.time() - t0, 1),
    )


def compare(cuda, cpu):
    diffs = dict(
        last_loss_rel=abs(cuda["last_loss"] - cpu["last_loss"]) / max(abs(cpu["last_loss"]), 1e-9),
        acc=abs(cuda["acc"] - cpu["acc"]),
        f1=abs(cuda["f1"] - cpu["f1"]),
        direct_acc=abs(cuda["direct_acc"] - cpu["direct_acc"]),
    )
    return diffs, all(diffs[k] <= TOLERANCE[k] + 1e-9 for k in diffs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, help="translator steps (default 100 with CUDA, 5 without)")
    parser.add_argument("--n-eval", type=int, help="held-out passages (default 100 with CUDA, 16 without)")
    parser.add_argument("--source", default="tiny-gpt2")
    parser.add_argument("--target", default="tiny-qwen2")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    has_cuda = torch.cuda.is_available()
    steps = args.steps or (100 if has_cuda else 5)
    n_eval = args.n_eval or (100 if has_cuda else 16)
    cpu = run(torch.device("cpu"), steps, n_eval, args.source, args.target)
    if not has_cuda:
        print(
            json.dumps(
                dict(check="kvtranslate", cuda="skipped: CUDA is not available on this machine", cpu=cpu, ok=None)
            )
        )
        return 0
    cuda = run(torch.device("cuda"), steps, n_eval, args.source, args.target)
    diffs, ok = compare(cuda, cpu)
    print(
        json.dumps(
            dict(
                check="kvtranslate",
                gpu=torch.cuda.get_device_name(0),
                cuda=cuda,
                cpu=cpu,
                differences=diffs,
                tolerance=TOLERANCE,
                ok=ok,
            )
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
