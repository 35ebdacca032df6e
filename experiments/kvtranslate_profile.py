"""Where translation time goes at GPT-2 -> Qwen2.5-0.5B shapes: torch.profiler over the translate step.

Builds the real-shaped models of bench_translate.py (random weights), translates a context of each length a few
times under torch.profiler (one thread, batch 1) and writes the operator table sorted by self CPU time, plus the
milliseconds per call, to experiments/results/kvtranslate/profile_translate_real.txt (`--out` to change).

    python experiments/kvtranslate_profile.py --tokens 256 512
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_translate import passage_with_tokens, real_shaped_models, translate_and_prefill  # noqa: E402
from kvtranslate.train import TRAIN_DEFAULTS, build_translator  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "kvtranslate", "profile_translate_real.txt")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=15, help="operators listed per length")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    (source, source_tok), (target, target_tok) = real_shaped_models()
    translator = build_translator(source, target, TRAIN_DEFAULTS).eval()
    params = sum(p.numel() for p in translator.parameters())
    lines = [f"translator: mot, {params:,} parameters; one thread, batch 1, {args.repeats} calls per length"]
    for n in args.tokens:
        text = passage_with_tokens(target_tok, n)
        translate, _ = translate_and_prefill(source, source_tok, target, target_tok, translator, text)
        translate()  # warm-up
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                translate()
            ms = (time.perf_counter() - t0) * 1000 / args.repeats
        lines.append(f"\n== {n} tokens: {ms:.0f} ms per translation ==")
        lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
