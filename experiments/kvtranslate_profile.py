"""Where translation time goes at GPT-2 -> Qwen2.5-0.5B shapes: torch.profiler over the translate step.

Builds the real-shaped models of bench_translate.py (random weights), translates a context of each length a few
times under torch.profiler (one thread, batch 1) and writes the operator table sorted by self CPU time, plus the
milliseconds per call, to experiments/results/kvtranslate/profile_translate_real.txt (`--out` to change).
`--root` profiles the package of another checkout (the translate step is built from functions both have), e.g. the
tree before the embedding-window projection:

    python experiments/kvtranslate_profile.py --tokens 256 512
    python experiments/kvtranslate_profile.py --root /work/base \
        --out experiments/results/kvtranslate/profile_translate_real_before.txt
"""

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "kvtranslate", "profile_translate_real.txt")


def translate_step(source, source_tok, target, target_tok, translator, text):
    """The translate part of evaluate.time_translate_vs_prefill, from functions every version of the package has."""
    from kvtranslate.align import align_offsets, char_offsets
    from kvtranslate.cache import DynamicCache, extract_kv, inject_kv
    from kvtranslate.models import forward
    from kvtranslate.train import translate_batch

    src_ids, src_off = char_offsets(source_tok, text)
    tgt_ids, tgt_off = char_offsets(target_tok, text)
    s_ids, t_ids = torch.tensor([src_ids]), torch.tensor([tgt_ids])
    s_mask, t_mask = torch.ones_like(s_ids), torch.ones_like(t_ids)
    with torch.no_grad():
        raw = [(layer.keys.clone(), layer.values.clone()) for layer in forward(source, s_ids, s_mask).cache.layers]

    @torch.no_grad()
    def translate():
        index = torch.tensor([align_offsets(src_off, tgt_off)])
        kv_src = extract_kv(source, DynamicCache(ddp_cache_data=raw), s_mask)
        kv, _ = translate_batch(
            translator, source, target, dict(tgt_ids=t_ids, tgt_mask=t_mask, index=index), source_kv=kv_src
        )
        return inject_kv(target, kv, t_mask)

    return translate


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=15, help="operators listed per length")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--root", default=os.path.dirname(HERE), help="checkout whose kvtranslate is profiled")
    args = parser.parse_args(argv)
    sys.path[:0] = [args.root, os.path.join(args.root, "experiments")]
    from bench_translate import passage_with_tokens, real_shaped_models

    from kvtranslate.train import TRAIN_DEFAULTS, build_translator

    torch.set_num_threads(1)
    torch.manual_seed(0)
    (source, source_tok), (target, target_tok) = real_shaped_models()
    translator = build_translator(source, target, TRAIN_DEFAULTS).eval()
    params = sum(p.numel() for p in translator.parameters())
    lines = [
        f"kvtranslate of {os.path.abspath(args.root)}; translator: mot, {params:,} parameters; one thread, "
        f"batch 1, {args.repeats} calls per length"
    ]
    for n in args.tokens:
        text = passage_with_tokens(target_tok, n)
        translate = translate_step(source, source_tok, target, target_tok, translator, text)
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
