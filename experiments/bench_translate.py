"""Translate vs prefill latency for contexts of 128-1024 tokens; prints one JSON line.

Models: the tiny-gpt2 (source) and tiny-qwen2 (target) architectures of kvtranslate with 2,048 positions and
random weights (latency does not depend on the weights), their own byte-level BPE tokenizers (512 / 1024
entries), and a MoT translator with the demo's settings (4 experts, hidden 128, k=2). Batch 1, one thread.
translate_ms counts token alignment, RoPE handling, the translator and building the target cache from an
already-computed source cache; prefill_ms is the target's forward over the same context.
"""
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvtranslate.corpus import make_item  # noqa: E402
from kvtranslate.evaluate import time_translate_vs_prefill  # noqa: E402
from kvtranslate.models import build_tiny  # noqa: E402
from kvtranslate.train import TRAIN_DEFAULTS, build_translator  # noqa: E402


def passage_with_tokens(tokenizer, n_tokens, seed=0):
    rng, text = random.Random(seed), ""
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < n_tokens:
        text += make_item(rng, 8).passage
    ids = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return text[:ids["offset_mapping"][n_tokens - 1][1]]


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    source, source_tok = build_tiny("tiny-gpt2", positions=2048)
    target, target_tok = build_tiny("tiny-qwen2", positions=2048)
    translator = build_translator(source, target, TRAIN_DEFAULTS).eval()
    result = dict(tokens=[], translate_ms=[], prefill_ms=[], source="tiny-gpt2 arch (2048 positions)",
                  target="tiny-qwen2 arch (2048 positions)", translator="mot, 4 experts", threads=1)
    for n in (128, 256, 512, 1024):
        text = passage_with_tokens(target_tok, n)
        t = time_translate_vs_prefill(source, source_tok, target, target_tok, translator, text, repeats=10)
        result["tokens"].append(t["tokens"])
        result["translate_ms"].append(round(t["translate_ms"], 2))
        result["prefill_ms"].append(round(t["prefill_ms"], 2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
