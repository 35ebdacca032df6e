"""The pretraining data and loss: recall passages, follow-up questions, answer masks, weighted loss."""

import random

import torch
import torch.nn.functional as F

from kvtranslate.corpus import asked_fact, has_same_type_distractor, make_dataset, make_recall_item, questions_about
from kvtranslate.pretrain import lm_loss, training_batch
from kvtranslate.tokenization import train_tokenizer

TOKENIZER = train_tokenizer(512)


def test_recall_item_has_only_same_type_facts_about_different_people():
    rng = random.Random(3)
    for n in (2, 4, 6):
        item = make_recall_item(rng, n)
        people = [f[0] for f in item.facts]
        assert len(item.facts) == n and len(set(people)) == n
        assert {f[1] for f in item.facts} == {item.attribute}
        person, _, value = asked_fact(item)
        assert item.answer == " " + value and person in item.question and person == item.person
        assert has_same_type_distractor(item)


def test_follow_up_questions_never_repeat_the_asked_fact():
    rng = random.Random(0)
    for item in make_dataset(50, seed=4, min_facts=2, max_facts=6):
        asked = asked_fact(item)
        follow = questions_about(rng, item, 5, "all", skip_asked=True)
        assert len(follow) == min(5, len(item.facts) - 1)
        assert all(asked_fact(q) != asked and asked_fact(q) in item.facts for q in follow)


def test_training_batch_marks_exactly_the_answer_tokens():
    ids, mask, answer_mask = training_batch(TOKENIZER, random.Random(1), 8, 4, 0.0, 24, questions=3)
    eos = TOKENIZER.eos_token_id
    for row, m, a in zip(ids, mask, answer_mask):
        tokens = row[m.bool()].tolist()
        marked = row[a.bool()].tolist()
        # every turn ends its answer with EOS, and answers are marked only inside the real tokens
        assert (a <= m).all() and marked.count(eos) == tokens.count(eos) >= 1
        text = TOKENIZER.decode(tokens)
        assert text.count("\nQ:") == marked.count(eos)
        # the marked tokens decode to the answers that follow each "A: <asked name>"
        answers = [" " + part.split("<|endoftext|>")[0].split(" ", 2)[2] for part in text.split("\nA:")[1:]]
        assert TOKENIZER.decode([t for t in marked if t != eos]) == "".join(answers)


def test_every_answer_follows_the_asked_name_directly():
    """Each turn reads "\nQ: <question about X>\nA: X" and its answer starts right after X, X's tokens being the
    same as in the passage (the binding models learn needs the name as the last token before the answer)."""
    ids, _, answer_mask = training_batch(TOKENIZER, random.Random(2), 8, 4, 0.0, 24, questions=3)
    prefixes = [
        row[:i].tolist() for row, a in zip(ids, answer_mask) for i in range(1, len(a)) if a[i] == 1 and a[i - 1] == 0
    ]
    assert len(prefixes) >= 8
    for prefix in prefixes:
        text = TOKENIZER.decode(prefix)
        question, cue = text.split("\nQ: ")[-1].split("\nA:")
        name = cue.strip()
        assert cue == " " + name and name in question and (" " + name) in text.split("\nQ: ")[0]
        name_tokens = TOKENIZER(" " + name, add_special_tokens=False)["input_ids"]
        assert prefix[-len(name_tokens) :] == name_tokens


def test_answer_weighted_loss_matches_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    answer = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    per = F.cross_entropy(logits[:, :-1].reshape(-1, 7), ids[:, 1:].reshape(-1), reduction="none").view(2, 4)
    weight = mask[:, 1:] * (1 + 2.0 * answer[:, 1:])
    expected = (per * weight).sum() / weight.sum()
    assert torch.allclose(lm_loss(logits, ids, mask, answer, 2.0), expected)
    plain = F.cross_entropy(
        logits[:, :-1].reshape(-1, 7), ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100).reshape(-1), ignore_index=-100
    )
    assert torch.allclose(lm_loss(logits, ids, mask, answer, 0.0), plain)
    # context_weight 0: the mean loss of the answer tokens alone; 0.5: passage and question tokens count half
    answers_only = (per * answer[:, 1:]).sum() / answer[:, 1:].sum()
    assert torch.allclose(lm_loss(logits, ids, mask, answer, 0.0, context_weight=0.0), answers_only)
    half = mask[:, 1:] * (0.5 + 0.5 * answer[:, 1:])
    assert torch.allclose(lm_loss(logits, ids, mask, answer, 0.0, context_weight=0.5), (per * half).sum() / half.sum())


def test_binding_accuracy_counts_only_items_with_a_same_type_distractor():
    from kvtranslate.scoring import binding_accuracy

    needs_binding = [True, False, True, True, False]
    assert binding_accuracy(needs_binding, [True, True, False, False, False]) == 1 / 3
    assert binding_accuracy(needs_binding[1:2], [False]) is None


def test_bad_pretraining_settings_fail_before_anything_is_written(tmp_path):
    import pytest

    from kvtranslate.pretrain import pretrain

    for bad, field in (
        (dict(recall_prob=1.5), "recall_prob"),
        (dict(questions=0), "questions"),
        (dict(answer_weight=-1.0), "answer_weight"),
        (dict(batch=2), "batch"),
        (dict(context_weight=1.5), "context_weight"),
        (dict(curriculum=-0.1), "curriculum"),
    ):
        with pytest.raises(ValueError, match=field):
            pretrain("tiny-qwen2", out_dir=str(tmp_path / "out"), log=lambda line: None, **bad)
    with pytest.raises(ValueError, match="allowed"):
        pretrain("tiny-qwen2", out_dir=str(tmp_path / "out"), log=lambda line: None, recal_prob=0.5)
    assert not (tmp_path / "out").exists()


def test_pretrain_takes_its_output_folder_explicitly(tmp_path, monkeypatch):
    """No default folder (the committed checkpoints are not written unless named): a missing or empty out_dir is
    refused before any model is built."""
    import pytest

    import kvtranslate.pretrain as pretraining

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(pretraining, "build_tiny", no_build)
    with pytest.raises(TypeError, match="out_dir"):
        pretraining.pretrain("tiny-qwen2", log=lambda line: None)
    for bad in ("", None):
        with pytest.raises(ValueError, match="out_dir"):
            pretraining.pretrain("tiny-qwen2", out_dir=bad, log=lambda line: None)


def test_init_choice_sets_scales_and_tying():
    import pytest

    from kvtranslate.models import build_tiny

    for name in ("tiny-gpt2", "tiny-opt", "tiny-qwen2"):
        hf, _ = build_tiny(name, tokenizer=TOKENIZER if name == "tiny-gpt2" else None, init="hf")
        torch_init, _ = build_tiny(name, tokenizer=TOKENIZER if name == "tiny-gpt2" else None, init="torch")
        assert hf.lm_head.weight is hf.get_input_embeddings().weight
        assert torch_init.lm_head.weight is not torch_init.get_input_embeddings().weight
        assert abs(hf.get_input_embeddings().weight.std().item() - 0.02) < 0.005
        assert abs(torch_init.get_input_embeddings().weight.std().item() - 1.0) < 0.05
        # every weight matrix within PyTorch's default bound 1/sqrt(fan_in)
        linear = torch_init.lm_head.weight
        assert linear.abs().max().item() <= 1 / linear.shape[1] ** 0.5 + 1e-6
    with pytest.raises(ValueError, match="init must be one of"):
        build_tiny("tiny-qwen2", init="xavier")


def test_recall_probe_targets_the_value_stated_after_the_queried_key():
    """experiments/translation/probe_recall.py: with filler gaps and multi-token keys, every target is the value that
    followed the same key in the context, predicted at the query's last position (its conclusions rest on this)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "translation"))
    from probe_recall import MARK, SEP, recall_batch

    pairs, gap, query_gap, key_tokens = 3, 2, 3, 2
    ids, targets = recall_batch(random.Random(1), 4, pairs, 5, gap, query_gap, key_tokens)
    fact_len = key_tokens + gap + 2
    for row, tgt in zip(ids.tolist(), targets.tolist()):
        facts = [row[i * fact_len : (i + 1) * fact_len] for i in range(pairs)]
        assert all(f[-1] == SEP for f in facts)
        stated = {tuple(f[:key_tokens]): f[key_tokens + gap] for f in facts}
        assert len(stated) == pairs  # distinct keys: every query has one right answer
        predicting = [i for i, t in enumerate(tgt) if t != -100]
        assert len(predicting) == 5
        for i in predicting:
            key = tuple(row[i - query_gap - key_tokens + 1 : i - query_gap + 1])
            assert row[i - query_gap - key_tokens] == MARK and tgt[i] == stated[key] == row[i + 1]
