"""Shared builders for the kvtranslate tests: very small random models (no checkpoints needed)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM, Qwen2Config, Qwen2ForCausalLM


def small_model(family, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, positions=64, seed=0, eos_id=0, pad_id=1):
    """A random model of `family`; kv_heads applies to Qwen2 (GPT-2 and OPT have one KV head per query head)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    if family == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=positions, **common)
        )
    elif family == "opt":
        model = OPTForCausalLM(
            OPTConfig(
                num_hidden_layers=layers,
                hidden_size=hidden,
                num_attention_heads=heads,
                ffn_dim=2 * hidden,
                word_embed_proj_dim=hidden,
                max_position_embeddings=positions,
                **common,
            )
        )
    else:
        model = Qwen2ForCausalLM(
            Qwen2Config(
                num_hidden_layers=layers,
                hidden_size=hidden,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                intermediate_size=2 * hidden,
                max_position_embeddings=positions,
                **common,
            )
        )
    return model.eval()
