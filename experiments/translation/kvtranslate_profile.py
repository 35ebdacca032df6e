"""Where translation time goes at GPT-2 -> Qwen2.5-0.5B shapes: torch.profiler over the translate step.

Builds the real-shaped models of bench_translate.py (random weights), translates a context of each length a few
times under torch.profiler (batch 1; torch's own thread count unless --threads, the committed tables: 1) and
writes the operator table sorted by self CPU time, plus the milliseconds per call, to
experiments/results/kvtranslate/profile_translate_real.txt (`--out` to change).
`--root` profiles the package of another checkout (checkouts from before `kvtranslate.pipeline` existed keep
these functions in `kvtranslate.train` and take the four models one by one), e.g. the tree before the
embedding-window projection:

    python -m experiments.translation.kvtranslate_profile --tokens 256,512 --threads 1
    python -m experiments.translation.kvtranslate_profile --root ../OLD_CHECKOUT --threads 1 \
        --out experiments/results/kvtranslate/profile_translate_real_before.txt
"""

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO, "experiments", "results", "kvtranslate", "profile_translate_real.txt")


def has_pipeline() -> bool:
    """Whether the imported kvtranslate has the pipeline module (and the ModelPair API)."""
    return importlib.util.find_spec("kvtranslate.pipeline") is not None


def make_translator(source: Any, source_tok: Any, target: Any, target_tok: Any) -> Any:
    """The demo's MoT translator for the pair, with either version's API."""
    if has_pipeline():
        from kvtranslate.models import ModelPair
        from kvtranslate.pipeline import TRANSLATOR_DEFAULTS, build_translator

        return build_translator(ModelPair(source, source_tok, target, target_tok), TRANSLATOR_DEFAULTS).eval()
    from kvtranslate.train import TRAIN_DEFAULTS, build_translator

    return build_translator(source, target, TRAIN_DEFAULTS).eval()


def translate_step(
    source: Any, source_tok: Any, target: Any, target_tok: Any, translator: Any, text: str
) -> Callable[[], Any]:
    """The translate part of evaluate.time_translate_vs_prefill, with either version's API."""
    from kvtranslate.align import align_offsets, char_offsets
    from kvtranslate.cache import DynamicCache, extract_kv, inject_kv
    from kvtranslate.models import forward

    if has_pipeline():
        from kvtranslate.models import ModelPair
        from kvtranslate.pipeline import translate_batch

        pair = ModelPair(source, source_tok, target, target_tok)

        def translate_kv(batch: dict[str, Any], source_kv: Any) -> Any:
            return translate_batch(translator, pair, batch, source_kv=source_kv)

    else:
        from kvtranslate.train import translate_batch

        def translate_kv(batch: dict[str, Any], source_kv: Any) -> Any:
            return translate_batch(translator, source, target, batch, source_kv=source_kv)

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
        kv, _ = translate_kv(dict(tgt_ids=t_ids, tgt_mask=t_mask, index=index), kv_src)
        return inject_kv(target, kv, t_mask)

    return translate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.translation.kvtranslate_profile",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # kvtranslate loads from --root, after parsing
    )
    parser.add_argument(
        "--tokens",
        type=lambda text: [int(t) for t in text.split(",") if t.strip()],
        default="256,512",
        help="comma-separated context lengths in tokens",
    )
    parser.add_argument("--repeats", type=int, default=3, help="profiled translations per length")
    parser.add_argument("--rows", type=int, default=15, help="operators listed per length")
    parser.add_argument("--out", default=DEFAULT_OUT, help="text file for the operator tables")
    parser.add_argument("--root", default=REPO, help="checkout whose kvtranslate is profiled")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own)")
    args = parser.parse_args(argv)
    # bench_translate of --root: in experiments/translation/, or in experiments/ in a checkout from before that folder
    sys.path[:0] = [
        args.root,
        os.path.join(args.root, "experiments", "translation"),
        os.path.join(args.root, "experiments"),
    ]
    from bench_translate import passage_with_tokens, real_shaped_models

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    (source, source_tok), (target, target_tok) = real_shaped_models()
    translator = make_translator(source, source_tok, target, target_tok)
    params = sum(p.numel() for p in translator.parameters())
    lines = [
        # the checkout relative to this one: the table names no machine's paths
        f"kvtranslate of {os.path.relpath(args.root, REPO)}; translator: mot, {params:,} "
        f"parameters; {torch.get_num_threads()} thread(s), batch 1, {args.repeats} calls per length"
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
