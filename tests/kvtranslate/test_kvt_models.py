import os
import subprocess
import sys

import pytest
import torch

from kvtranslate.corpus import TEMPLATES, make_dataset, split_names, split_templates
from kvtranslate.evaluate import closed_set_accuracy, prefix_and_tails
from kvtranslate.models import CHECKPOINT_DIR, TINY_SPECS, ModelPair, load_model, resolve
from kvtranslate.pipeline import encode_pair_items
from kvtranslate.scoring import option_logprobs
from kvtranslate.tokenization import encode_item

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_CHECKPOINTS = all(os.path.isdir(os.path.join(CHECKPOINT_DIR, n)) for n in TINY_SPECS)
needs_checkpoints = pytest.mark.skipif(not HAVE_CHECKPOINTS, reason="run `python -m kvtranslate pretrain` first")


def test_eval_split_is_held_out():
    assert not set(split_names("train")) & set(split_names("eval"))
    for facts, _questions in TEMPLATES.values():
        assert not set(split_templates(facts, "train")) & set(split_templates(facts, "eval"))
    a, b = make_dataset(5, seed=1, split="eval"), make_dataset(5, seed=1, split="eval")
    assert [x.passage for x in a] == [x.passage for x in b]  # deterministic from the seed
    for item in a:
        assert item.options[item.label] == item.answer and item.answer.strip() in item.passage


def test_template_split_changes_only_the_phrasing():
    """Held-out names with training templates: the same facts, questions and options as the held-out set, each
    sentence and question phrased with a training template (what translate_heldout.py compares)."""
    held_out = make_dataset(40, seed=3, split="eval")
    rephrased = make_dataset(40, seed=3, split="eval", template_split="train")
    train_names = set(split_names("train"))
    for a, b in zip(held_out, rephrased):
        assert (a.facts, a.person, a.options, a.label) == (b.facts, b.person, b.options, b.label)
        assert not {f[0] for f in b.facts} & train_names
        expected = " " + " ".join(
            next(
                t for t in split_templates(TEMPLATES[attr][0], "train") if t.format(n=person, v=value) in b.passage
            ).format(n=person, v=value)
            for person, attr, value in b.facts
        )
        assert b.passage == expected
        asked = [q.format(n=b.person) for q in TEMPLATES[b.attribute][1]]
        assert b.question.split("\nQ: ")[1].split("\nA:")[0] in asked[:-1]  # a training question template
        assert a.question.split("\nQ: ")[1].split("\nA:")[0] == asked[-1]  # the held-out one


def test_the_package_is_code_only_and_tiny_names_resolve_outside_it():
    """kvtranslate/ holds its modules and README; the committed checkpoints (and every other result) live under
    experiments/results/kvtranslate/, where tiny names resolve."""
    package = os.path.join(REPO, "kvtranslate")
    data = [
        os.path.relpath(os.path.join(root, f), package)
        for root, dirs, files in os.walk(package)
        for f in files
        if "__pycache__" not in root and not (f.endswith(".py") or f == "README.md")
    ]
    folders = [d for d in os.listdir(package) if os.path.isdir(os.path.join(package, d)) and d != "__pycache__"]
    assert data == [] and folders == []
    results = os.path.join(REPO, "experiments", "results", "kvtranslate")
    assert resolve("tiny-gpt2") == os.path.join(results, "checkpoints", "tiny-gpt2")


def test_missing_local_path_is_an_error_not_a_hub_lookup():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve("./no/such/model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve("/tmp/kvt-missing-model")
    assert resolve("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # hub ids pass through unchanged


@needs_checkpoints
@pytest.mark.parametrize("name", sorted(TINY_SPECS))
def test_committed_checkpoint_reads_its_context(name):
    model, tok = load_model(name)
    pair = ModelPair(model, tok, model, tok)  # the model reads its own context
    items = make_dataset(48, seed=5, split="eval")
    data = encode_pair_items(pair, items)
    direct = closed_set_accuracy(data, "direct", pair)
    blind = closed_set_accuracy(data, "no-context", pair)
    assert direct > blind + 0.3
    # the prompt is tokenised piecewise: context tokens are a prefix of the full prompt's tokens
    e = encode_item(tok, items[0])
    assert tok(items[0].passage, add_special_tokens=False)["input_ids"] == e["context"]


@needs_checkpoints
def test_native_cache_with_replay_scores_like_direct_reading():
    model, tok = load_model("tiny-qwen2")
    pair = ModelPair(model, tok, model, tok)
    data = encode_pair_items(pair, make_dataset(6, seed=2, split="eval"))
    opts = [e["options"] for e in data]
    direct = option_logprobs(model, *prefix_and_tails("direct", data, pair), opts, tok.pad_token_id)
    kv, mask, tails = prefix_and_tails("native", data, pair, None, 0.5)
    replay = option_logprobs(model, kv, mask, tails, opts, tok.pad_token_id)
    assert torch.allclose(direct, replay, atol=1e-3)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "kvtranslate", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_help_and_bad_arguments():
    out = run_cli("--help")
    assert out.returncode == 0 and all(c in out.stdout for c in ("pretrain", "train", "eval", "demo"))
    out = run_cli("train", "--source", "tiny-gpt2", "--target", "tiny-qwen2", "--out", "/tmp/x", "--kind", "moe")
    assert out.returncode != 0 and "--kind" in out.stderr and "shared-latent" in out.stderr
    with pytest.raises(ValueError, match="mode must be one of"):
        prefix_and_tails("fancy", [], None)


def test_phrase_mix_reads_no_held_out_template():
    """Varied phrasings use only words of the training templates (a word only the held-out templates have, such as
    "home", never appears) and keep every fact's name and value."""
    from kvtranslate.corpus import template_words

    held_out_only = set(template_words("eval")) - set(template_words("train"))
    assert "home" in held_out_only
    mixed = make_dataset(60, seed=4, split="train", phrase_mix=1.0)
    plain = make_dataset(60, seed=4, split="train")
    for item in mixed:
        words = set(item.passage.replace(".", " ").split())
        assert not words & held_out_only
        assert all(person in item.passage and value in item.passage for person, _, value in item.facts)
    assert sum(a.passage != b.passage for a, b in zip(mixed, plain)) == len(mixed)
