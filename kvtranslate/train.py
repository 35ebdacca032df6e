"""Training a translator for one (source, target) pair on training passages only (split="train").

Each step: both frozen models prefill a batch of contexts (source KV = input, target KV = reconstruction
target), the translator writes the target's pre-RoPE KV, an injection point p is drawn per batch, and the
target replays the context after p plus question and answer on the translated vs native prefix (CCL).
"""

import json
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from .cache import prefill_kv, prefix_kv
from .corpus import make_dataset
from .losses import context_correction_loss, kv_reconstruction_loss
from .models import ModelPair, family_of
from .pipeline import (
    TRANSLATOR_DEFAULTS,
    EncodedItem,
    build_translator,
    collate,
    encode_pair_items,
    long_items,
    position_limit,
    translate_batch,
)
from .routing import BALANCES, gate_diagnostics
from .translators import KVTranslator

TRAIN_DEFAULTS: dict[str, Any] = dict(
    **TRANSLATOR_DEFAULTS,
    steps=1500,
    batch=16,
    lr=2e-3,
    w_rec=1.0,
    w_key=1.0,
    w_ccl=1.0,
    w_hidden=1.0,
    w_kl=1.0,
    w_balance=0.01,
    balance="switch",
    ccl_start=0.5,
    injection_points=(0.25, 0.5, 0.75, 1.0),
    n_train=3000,
    phrase_mix=0.0,
    long_mix=0.0,
    long_batch=4,
    long_facts=22,
    seed=0,
)


def training_loss(
    translator: KVTranslator, pair: ModelPair, examples: list[EncodedItem], cfg: dict[str, Any], frac: float
) -> tuple[Tensor, dict[str, float]]:
    """KV reconstruction + load balancing + CCL at injection point `frac` for one batch of examples."""
    batch = collate(pair, examples)
    with torch.no_grad():
        native_kv = prefill_kv(pair.target, batch["tgt_ids"], batch["tgt_mask"])
    pred_kv, aux = translate_batch(translator, pair, batch)
    rec = kv_reconstruction_loss(pred_kv, native_kv, batch["tgt_mask"], translator.out_std, cfg["w_key"])
    loss = cfg["w_rec"] * rec + cfg["w_balance"] * aux["balance"]
    parts = {"rec": rec.item(), "balance": aux["balance"].item()}
    if "gates" in aux:  # routing diagnostics of the mixture kinds (routing.py), usage per expert
        diag = gate_diagnostics(aux["gates"], batch["tgt_mask"])
        usage = diag.pop("expert_usage")
        parts.update(diag, **{f"usage_{m}": u for m, u in enumerate(usage)})
    if cfg["w_ccl"] > 0:
        lengths = [max(1, round(frac * len(e["tgt"]))) for e in examples]
        pred_prefix, cache_mask = prefix_kv(pred_kv, batch["tgt_mask"], lengths)
        native_prefix, _ = prefix_kv(native_kv, batch["tgt_mask"], lengths)
        tails = [e["tgt"][n:] + e["question"] + e["answer"] for e, n in zip(examples, lengths)]
        ccl, ccl_parts = context_correction_loss(
            pair.target,
            pred_prefix,
            native_prefix,
            cache_mask,
            tails,
            pair.target_tok.pad_token_id,
            cfg["w_hidden"],
            cfg["w_kl"],
        )
        loss = loss + cfg["w_ccl"] * ccl
        parts.update(ccl=ccl.item(), hidden=ccl_parts["hidden"].item(), kl=ccl_parts["kl"].item())
    return loss, parts


def long_training_data(pair: ModelPair, cfg: dict[str, Any]) -> list[EncodedItem]:
    """Long training passages: training names and templates (varied phrasings at phrase_mix too), 7 to long_facts
    facts, up to the target's position limit; as many as the short ones that long_mix of the steps would read."""
    n = max(cfg["long_batch"], round(cfg["n_train"] * cfg["long_mix"] * cfg["long_batch"] / cfg["batch"]))
    tokenizers = [pair.source_tok, pair.target_tok]
    items = long_items(
        n,
        cfg["seed"] + 2000,
        tokenizers,
        position_limit(pair.target),
        cfg["long_facts"],
        split="train",
        phrase_mix=cfg["phrase_mix"],
        min_facts=7,
    )
    return encode_pair_items(pair, items)


def train_translator(
    pair: ModelPair, log: Callable[[str], Any] = print, **overrides: Any
) -> tuple[KVTranslator, list[dict[str, float]], dict[str, Any]]:
    """A translator trained on training names and templates; returns it (eval mode), the loss history every 50
    steps and the settings used (TRAIN_DEFAULTS with `overrides`)."""
    cfg = {**TRAIN_DEFAULTS, **overrides}
    for model in (*pair.sources, pair.target):
        family_of(model)  # raises for an unsupported family
    if cfg["batch"] < 1 or cfg["steps"] < 1:
        raise ValueError(f"batch and steps must be >= 1, got batch={cfg['batch']} steps={cfg['steps']}")
    if cfg["n_train"] < cfg["batch"]:
        raise ValueError(f"n_train must be >= batch ({cfg['batch']}), got {cfg['n_train']}")
    if not 0.0 <= cfg["long_mix"] <= 1.0 or cfg["long_batch"] < 1 or cfg["long_facts"] < 7:
        raise ValueError(
            f"long_mix must be in [0, 1], long_batch >= 1 and long_facts >= 7, got long_mix={cfg['long_mix']} "
            f"long_batch={cfg['long_batch']} long_facts={cfg['long_facts']}"
        )
    if cfg["balance"] not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {cfg['balance']!r}")
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    items = make_dataset(cfg["n_train"], seed=cfg["seed"] + 1000, split="train", phrase_mix=cfg["phrase_mix"])
    data = encode_pair_items(pair, items)
    long_data = long_training_data(pair, cfg) if cfg["long_mix"] > 0 else []
    translator = build_translator(pair, cfg)
    translator.balance_term = cfg["balance"]
    for p in [p for model in (*pair.sources, pair.target) for p in model.parameters()]:
        p.requires_grad_(False)
    # output statistics from a few batches of native target KV
    stats_kv, stats_mask = [], []
    for i in range(0, min(256, len(data)), 64):
        b = collate(pair, data[i : i + 64])
        with torch.no_grad():
            stats_kv.append(prefill_kv(pair.target, b["tgt_ids"], b["tgt_mask"]))
        stats_mask.append(b["tgt_mask"])
    translator.fit_output_stats(stats_kv, stats_mask)
    opt = torch.optim.AdamW(translator.parameters(), lr=cfg["lr"], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / cfg["steps"]))
    history, start = [], time.time()
    bar = tqdm(range(cfg["steps"]), desc=f"train {cfg['kind']}", mininterval=5)
    for step in bar:
        # a share long_mix of the steps reads long passages (fewer per batch: about as many tokens); no draw at 0
        if long_data and rng.random() < cfg["long_mix"]:
            examples = rng.sample(long_data, cfg["long_batch"])
        else:
            examples = rng.sample(data, cfg["batch"])
        frac = rng.choice(cfg["injection_points"])
        # CCL joins once reconstruction has converged: from scratch its gradients swamp the KV term
        step_cfg = cfg if step >= cfg["ccl_start"] * cfg["steps"] else {**cfg, "w_ccl": 0.0}
        loss, parts = training_loss(translator, pair, examples, step_cfg, frac)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(translator.parameters(), 1.0)
        opt.step()
        sched.step()
        parts["loss"] = loss.item()
        bar.set_postfix({k: f"{v:.3f}" for k, v in parts.items()}, refresh=False)
        if step % 50 == 0 or step + 1 == cfg["steps"]:
            history.append(
                dict(step=step, seconds=round(time.time() - start, 1), **{k: round(v, 5) for k, v in parts.items()})
            )
    translator.eval()
    log(
        json.dumps(
            dict(
                event="trained",
                kind=cfg["kind"],
                w_ccl=cfg["w_ccl"],
                steps=cfg["steps"],
                seconds=round(time.time() - start, 1),
                first=history[0],
                last=history[-1],
            )
        )
    )
    return translator, history, cfg
