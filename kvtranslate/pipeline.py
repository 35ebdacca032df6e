"""The translation pipeline that training and evaluation share: encode a pair's passages, collate a batch,
translate it, and build / save / load the translator.

An encoded item holds both tokenizations of the passage and the alignment of every target token to a source
token (align.py); a batch is left-padded on both sides, with the alignment shifted into the padded source axis.
"""

import json
import os
from typing import Any, TypedDict

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .align import align_tokens, padded_alignment
from .cache import KV, prefill_kv
from .corpus import QAItem, has_same_type_distractor, make_long_dataset
from .models import ModelPair, kv_geometry, source_geometry
from .scoring import pad_left
from .tokenization import encode_item
from .translators import CONFIG_NAME, KVTranslator, position_features, source_features, target_embeddings

# the translator's architecture (train.TRAIN_DEFAULTS adds the training settings)
TRANSLATOR_DEFAULTS: dict[str, Any] = dict(
    kind="mot",
    k_layers=2,
    hidden=256,
    n_experts=4,
    gating="softmax",
    top_k=2,
    latent=256,
    window=8,
    embed_dim=128,
    src_window=1,
    target_input="embeddings",
)

Batch = dict[str, Tensor]  # src_ids, src_mask, tgt_ids, tgt_mask [B, T] and index [B, T_target]


class EncodedItem(TypedDict):
    src: list[int]  # source tokens of the passage
    tgt: list[int]  # target tokens of the passage
    align: list[int]  # per target token, the source token it reads
    question: list[int]  # target tokens
    answer: list[int]  # target tokens, EOS included
    options: list[list[int]]  # target tokens, EOS included
    label: int
    gold: str
    needs_binding: bool


def encode_pair_items(pair: ModelPair, items: list[QAItem]) -> list[EncodedItem]:
    """Tokenise every item for both models and align target context tokens to source context tokens."""
    out = []
    for item in items:
        src_ids, tgt_ids, alignment = align_tokens(pair.source_tok, pair.target_tok, item.passage)
        e = encode_item(pair.target_tok, item)
        if e["context"] != tgt_ids:
            raise ValueError("context tokenisation with offsets differs from plain tokenisation")
        out.append(
            EncodedItem(
                src=src_ids,
                tgt=tgt_ids,
                align=alignment,
                question=e["question"],
                answer=e["answer"],
                options=e["options"],
                label=item.label,
                gold=item.answer.strip(),
                needs_binding=has_same_type_distractor(item),
            )
        )
    return out


def position_limit(model: PreTrainedModel, cap: int = 256) -> int:
    """Tokens a passage with its question and answer may take: the model's positions, at most `cap`."""
    config = model.config
    positions = config.max_position_embeddings if hasattr(config, "max_position_embeddings") else config.n_positions
    return min(positions, cap)


def long_items(
    n: int, seed: int, tokenizers: list[PreTrainedTokenizerBase], limit: int, long_facts: int, **dataset: Any
) -> list[QAItem]:
    """Long passages that fit every model's position limit with room for question and answer; `dataset` goes to
    corpus.make_long_dataset (split, template_split, phrase_mix, min_facts; default held-out names and
    templates)."""
    items, s = [], seed
    while len(items) < n:
        for item in make_long_dataset(4 * n, seed=s, n_facts=long_facts, **{"split": "eval", **dataset}):
            text = item.passage + item.question + item.answer
            if all(len(t(text, add_special_tokens=False)["input_ids"]) + 2 <= limit for t in tokenizers):
                items.append(item)
        s += 1
    return items[:n]


def collate(pair: ModelPair, examples: list[EncodedItem]) -> Batch:
    """Left-padded source and target contexts of a batch on the target's device, with the alignment index."""
    device = pair.device
    src_ids, src_mask = pad_left([e["src"] for e in examples], pair.source_tok.pad_token_id, device)
    tgt_ids, tgt_mask = pad_left([e["tgt"] for e in examples], pair.target_tok.pad_token_id, device)
    index = padded_alignment(
        [e["align"] for e in examples], [len(e["src"]) for e in examples], src_ids.shape[1], tgt_ids.shape[1]
    ).to(device)
    return dict(src_ids=src_ids, src_mask=src_mask, tgt_ids=tgt_ids, tgt_mask=tgt_mask, index=index)


def aligned_features(source_kv: KV, index: Tensor) -> Tensor:
    """Source features [B, T_target, source layers, F] at the source token each target token reads."""
    feats = source_features(source_kv)  # [B, Ts, Ls, F]
    idx = index[:, :, None, None].expand(-1, -1, feats.shape[2], feats.shape[3])
    return feats.gather(1, idx)


def prefill_sources(pair: ModelPair, ids: Tensor, mask: Tensor) -> KV:
    """The pre-RoPE KV of every source model of the pair on the context, their layers one after another (the order
    `source_geometry`'s segments give)."""
    return [layer for model in pair.sources for layer in prefill_kv(model, ids, mask)]


def translate_batch(
    translator: KVTranslator, pair: ModelPair, batch: Batch, source_kv: KV | None = None
) -> tuple[KV, dict[str, Tensor]]:
    """Source KV (prefilled here unless given) -> translated target pre-RoPE KV for the batch's contexts."""
    if source_kv is None:
        with torch.no_grad():
            source_kv = prefill_sources(pair, batch["src_ids"], batch["src_mask"])
    dtype = translator.w_src.dtype  # models in bfloat16 / float16 feed a float32 translator (no copy when equal)
    feats = aligned_features(source_kv, batch["index"]).to(dtype)
    with torch.no_grad():
        if translator.target_input == "positions":  # the target's positions only, no token identity
            emb = position_features(batch["tgt_mask"], translator.config["target_embed_dim"])
        else:
            # the translator builds the window
            emb = target_embeddings(pair.target, batch["tgt_ids"], batch["tgt_mask"])
    return translator(feats, emb.to(dtype), batch["tgt_mask"])


def build_translator(pair: ModelPair, cfg: dict[str, Any]) -> KVTranslator:
    """A translator for the pair, initialised on the CPU (same weights from the same seed on every device) and
    placed on the target's device."""
    target_geometry = kv_geometry(pair.target)
    return KVTranslator(
        source_geometry(pair),
        target_geometry,
        target_geometry["hidden"],
        kind=cfg["kind"],
        k_layers=cfg["k_layers"],
        hidden=cfg["hidden"],
        n_experts=cfg["n_experts"],
        gating=cfg["gating"],
        top_k=cfg["top_k"],
        latent=cfg["latent"],
        window=cfg["window"],
        embed_dim=cfg["embed_dim"],
        src_window=cfg["src_window"],
        target_input=cfg.get("target_input", "embeddings"),
    ).to(pair.device)


def save_translator(translator: KVTranslator, cfg: dict[str, Any], folder: str) -> None:
    """config.json (architecture, and every setting under `training`) and model.safetensors in `folder`."""
    translator.save_pretrained(folder, training={k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()})


# the files older versions wrote: the state dict (torch.save) and the settings
LEGACY_WEIGHTS, LEGACY_CONFIG = "translator.pt", "translator.json"


def load_translator(pair: ModelPair, folder: str) -> tuple[KVTranslator, dict[str, Any]]:
    """A translator saved by `save_translator` (or a translator.pt folder of older versions), in eval mode on the
    target's device, and its settings; a translator made for models of other shapes is refused."""
    if not os.path.isfile(os.path.join(folder, LEGACY_WEIGHTS)) or os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        translator = KVTranslator.from_pretrained(folder, pair.device)
        check_fits(translator, pair, folder)
        return translator, {**TRANSLATOR_DEFAULTS, **translator.training_settings}
    with open(os.path.join(folder, LEGACY_CONFIG)) as f:
        # every setting is saved; folders written before the window option existed read one token
        cfg = {**TRANSLATOR_DEFAULTS, "window": 1, **json.load(f)}
    translator = build_translator(pair, cfg)
    state = torch.load(os.path.join(folder, LEGACY_WEIGHTS), map_location=pair.device, weights_only=True)
    translator.load_state_dict(state)
    return translator.eval(), cfg


def check_fits(translator: KVTranslator, pair: ModelPair, folder: str) -> None:
    """The saved translator reads the pair's source cache and writes the target's (layers, KV heads, head width,
    embedding width), else an error naming the folder and both shapes."""
    keys = ("layers", "kv_heads", "head_dim", "segments")  # segments: several sources' layer counts (else absent)
    saved = translator.config
    for side, geometry in (("source", source_geometry(pair)), ("target", kv_geometry(pair.target))):
        want = {k: geometry[k] for k in keys if k in geometry}
        have = {k: saved[f"{side}_geom"][k] for k in keys if k in saved[f"{side}_geom"]}
        if have != want:
            raise ValueError(f"translator {folder} was made for a {side} cache of {have}, this pair's is {want}")
    if saved["target_embed_dim"] != kv_geometry(pair.target)["hidden"]:
        raise ValueError(
            f"translator {folder} reads target embeddings {saved['target_embed_dim']} wide, this target's are "
            f"{kv_geometry(pair.target)['hidden']}"
        )
