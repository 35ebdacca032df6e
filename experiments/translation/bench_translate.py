"""Translate vs prefill latency for contexts of 128-1024 tokens; prints one JSON line.

`--shapes tiny` (default): the tiny-gpt2 (source) and tiny-qwen2 (target) architectures of kvtranslate with
2,048 positions. `--shapes real`: the architectures of GPT-2 (124M, 12 layers x 768) and Qwen2.5-0.5B
(24 layers x 896, 14 query / 2 KV heads, RoPE, 151,936-entry vocabulary), built from their published config
values (GPT-2 with 2,048 learned positions so that 1,024-token contexts fit its finer tokenizer),
since no hub is reachable here. Weights are random in both cases (latency does not depend on them);
texts are tokenised with the tiny models' own byte-level BPE tokenizers (the ids fit every vocabulary), so the
alignment work is real. Translator: MoT with the demo's settings (4 experts, hidden 256, k=2, window 8). Batch 1,
torch's own thread count unless --threads (the committed results: --threads 1). translate_ms counts token
alignment, RoPE handling, the translator and building the target cache from an already-computed source cache;
prefill_ms is the target's forward over the same context (last-position logits only). The two are timed in
alternation and medians are reported, so a load that comes and goes on a shared machine falls on both alike. FLOPs
per token are counted by torch's FlopCounterMode (matrix products and attention) over one translation and one
prefill of each length. Writes the JSON line to
experiments/results/kvtranslate/bench_translate_<shapes>[_<device>].json as well (--out to change), and a
table on stderr.

    python -m experiments.translation.bench_translate --threads 1    # tiny shapes
    python -m experiments.translation.bench_translate --shapes real --tokens 128,256,512,1024 --threads 1
"""

import argparse
import json
import os
import random
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from fl_app.io.files import existing_output, write_own_file  # noqa: E402
from kvtranslate.cli import HelpFormatter, int_list, print_table  # noqa: E402
from kvtranslate.corpus import make_item  # noqa: E402
from kvtranslate.evaluate import time_translate_vs_prefill, translate_and_prefill  # noqa: E402
from kvtranslate.models import ModelPair, build_tiny, pick_device, set_threads  # noqa: E402
from kvtranslate.pipeline import TRANSLATOR_DEFAULTS, build_translator  # noqa: E402
from kvtranslate.tokenization import train_tokenizer  # noqa: E402


def passage_with_tokens(tokenizer, n_tokens, seed=0):
    rng, text = random.Random(seed), ""
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < n_tokens:
        text += make_item(rng, 8).passage
    ids = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return text[: ids["offset_mapping"][n_tokens - 1][1]]


def real_shaped_models():
    """GPT-2 (124M) and Qwen2.5-0.5B architectures from their published config values, random weights."""
    source_tok, target_tok = train_tokenizer(512), train_tokenizer(1024)
    source = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=2048, vocab_size=50257))
    target = Qwen2ForCausalLM(
        Qwen2Config(
            num_hidden_layers=24,
            hidden_size=896,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        )
    )
    return (source.eval(), source_tok), (target.eval(), target_tok)


RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "kvtranslate")


def flops_per_token(fn, tokens):
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops() / tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.translation.bench_translate",
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--shapes",
        choices=("tiny", "real"),
        default="tiny",
        help="tiny: the demo's tiny architectures; real: GPT-2 (124M) -> Qwen2.5-0.5B architectures",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed repeats per length, median reported (default 10 tiny, 5 real)"
    )
    parser.add_argument(
        "--tokens",
        type=int_list,
        default="128,256,512,1024",
        help="comma-separated context lengths in tokens",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or auto (CUDA when present)")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's own; the committed results: 1)"
    )
    parser.add_argument("--out", default=None, help="JSON file (default: in experiments/results/kvtranslate)")
    args = parser.parse_args(argv)
    try:
        set_threads(args.threads)
        device = pick_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    suffix = "" if device.type == "cpu" else f"_{device.type}"
    out = args.out or os.path.join(RESULTS, f"bench_translate_{args.shapes}{suffix}.json")
    problem = existing_output(out)
    if problem:
        parser.error(problem)
    torch.manual_seed(0)
    if args.shapes == "tiny":
        (source, source_tok), (target, target_tok) = (
            build_tiny("tiny-gpt2", positions=2048),
            build_tiny("tiny-qwen2", positions=2048),
        )
        names = ("tiny-gpt2 arch (2048 positions)", "tiny-qwen2 arch (2048 positions)")
    else:
        (source, source_tok), (target, target_tok) = real_shaped_models()
        names = ("gpt2 arch (124M, random weights)", "Qwen2.5-0.5B arch (random weights)")
    repeats = args.repeats or (10 if args.shapes == "tiny" else 5)
    pair = ModelPair(source.to(device), source_tok, target.to(device), target_tok)
    translator = build_translator(pair, TRANSLATOR_DEFAULTS).eval()
    params = lambda m: sum(p.numel() for p in m.parameters())
    embedding = target.get_input_embeddings().weight.numel()
    result = dict(
        shapes=args.shapes,
        tokens=[],
        translate_ms=[],
        prefill_ms=[],
        ratio=[],
        source=names[0],
        target=names[1],
        translator="mot, 4 experts",
        translator_params=params(translator),
        target_params=params(target),
        target_params_without_embeddings=params(target) - embedding,
        translator_flops_per_token=[],
        target_flops_per_token=[],
        device=str(device),
        threads=torch.get_num_threads(),
        repeats=repeats,
    )
    for n in args.tokens:
        text = passage_with_tokens(target_tok, n)
        t = time_translate_vs_prefill(pair, translator, text, repeats)
        translate, prefill = translate_and_prefill(pair, translator, text)
        result["tokens"].append(t["tokens"])
        result["translate_ms"].append(round(t["translate_ms"], 2))
        result["prefill_ms"].append(round(t["prefill_ms"], 2))
        result["ratio"].append(round(t["translate_ms"] / t["prefill_ms"], 3))
        result["translator_flops_per_token"].append(round(flops_per_token(translate, t["tokens"])))
        result["target_flops_per_token"].append(round(flops_per_token(prefill, t["tokens"])))
    print(json.dumps(result))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_own_file(out, json.dumps(result, indent=1).encode())
    columns = ("tokens", "translate_ms", "prefill_ms", "ratio", "translator_flops_per_token", "target_flops_per_token")
    print_table(columns, list(zip(*(result[c] for c in columns))))


if __name__ == "__main__":
    main()
