"""The confirmation set: its passages are new (none is in any set the earlier studies scored or chose their recipe on),
its evaluation and translator seeds were never used by the corpus code or a committed run, and every study row records
the evaluation seed and the commit it ran at; a translator kept with --translators is served back only for the
settings it was trained with."""

import glob
import json
import os
import re
import sys

import pytest

from kvtranslate.corpus import make_dataset, split_names
from kvtranslate.models import CHECKPOINT_DIR, N_POSITIONS
from kvtranslate.tokenization import load_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments", "translation"))

import kvtranslate_retention as retention  # noqa: E402

RESULTS = os.path.join(REPO, "experiments", "results", "kvtranslate")
# the long-set sizes the committed studies used (the long sets are drawn 4n at a time, so the size matters)
SCREENING_LONG_SIZES = (60, 100, 120)


@pytest.fixture(scope="module")
def tokenizers():
    return [load_tokenizer(os.path.join(CHECKPOINT_DIR, name)) for name in ("tiny-gpt2", "tiny-qwen2")]


def passages(sets):
    return {item.passage for items in sets.values() for item in items}


def test_the_confirmation_set_shares_no_passage_with_the_screening_sets(tokenizers):
    confirmation = retention.eval_items(tokenizers, N_POSITIONS, 300, 120, retention.CONFIRMATION_EVAL_SEED)
    screening = set()
    for n_long in SCREENING_LONG_SIZES:
        screening |= passages(retention.eval_items(tokenizers, N_POSITIONS, 300, n_long, retention.SCREENING_EVAL_SEED))
    # experiments/translation/translate_heldout.py: the same seed with each names x templates split
    for names in ("train", "eval"):
        for templates in ("train", "eval"):
            screening |= {i.passage for i in make_dataset(300, 99, split=names, template_split=templates)}
    new = passages(confirmation)
    assert len(new) >= 0.99 * sum(len(items) for items in confirmation.values())  # distinct draws
    assert not new & screening
    # still held out: only held-out names, and held-out templates where the set says so
    held_out = set(split_names("eval"))
    assert all(person in held_out for items in confirmation.values() for i in items for person, _, _ in i.facts)
    assert confirmation["heldout_phrasing"][0].passage != confirmation["training_phrasing"][0].passage


def derived_seeds(translator_seed):
    """The seeds a translator of seed s draws from: init and batches (s), training passages (s + 1000), long
    training passages (s + 2000); kvtranslate/train.py."""
    return {translator_seed, translator_seed + 1000, translator_seed + 2000}


def used_seeds():
    """(translator seeds of every committed run, every seed the corpus code and those runs drew passages from)."""
    translators = set()
    for path in glob.glob(os.path.join(RESULTS, "**", "*.jsonl"), recursive=True):
        rows = [json.loads(line) for line in open(path)]
        # the confirmation runs themselves (scored on the confirmation set) are the seeds' intended use
        translators |= {r.get("seed") for r in rows if r.get("eval_seed") != retention.CONFIRMATION_EVAL_SEED} - {None}
    demo = json.load(open(os.path.join(RESULTS, "demo", "summary.json")))
    demo_seeds = {r["seed"] for r in demo.get("runs", [demo["run"]])}
    translators |= demo_seeds
    corpus = {0, 7, 12345}  # tokenizer, bench and probe passages; `kvtranslate eval`'s default; pretraining's eval
    corpus |= set(range(99, 110))  # the screening sets (long ones from 100 on, a new seed each 4n draws)
    corpus |= {d + k for d in demo_seeds for k in range(7, 12)}  # kvtranslate/demo.py's evaluation passages
    for s in translators:
        corpus |= derived_seeds(s)
    return translators, corpus


def test_confirmation_seeds_were_never_used():
    translators, corpus = used_seeds()
    assert translators >= {0, 1, 2, 3, 4, 5}  # the committed studies' seeds were found
    seeds = set(retention.CONFIRMATION_SEEDS)
    assert len(seeds) >= 6 and not seeds & translators
    confirmation_draws = set().union(*(derived_seeds(s) for s in seeds))
    assert not confirmation_draws & corpus
    eval_draws = set(range(retention.CONFIRMATION_EVAL_SEED, retention.CONFIRMATION_EVAL_SEED + 10))
    assert not eval_draws & (corpus | confirmation_draws)


def test_a_summary_refuses_to_pool_one_variants_runs_over_two_evaluation_sets(tmp_path):
    def row(seed, **extra):
        return dict(source="s", target="t", variant="a", seed=seed, steps=1, heldout_phrasing_retention=0.9, **extra)

    path = tmp_path / "study.jsonl"
    # a row from before the eval seed was recorded counts as the screening set
    path.write_text(json.dumps(row(0)) + "\n" + json.dumps(row(1, eval_seed=99)) + "\n")
    assert retention.summarise(str(path))["eval_seeds"] == [99]
    path.write_text(json.dumps(row(0)) + "\n" + json.dumps(row(1, eval_seed=5000)) + "\n")
    with pytest.raises(ValueError, match=r"eval seeds \{'a': \[99, 5000\]\}"):
        retention.summarise(str(path))


def test_rows_record_eval_seed_commit_and_size_and_kept_translators_come_back(tmp_path, capsys):
    out, kept = tmp_path / "runs.jsonl", tmp_path / "translators"
    args = [
        "--variants", "single:n_train=32:batch=8", "--seeds", "300", "--steps", "2", "--n", "4", "--n-long", "2",
        "--eval-seed", "5000", "--threads", "1", "--out", str(out), "--translators", str(kept),
    ]  # fmt: skip
    retention.main(args)
    retention.main(args)  # a restart: the run is in OUT already, nothing is trained or appended
    assert len(out.read_text().splitlines()) == 1
    other_out = args[: args.index("--out") + 1] + [str(tmp_path / "again.jsonl")] + args[args.index("--out") + 2 :]
    retention.main(other_out)  # another study asking for the same translator gets the kept one
    first = json.loads(out.read_text())
    second = json.loads((tmp_path / "again.jsonl").read_text())
    assert first["eval_seed"] == 5000 and first["seed"] == 300
    assert re.fullmatch(r"[0-9a-f]{40}", first["commit"]) and isinstance(first["dirty"], bool)
    assert (first["translator"], second["translator"]) == ("trained", "loaded")
    assert first["parameters"] == second["parameters"] > 0 and first["hidden"] == 256
    scores = [k for k in first if k.endswith(("_f1", "_acc", "_retention"))]
    assert scores and all(first[k] == second[k] for k in scores)
    assert os.path.isfile(retention.translator_folder(str(kept), "single:n_train=32:batch=8", 300) + "/config.json")
    # the same variant and seed asked for with other settings: the kept translator is not silently reused
    more_steps = list(other_out)
    more_steps[more_steps.index("--steps") + 1] = "3"
    with pytest.raises(ValueError, match=r"trained with other settings: steps=2 there, 3 asked"):
        retention.main(more_steps)
    capsys.readouterr()


def test_a_restarted_study_keeps_the_runs_its_file_already_holds(tmp_path):
    """finished_runs: only rows of the same pair, evaluation seed and step count count as done."""
    out = tmp_path / "study.jsonl"
    args = retention.argparse.Namespace(source="tiny-gpt2", target="tiny-qwen2", eval_seed=5000)
    assert retention.finished_runs(str(out), args) == set()
    base = {"source": "tiny-gpt2", "target": "tiny-qwen2", "variant": "mot", "seed": 300, "steps": 2000}
    rows = [
        base,
        {**base, "seed": 301, "eval_seed": 5000},
        {**base, "seed": 302, "eval_seed": 5000, "steps": 100},
        {**base, "seed": 303, "eval_seed": 5000, "target": "tiny-opt"},
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert retention.finished_runs(str(out), args) == {("mot", 301, 2000), ("mot", 302, 100)}
    args.eval_seed = retention.SCREENING_EVAL_SEED  # a row without eval_seed was made on the screening set
    assert retention.finished_runs(str(out), args) == {("mot", 300, 2000)}
