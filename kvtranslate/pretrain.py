"""Pretraining the tiny models on the synthetic fact corpus so they really read their context.

Recipe (what takes the models to reading, binding and copying values from their context on 2 CPU cores;
the trials behind each choice are in experiments/results/kvtranslate/checkpoints/README.md):
- every sequence is a passage followed by 3 question/answer/EOS turns about different facts of it, each question
  ending on the asked name (corpus.question_turn); next-token loss on the answer tokens only;
- a curriculum on the number of facts per passage: 1 fact (pure copy) first, growing to 6 over the first
  40% of the steps, so the model learns to find and copy the value before it meets same-type distractors;
- 4% of the batches are long passages (8-24 facts) in the second half, so the long-context variant stays in
  distribution;
- PyTorch-scale init with untied embeddings (models.init_for_retrieval), AdamW lr 1e-3 with warm-up and linear
  decay, batch 32, 8,000 steps (the committed checkpoints: one thread, `--threads 1`).
Closed-set accuracy (log-likelihood of 4 candidates, lm-eval style), open exact match and binding accuracy (the
items with a same-type distractor) are logged. The other options (answer-token loss weight, all-same-attribute
"binding drill" passages, HF init with tied embeddings, full LM loss) are kept for the recorded trials.
"""

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .corpus import QAItem, has_same_type_distractor, make_dataset, make_item, make_recall_item, questions_about
from .models import INITS, N_POSITIONS, TINY_SPECS, build_tiny, forward, save_model
from .scoring import binding_accuracy, greedy_answers, option_logprobs, pad_right
from .tokenization import encode_item, encode_text, encode_turn

DEFAULTS: dict[str, Any] = dict(
    steps=8000,
    batch=32,
    lr=1e-3,
    warmup=200,
    max_facts=6,
    curriculum=0.4,
    long_prob=0.04,
    long_facts=24,
    questions=3,
    answer_weight=0.0,
    context_weight=0.0,
    recall_prob=0.0,
    init="torch",
    seed=0,
)


def check_config(cfg: dict[str, Any]) -> None:
    """Clear errors for settings the training loop cannot use, raised before any model is built."""
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown pretraining settings {unknown}; allowed: {sorted(DEFAULTS)}")
    rules = dict(
        steps=(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
        batch=(lambda v: isinstance(v, int) and v >= 4, "an integer >= 4 (long batches are batch // 4)"),
        questions=(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
        max_facts=(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
        recall_prob=(lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
        long_prob=(lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
        answer_weight=(lambda v: v >= 0.0, "a number >= 0"),
        context_weight=(lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
        curriculum=(lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
        lr=(lambda v: v > 0.0, "a number > 0"),
        init=(lambda v: v in INITS, f"one of {INITS}"),
    )
    for key, (ok, allowed) in rules.items():
        if not ok(cfg[key]):
            raise ValueError(
                f"pretraining setting {key} (--{key.replace('_', '-')}) must be {allowed}, got {cfg[key]!r}"
            )


def curriculum_facts(progress: float, max_facts: int, curriculum: float) -> int:
    """Most facts per passage at `progress` (share of the steps done)."""
    if curriculum == 0:  # the full mix of 1..max_facts from the first step
        return max_facts
    return 1 + int((max_facts - 1) * min(1.0, progress / curriculum))


def training_batch(
    tokenizer: PreTrainedTokenizerBase,
    rng: random.Random,
    batch: int,
    max_facts: int,
    long_prob: float,
    long_facts: int,
    questions: int = 1,
    recall_prob: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of short passages, or (with probability long_prob) a quarter-size batch of long ones: mixing a
    single long passage into a short batch would pad every row to its length.

    Each passage is followed by up to `questions` question/answer/EOS turns about different facts of it: the
    binding signal (answer tokens) is a small part of every sequence, and extra turns multiply it for the cost
    of a few tokens. Returns ids, attention mask and a mask of the answer tokens (EOS included)."""
    long = rng.random() < long_prob
    rows, answer_rows = [], []
    for _ in range(batch // 4 if long else batch):
        if long:
            item = make_item(rng, rng.randint(8, long_facts), "all", max_people=long_facts // 2)
        elif recall_prob and rng.random() < recall_prob:
            item = make_recall_item(rng, rng.randint(2, max(2, max_facts)), "all")
        else:
            item = make_item(rng, rng.randint(1, max_facts), "all")
        turns = [item]
        if questions > 1:
            turns += questions_about(rng, item, questions - 1, "all", skip_asked=True)
        row = encode_text(tokenizer, item.passage)
        is_answer = [0] * len(row)
        for turn in turns:
            t = encode_turn(tokenizer, turn)
            row += t["question"] + t["answer"]
            is_answer += [0] * len(t["question"]) + [1] * len(t["answer"])
        # keep the end (the answers) when a long passage overflows the positions
        rows.append(row[-N_POSITIONS:])
        answer_rows.append(is_answer[-N_POSITIONS:])
    ids, mask = pad_right(rows, tokenizer.pad_token_id)
    answer_mask, _ = pad_right(answer_rows, 0)
    return ids, mask, answer_mask


def lm_loss(
    logits: Tensor, ids: Tensor, mask: Tensor, answer_mask: Tensor, answer_weight: float, context_weight: float = 1.0
) -> Tensor:
    """Next-token loss; answer tokens count (1 + answer_weight) times, every other token (passage, question)
    context_weight times. The passage's names and values are random, so their loss cannot fall below its
    entropy; context_weight < 1 lowers that noise's share of the gradient (the recipe uses 0: answers only)."""
    target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    per_token = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="none"
    )
    answer = answer_mask[:, 1:].float()
    weight = (context_weight * (mask[:, 1:].float() - answer) + (1 + answer_weight) * answer).reshape(-1)
    return (per_token * weight).sum() / weight.sum()


@torch.no_grad()
def direct_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, items: list[QAItem], batch: int = 64
) -> tuple[float, float, float | None]:
    """Closed-set accuracy, open exact match, and closed-set accuracy on the items whose passage holds another
    value of the asked type (where matching the type alone cannot find the answer) when the model reads the
    context itself."""
    model.eval()
    correct, exact = [], 0
    for i in range(0, len(items), batch):
        chunk = items[i : i + batch]
        encs = [encode_item(tokenizer, it) for it in chunk]
        tails = [e["context"] + e["question"] for e in encs]
        scores = option_logprobs(model, None, None, tails, [e["options"] for e in encs], tokenizer.pad_token_id)
        correct += [int(s.argmax()) == it.label for s, it in zip(scores, chunk)]
        answers = greedy_answers(model, None, None, tails, tokenizer.pad_token_id, tokenizer.eos_token_id)
        exact += sum(a == e["answer"][:-1] for a, e in zip(answers, encs))
    binding = binding_accuracy([has_same_type_distractor(it) for it in items], correct)
    return sum(correct) / len(items), exact / len(items), binding


def pretrain(
    name: str,
    out_dir: str | os.PathLike[str],
    log: Callable[[str], Any] = print,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **overrides: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Pretrain tiny model `name` (DEFAULTS with `overrides`) and save it to out_dir/name; returns the model,
    its tokenizer and the final evaluation record. `out_dir` has no default: the committed checkpoints are only
    replaced when a caller names their folder."""
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise ValueError(f"out_dir {out_dir!r}: the folder the pretrained model is saved in (a path) is required")
    cfg = {**DEFAULTS, **overrides}
    check_config(cfg)
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    model, tokenizer = build_tiny(name, cfg["seed"], tokenizer, init=cfg["init"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.98), weight_decay=0.01)
    schedule = lambda s: min(1.0, (s + 1) / cfg["warmup"]) * max(0.05, 1 - s / cfg["steps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    eval_items = make_dataset(256, seed=12345, split="eval", min_facts=2, max_facts=6)
    n_params = sum(p.numel() for p in model.parameters())
    log(json.dumps(dict(event="start", model=name, params=n_params, **cfg)))
    start, history = time.time(), []
    bar = tqdm(range(cfg["steps"]), desc=f"pretrain {name}", mininterval=5)
    for step in bar:
        model.train()
        progress = step / cfg["steps"]
        max_facts = curriculum_facts(progress, cfg["max_facts"], cfg["curriculum"])
        long_prob = cfg["long_prob"] if progress > 0.5 else 0.0
        ids, mask, answer_mask = training_batch(
            tokenizer, rng, cfg["batch"], max_facts, long_prob, cfg["long_facts"], cfg["questions"], cfg["recall_prob"]
        )
        logits = forward(model, ids, mask, use_cache=False).logits
        loss = lm_loss(logits, ids, mask, answer_mask, cfg["answer_weight"], cfg["context_weight"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", facts=max_facts, refresh=False)
        if (step + 1) % 500 == 0 or step + 1 == cfg["steps"]:
            acc, em, binding = direct_accuracy(model, tokenizer, eval_items)
            rec = dict(
                event="eval",
                step=step + 1,
                minutes=round((time.time() - start) / 60, 2),
                loss=round(loss.item(), 4),
                max_facts=max_facts,
                closed_acc=acc,
                open_em=em,
                binding_acc=binding,
            )
            history.append(rec)
            log(json.dumps(rec))
    model.eval()
    final = history[-1]
    meta = dict(
        name=name,
        spec=TINY_SPECS[name],
        pretrain=cfg,
        params=n_params,
        final=final,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
    )
    save_model(model, tokenizer, os.path.join(out_dir, name), meta)
    log(json.dumps(dict(final, event="saved", model=name, folder=os.path.join(out_dir, name))))
    return model, tokenizer, final
