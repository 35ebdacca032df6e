"""Batched scoring on top of an optional injected cache: candidate log-likelihoods and greedy answers.

Each row is (prefix cache, tail tokens). The cache is left-padded, the tails are right-padded; positions come
from the concatenated mask, so real tokens never see padding. `kv=None` means no cache (the tail holds the
whole prompt: direct reading or the no-context bound).
"""

import re
import string
from collections import Counter

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache import KV, inject_kv, repeat_kv_batch
from .models import forward


def pad_right(rows: list[list[int]], pad_id: int, device: str | torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Right-padded ids and mask [rows, longest]."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def pad_left(rows: list[list[int]], pad_id: int, device: str | torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Left-padded ids and mask [rows, longest]."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, length - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, length - len(r) :] = 1
    return ids.to(device), mask.to(device)


def run_tail(
    model: PreTrainedModel,
    kv: KV | None,
    kv_mask: Tensor | None,
    tails: list[list[int]],
    pad_id: int,
    hidden_states: bool = False,
) -> tuple[CausalLMOutputWithPast, Tensor, Tensor]:
    """The model over right-padded `tails` after the injected cache (if any); the output, ids and mask."""
    ids, mask = pad_right(tails, pad_id, model.device)
    cache = inject_kv(model, kv, kv_mask) if kv is not None else None
    out = forward(model, ids, mask, cache, kv_mask if kv is not None else None, hidden_states=hidden_states)
    return out, ids, mask


@torch.no_grad()
def option_logprobs(
    model: PreTrainedModel,
    kv: KV | None,
    kv_mask: Tensor | None,
    tails: list[list[int]],
    options: list[list[list[int]]],
    pad_id: int,
) -> Tensor:
    """Sum of log p(option tokens | cache, tail) for every option of every row (lm-eval's `acc` convention).

    tails: list of token lists; options: list (per row) of lists of token lists. Returns [rows, n_options]."""
    n_opt = len(options[0])
    if any(len(o) != n_opt for o in options):
        raise ValueError("every row needs the same number of options")
    rows, starts = [], []
    for tail, opts in zip(tails, options):
        for opt in opts:
            rows.append(tail + opt)
            starts.append(len(tail))
    if kv is not None:
        kv, kv_mask = repeat_kv_batch(kv, kv_mask, n_opt)
    out, ids, mask = run_tail(model, kv, kv_mask, rows, pad_id)
    logp = F.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0].cpu()
    scores = torch.zeros(len(rows))
    for i, (row, s) in enumerate(zip(rows, starts)):
        scores[i] = logp[i, s - 1 : len(row) - 1].sum()
    return scores.view(len(tails), n_opt)


@torch.no_grad()
def greedy_answers(
    model: PreTrainedModel,
    kv: KV | None,
    kv_mask: Tensor | None,
    tails: list[list[int]],
    pad_id: int,
    eos_id: int,
    max_new_tokens: int = 6,
) -> list[list[int]]:
    """Greedy continuation of every tail until EOS; returns token lists without the EOS."""
    out, ids, mask = run_tail(model, kv, kv_mask, tails, pad_id)
    past_mask = mask if kv is None else torch.cat([kv_mask, mask], 1)
    last = mask.sum(1) - 1
    next_tok = out.logits[torch.arange(len(tails), device=last.device), last].argmax(-1)
    cache, answers, done = out.cache, [[] for _ in tails], torch.zeros(len(tails), dtype=torch.bool)
    for _ in range(max_new_tokens):
        for i, t in enumerate(next_tok.tolist()):
            if not done[i]:
                if t == eos_id:
                    done[i] = True
                else:
                    answers[i].append(t)
        if done.all():
            break
        step_mask = torch.ones(len(tails), 1, dtype=torch.long, device=mask.device)
        out = forward(model, next_tok[:, None], step_mask, cache, past_mask)
        past_mask = torch.cat([past_mask, step_mask], 1)
        cache, next_tok = out.cache, out.logits[:, -1].argmax(-1)
    return answers


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_em(prediction: str, gold: str) -> tuple[float, float]:
    """SQuAD F1 and exact match of one answer."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    em = float(p == g)
    common = Counter(p) & Counter(g)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0, em
    precision, recall = overlap / len(p), overlap / len(g)
    return 2 * precision * recall / (precision + recall), em


def binding_accuracy(needs_binding: list[bool], correct: list[bool]) -> float | None:
    """Accuracy on the examples whose passage holds another value of the asked type (None if there are none)."""
    picked = [c for c, flag in zip(correct, needs_binding) if flag]
    return sum(picked) / len(picked) if picked else None
