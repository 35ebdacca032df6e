"""Evaluation of a (source, target) pair: closed-set QA, extractive QA, long context, injection points, timing.

Modes (the bounds and the translated cache go through the same scoring code):
- "direct": the target prefills the context itself (upper bound);
- "no-context": the target sees the question only (lower bound);
- "translated": the first p of the context comes from the translator's cache, the target replays the rest;
- "native": the same prefix/replay split with the target's own cache (sanity check, equals "direct");
- "native-keys" / "native-values": the translated cache with the target's own keys (values) put in, a probe of
  which half of the translation loses what.
The translator modes also take `layers`: only those target layers get the translated K/V, the others the
target's own (a probe of where in depth the translation error does its harm; None: every layer translated).
"""

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache

from .align import align_offsets, char_offsets
from .cache import KV, extract_kv, inject_kv, prefill_kv, prefix_kv
from .models import ModelPair, forward, kv_geometry
from .pipeline import EncodedItem, collate, translate_batch
from .routing import gate_diagnostics, merge_diagnostics
from .scoring import binding_accuracy, f1_em, greedy_answers, option_logprobs, pad_right
from .translators import KVTranslator

PROBE_MODES = ("native-keys", "native-values")  # the translated cache with one half made native
MODES = ("direct", "no-context", "translated", "native", *PROBE_MODES)
TRANSLATOR_MODES = ("translated", *PROBE_MODES)


def check_layers(layers: tuple[int, ...] | None, mode: str, n_layers: int) -> None:
    """`layers` (target layers that get the translated K/V) names existing layers, in a translator mode."""
    if layers is None:
        return
    if mode not in TRANSLATOR_MODES:
        raise ValueError(f"layers applies to the modes {TRANSLATOR_MODES}, not {mode!r}")
    bad = [j for j in layers if not 0 <= j < n_layers]
    if bad:
        raise ValueError(f"layers {bad} do not exist: layers must be among the target's 0..{n_layers - 1}")


def prefix_and_tails(
    mode: str,
    examples: list[EncodedItem],
    pair: ModelPair,
    translator: KVTranslator | None = None,
    frac: float = 1.0,
    layers: tuple[int, ...] | None = None,
) -> tuple[KV | None, Tensor | None, list[list[int]]]:
    """(kv, kv_mask, tails): the cache to inject (or None) and, per example, the tokens the target reads next;
    with `layers`, the target layers outside it hold the target's own K/V."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_layers(layers, mode, kv_geometry(pair.target)["layers"])
    if mode == "direct":
        return None, None, [e["tgt"] + e["question"] for e in examples]
    if mode == "no-context":
        return None, None, [e["question"] for e in examples]
    if mode in TRANSLATOR_MODES and translator is None:
        raise ValueError(f"mode={mode!r} needs a translator")
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"frac (injection point as a fraction of the context) must be in (0, 1], got {frac}")
    batch = collate(pair, examples)
    with torch.no_grad():
        if mode == "native":
            kv = prefill_kv(pair.target, batch["tgt_ids"], batch["tgt_mask"])
        else:
            kv, _ = translate_batch(translator, pair, batch)
        if mode in PROBE_MODES:
            native = prefill_kv(pair.target, batch["tgt_ids"], batch["tgt_mask"])
            keys = mode == "native-keys"
            kv = [(nk if keys else k, v if keys else nv) for (k, v), (nk, nv) in zip(kv, native)]
        if layers is not None:
            native = prefill_kv(pair.target, batch["tgt_ids"], batch["tgt_mask"])
            kv = [kv[j] if j in layers else native[j] for j in range(len(kv))]
    lengths = [max(1, round(frac * len(e["tgt"]))) for e in examples]
    kv, kv_mask = prefix_kv(kv, batch["tgt_mask"], lengths)
    return kv, kv_mask, [e["tgt"][n:] + e["question"] for e, n in zip(examples, lengths)]


def context_batches(
    data: list[EncodedItem],
    mode: str,
    pair: ModelPair,
    translator: KVTranslator | None,
    frac: float,
    batch: int,
    layers: tuple[int, ...] | None = None,
) -> Iterator[tuple[list[EncodedItem], KV | None, Tensor | None, list[list[int]]]]:
    """(examples, kv, kv_mask, tails) of `prefix_and_tails` for consecutive batches of `data`."""
    for i in range(0, len(data), batch):
        chunk = data[i : i + batch]
        yield (chunk, *prefix_and_tails(mode, chunk, pair, translator, frac, layers))


@torch.no_grad()
def routing_diagnostics(
    data: list[EncodedItem], pair: ModelPair, translator: KVTranslator, batch: int = 32
) -> dict[str, Any] | None:
    """routing.gate_diagnostics of the gates the translator uses on `data`'s contexts (token-weighted over
    batches; uniform with `translator.uniform_gates`), None for a kind without a router."""
    parts = []
    for i in range(0, len(data), batch):
        b = collate(pair, data[i : i + batch])
        _, aux = translate_batch(translator, pair, b)
        if "gates" not in aux:
            return None
        parts.append((gate_diagnostics(aux["gates"], b["tgt_mask"]), b["tgt_mask"].sum().item()))
    return dict(merge_diagnostics(parts), uniform_gates=translator.uniform_gates) if parts else None


@torch.no_grad()
def closed_set_correct(
    data: list[EncodedItem],
    mode: str,
    pair: ModelPair,
    translator: KVTranslator | None = None,
    frac: float = 1.0,
    batch: int = 32,
    layers: tuple[int, ...] | None = None,
) -> list[bool]:
    """Per example: whether the highest-likelihood option is the answer."""
    correct = []
    for chunk, kv, kv_mask, tails in context_batches(data, mode, pair, translator, frac, batch, layers):
        scores = option_logprobs(
            pair.target, kv, kv_mask, tails, [e["options"] for e in chunk], pair.target_tok.pad_token_id
        )
        correct += [int(s.argmax()) == e["label"] for s, e in zip(scores, chunk)]
    return correct


def closed_set_accuracy(*args: Any, **kwargs: Any) -> float:
    """The share of `closed_set_correct` (same arguments)."""
    correct = closed_set_correct(*args, **kwargs)
    return sum(correct) / len(correct)


@torch.no_grad()
def extractive_f1(
    data: list[EncodedItem],
    mode: str,
    pair: ModelPair,
    translator: KVTranslator | None = None,
    frac: float = 1.0,
    batch: int = 32,
    layers: tuple[int, ...] | None = None,
) -> tuple[float, float, list[str]]:
    """Mean SQuAD F1 and exact match of the greedy answers, and the answers."""
    f1s, ems, predictions = [], [], []
    tok = pair.target_tok
    for chunk, kv, kv_mask, tails in context_batches(data, mode, pair, translator, frac, batch, layers):
        answers = greedy_answers(pair.target, kv, kv_mask, tails, tok.pad_token_id, tok.eos_token_id)
        for a, e in zip(answers, chunk):
            text = tok.decode(a)
            f1, em = f1_em(text, e["gold"])
            f1s.append(f1)
            ems.append(em)
            predictions.append(text.strip())
    return sum(f1s) / len(f1s), sum(ems) / len(ems), predictions


def qa_scores(
    data: list[EncodedItem],
    mode: str,
    pair: ModelPair,
    translator: KVTranslator | None = None,
    frac: float = 1.0,
    layers: tuple[int, ...] | None = None,
) -> tuple[dict[str, float | None], list[str]]:
    """Closed-set accuracy, binding accuracy (items with a same-type distractor), extractive F1 and EM of one
    mode, plus the greedy answers."""
    correct = closed_set_correct(data, mode, pair, translator, frac, layers=layers)
    f1, em, predictions = extractive_f1(data, mode, pair, translator, frac, layers=layers)
    scores = dict(
        acc=sum(correct) / len(correct),
        binding_acc=binding_accuracy([e["needs_binding"] for e in data], correct),
        f1=f1,
        em=em,
    )
    return scores, predictions


@torch.no_grad()
def injection_errors(
    data: list[EncodedItem],
    pair: ModelPair,
    translator: KVTranslator,
    frac: float,
    batch: int = 32,
    layers: tuple[int, ...] | None = None,
) -> dict[str, float | None]:
    """The two failure modes at injection point `frac`, against the same split with the native cache:
    replay_hidden_err = relative error of the target's last hidden state over the replayed context tokens
    (error that early injection propagates), answer_kl = KL(native || translated) of the next-token
    distribution where the answer starts (what is left at the last state). `layers` as in `prefix_and_tails`."""
    hid, hid_n, kls = 0.0, 0, []
    target = pair.target
    for i in range(0, len(data), batch):
        chunk = data[i : i + batch]
        kv_t, mask_t, tails = prefix_and_tails("translated", chunk, pair, translator, frac, layers)
        kv_n, mask_n, _ = prefix_and_tails("native", chunk, pair, None, frac)
        ids, mask = pad_right(tails, pair.target_tok.pad_token_id, target.device)
        out_t = forward(target, ids, mask, inject_kv(target, kv_t, mask_t), mask_t, hidden_states=True)
        out_n = forward(target, ids, mask, inject_kv(target, kv_n, mask_n), mask_n, hidden_states=True)
        h_t, h_n = out_t.hidden_states[-1], out_n.hidden_states[-1]
        for b, e in enumerate(chunk):
            n_replay = len(tails[b]) - len(e["question"])
            if n_replay > 0:
                err = (h_t[b, :n_replay] - h_n[b, :n_replay]).pow(2).sum(-1) / h_n[b, :n_replay].pow(2).sum(-1)
                hid += err.sum().item()
                hid_n += n_replay
            last = len(tails[b]) - 1
            lp_n, lp_t = F.log_softmax(out_n.logits[b, last], -1), F.log_softmax(out_t.logits[b, last], -1)
            kls.append((lp_n.exp() * (lp_n - lp_t)).sum().item())
    return dict(
        replay_hidden_err=hid / hid_n if hid_n else None, answer_kl=sum(kls) / len(kls)
    )  # None: nothing replayed


@torch.no_grad()
def multi_agent(
    documents: list[list[EncodedItem]], pair: ModelPair, translator: KVTranslator
) -> tuple[float, list[dict[str, str]]]:
    """Agent A (source) reads each document once; agent B (target) answers several questions from A's
    translated cache, which is built once per document and reused for every question."""
    f1s, transcript = [], []
    target_tok = pair.target_tok
    for doc_examples in documents:
        kv, kv_mask, _ = prefix_and_tails("translated", doc_examples[:1], pair, translator, 1.0)
        n = len(doc_examples)
        kv_rep = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv]
        answers = greedy_answers(
            pair.target,
            kv_rep,
            kv_mask.expand(n, -1),
            [e["question"] for e in doc_examples],
            target_tok.pad_token_id,
            target_tok.eos_token_id,
        )
        for a, e in zip(answers, doc_examples):
            text = target_tok.decode(a).strip()
            f1s.append(f1_em(text, e["gold"])[0])
            if len(transcript) < 6:
                transcript.append(
                    dict(question=target_tok.decode(e["question"]).strip(), answer_b=text, gold=e["gold"])
                )
    return sum(f1s) / len(f1s), transcript


def translate_and_prefill(
    pair: ModelPair, translator: KVTranslator, text: str
) -> tuple[Callable[[], DynamicCache], Callable[[], DynamicCache]]:
    """Two no-argument functions for one context (batch 1): `translate` turns the source cache agent A already
    holds into the target's cache (alignment, RoPE stripping, the translator, RoPE re-rotation), `prefill` has the
    target read the context itself."""
    if pair.more_sources:
        raise ValueError(
            f"translate_and_prefill takes a pair with one source (agent A's cache), got {len(pair.sources)} sources"
        )
    source, target = pair.source, pair.target
    src_ids, src_off = char_offsets(pair.source_tok, text)
    tgt_ids, tgt_off = char_offsets(pair.target_tok, text)
    s_ids, t_ids = torch.tensor([src_ids], device=source.device), torch.tensor([tgt_ids], device=target.device)
    s_mask, t_mask = torch.ones_like(s_ids), torch.ones_like(t_ids)
    with torch.no_grad():
        source_cache = forward(source, s_ids, s_mask).cache  # agent A's own cache
    source_raw = [(layer.keys.clone(), layer.values.clone()) for layer in source_cache.layers]

    @torch.no_grad()
    def translate() -> DynamicCache:
        index = torch.tensor([align_offsets(src_off, tgt_off)], device=target.device)
        kv_src = extract_kv(source, DynamicCache(ddp_cache_data=source_raw), s_mask)
        batch = dict(tgt_ids=t_ids, tgt_mask=t_mask, index=index)
        kv, _ = translate_batch(translator, pair, batch, source_kv=kv_src)
        return inject_kv(target, kv, t_mask)

    @torch.no_grad()
    def prefill() -> DynamicCache:
        # the fairest prefill: logits for the last position only, as a server filling a cache would run it
        return target(input_ids=t_ids, attention_mask=t_mask, use_cache=True, logits_to_keep=1).cache

    return translate, prefill


def time_translate_vs_prefill(
    pair: ModelPair, translator: KVTranslator, text: str, repeats: int = 20
) -> dict[str, float]:
    """Median milliseconds (batch 1) to translate a context that agent A has already read, vs. the target
    prefilling it. The two are timed in alternation (which goes first alternates too), so a load that comes and
    goes on a shared machine falls on both alike."""
    translate, prefill = translate_and_prefill(pair, translator, text)
    synchronize = torch.cuda.synchronize if pair.device.type == "cuda" else (lambda: None)
    times = {"translate": [], "prefill": []}
    fns = {"translate": translate, "prefill": prefill}
    for fn in fns.values():
        fn()  # warm-up
    for r in range(repeats):
        for name in ("translate", "prefill") if r % 2 == 0 else ("prefill", "translate"):
            synchronize()
            t0 = time.perf_counter()
            fns[name]()
            synchronize()
            times[name].append((time.perf_counter() - t0) * 1000)
    return dict(
        tokens=len(char_offsets(pair.target_tok, text)[0]),
        translate_ms=statistics.median(times["translate"]),
        prefill_ms=statistics.median(times["prefill"]),
    )
