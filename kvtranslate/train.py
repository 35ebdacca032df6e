"""Training a translator for one (source, target) pair on training passages only (split="train").

Each step: both frozen models prefill a batch of contexts (source KV = input, target KV = reconstruction
target), the translator writes the target's pre-RoPE KV, an injection point p is drawn per batch, and the
target replays the context after p plus question and answer on the translated vs native prefix (CCL).
"""

import json
import os
import random
import time

import torch
from tqdm import tqdm

from .align import align_offsets, char_offsets, padded_alignment
from .cache import prefill_kv, prefix_kv
from .corpus import has_same_type_distractor, make_dataset
from .losses import context_correction_loss, kv_reconstruction_loss
from .models import family_of, kv_geometry
from .scoring import pad_left
from .tokenization import encode_item
from .translators import KVTranslator, source_features, target_embeddings

TRAIN_DEFAULTS = dict(
    kind="mot",
    steps=1500,
    batch=16,
    lr=2e-3,
    k_layers=2,
    hidden=256,
    n_experts=4,
    gating="softmax",
    top_k=2,
    latent=256,
    window=8,
    embed_dim=128,
    w_rec=1.0,
    w_ccl=1.0,
    w_hidden=1.0,
    w_kl=1.0,
    w_balance=0.01,
    ccl_start=0.5,
    injection_points=(0.25, 0.5, 0.75, 1.0),
    n_train=3000,
    phrase_mix=0.0,
    seed=0,
)


def encode_pair_items(source_tok, target_tok, items):
    """Tokenise every item for both models and align target context tokens to source context tokens."""
    out = []
    for item in items:
        src_ids, src_off = char_offsets(source_tok, item.passage)
        tgt_ids, tgt_off = char_offsets(target_tok, item.passage)
        e = encode_item(target_tok, item)
        if e["context"] != tgt_ids:
            raise ValueError("context tokenisation with offsets differs from plain tokenisation")
        out.append(
            dict(
                src=src_ids,
                tgt=tgt_ids,
                align=align_offsets(src_off, tgt_off),
                question=e["question"],
                answer=e["answer"],
                options=e["options"],
                label=item.label,
                gold=item.answer.strip(),
                needs_binding=has_same_type_distractor(item),
            )
        )
    return out


def collate(examples, source_tok, target_tok, device=None):
    src_ids, src_mask = pad_left([e["src"] for e in examples], source_tok.pad_token_id, device)
    tgt_ids, tgt_mask = pad_left([e["tgt"] for e in examples], target_tok.pad_token_id, device)
    index = padded_alignment(
        [e["align"] for e in examples], [len(e["src"]) for e in examples], src_ids.shape[1], tgt_ids.shape[1]
    ).to(device)
    return dict(src_ids=src_ids, src_mask=src_mask, tgt_ids=tgt_ids, tgt_mask=tgt_mask, index=index)


def aligned_features(source_kv, index):
    feats = source_features(source_kv)  # [B, Ts, Ls, F]
    idx = index[:, :, None, None].expand(-1, -1, feats.shape[2], feats.shape[3])
    return feats.gather(1, idx)


def translate_batch(translator, source, target, batch, source_kv=None):
    """Source KV (prefilled here unless given) -> translated target pre-RoPE KV for the batch's contexts."""
    if source_kv is None:
        with torch.no_grad():
            source_kv = prefill_kv(source, batch["src_ids"], batch["src_mask"])
    feats = aligned_features(source_kv, batch["index"])
    with torch.no_grad():
        emb = target_embeddings(target, batch["tgt_ids"], batch["tgt_mask"])  # the translator builds the window
    return translator(feats, emb, batch["tgt_mask"])


def training_loss(translator, source, source_tok, target, target_tok, examples, cfg, frac):
    """KV reconstruction + load balancing + CCL at injection point `frac` for one batch of examples."""
    batch = collate(examples, source_tok, target_tok, target.device)
    with torch.no_grad():
        native_kv = prefill_kv(target, batch["tgt_ids"], batch["tgt_mask"])
    pred_kv, aux = translate_batch(translator, source, target, batch)
    rec = kv_reconstruction_loss(pred_kv, native_kv, batch["tgt_mask"], translator.out_std)
    loss = cfg["w_rec"] * rec + cfg["w_balance"] * aux["balance"]
    parts = {"rec": rec.item(), "balance": aux["balance"].item()}
    if cfg["w_ccl"] > 0:
        lengths = [max(1, round(frac * len(e["tgt"]))) for e in examples]
        pred_prefix, cache_mask = prefix_kv(pred_kv, batch["tgt_mask"], lengths)
        native_prefix, _ = prefix_kv(native_kv, batch["tgt_mask"], lengths)
        tails = [e["tgt"][n:] + e["question"] + e["answer"] for e, n in zip(examples, lengths)]
        ccl, ccl_parts = context_correction_loss(
            target, pred_prefix, native_prefix, cache_mask, tails, target_tok.pad_token_id, cfg["w_hidden"], cfg["w_kl"]
        )
        loss = loss + cfg["w_ccl"] * ccl
        parts.update(ccl=ccl.item(), hidden=ccl_parts["hidden"].item(), kl=ccl_parts["kl"].item())
    return loss, parts


def build_translator(source, target, cfg):
    """A translator for the pair, initialised on the CPU (same weights from the same seed on every device) and
    placed on the target's device."""
    return KVTranslator(
        kv_geometry(source),
        kv_geometry(target),
        kv_geometry(target)["hidden"],
        kind=cfg["kind"],
        k_layers=cfg["k_layers"],
        hidden=cfg["hidden"],
        n_experts=cfg["n_experts"],
        gating=cfg["gating"],
        top_k=cfg["top_k"],
        latent=cfg["latent"],
        window=cfg["window"],
        embed_dim=cfg["embed_dim"],
    ).to(target.device)


def train_translator(source, source_tok, target, target_tok, log=print, **overrides):
    cfg = {**TRAIN_DEFAULTS, **overrides}
    for model in (source, target):
        family_of(model)  # raises for an unsupported family
    if cfg["batch"] < 1 or cfg["steps"] < 1:
        raise ValueError(f"batch and steps must be >= 1, got batch={cfg['batch']} steps={cfg['steps']}")
    if cfg["n_train"] < cfg["batch"]:
        raise ValueError(f"n_train must be >= batch ({cfg['batch']}), got {cfg['n_train']}")
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    items = make_dataset(cfg["n_train"], seed=cfg["seed"] + 1000, split="train", phrase_mix=cfg["phrase_mix"])
    data = encode_pair_items(source_tok, target_tok, items)
    translator = build_translator(source, target, cfg)
    for p in list(source.parameters()) + list(target.parameters()):
        p.requires_grad_(False)
    # output statistics from a few batches of native target KV
    stats_kv, stats_mask = [], []
    for i in range(0, min(256, len(data)), 64):
        b = collate(data[i : i + 64], source_tok, target_tok, target.device)
        with torch.no_grad():
            stats_kv.append(prefill_kv(target, b["tgt_ids"], b["tgt_mask"]))
        stats_mask.append(b["tgt_mask"])
    translator.fit_output_stats(stats_kv, stats_mask)
    opt = torch.optim.AdamW(translator.parameters(), lr=cfg["lr"], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / cfg["steps"]))
    history, start = [], time.time()
    bar = tqdm(range(cfg["steps"]), desc=f"train {cfg['kind']}", mininterval=5)
    for step in bar:
        examples = rng.sample(data, cfg["batch"])
        frac = rng.choice(cfg["injection_points"])
        # CCL joins once reconstruction has converged: from scratch its gradients swamp the KV term
        step_cfg = cfg if step >= cfg["ccl_start"] * cfg["steps"] else {**cfg, "w_ccl": 0.0}
        loss, parts = training_loss(translator, source, source_tok, target, target_tok, examples, step_cfg, frac)
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


def save_translator(translator, cfg, folder):
    os.makedirs(folder, exist_ok=True)
    torch.save(translator.state_dict(), os.path.join(folder, "translator.pt"))
    with open(os.path.join(folder, "translator.json"), "w") as f:
        json.dump({k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}, f, indent=1)


def load_translator(source, target, folder):
    with open(os.path.join(folder, "translator.json")) as f:
        # every setting is saved; folders written before the window option existed read one token
        cfg = {**TRAIN_DEFAULTS, "window": 1, **json.load(f)}
    translator = build_translator(source, target, cfg)
    state = torch.load(os.path.join(folder, "translator.pt"), map_location=target.device, weights_only=True)
    translator.load_state_dict(state)
    return translator.eval(), cfg
