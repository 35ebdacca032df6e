"""Command-line safety and loading: the committed checkpoints are only replaced when asked to, devices, dtypes and
threads are checked before anything loads (and threads stay torch's own unless given), --dtype reaches
from_pretrained, unsupported model families are named, saved translators load back (tensors only) from their folder
and from the translator.pt of older versions."""

import argparse
import json
import math
import os

import pytest
import torch
from kvt_helpers import small_model
from transformers import LlamaConfig

from kvtranslate.__main__ import build_parser, check_args, main, pretrain_log_path
from kvtranslate.corpus import make_dataset
from kvtranslate.demo import worker_threads
from kvtranslate.evaluate import qa_scores
from kvtranslate.models import (
    CHECKPOINT_DIR,
    RESULTS_DIR,
    TINY_SPECS,
    ModelPair,
    family_of,
    load_model,
    load_pair,
    pick_device,
)
from kvtranslate.pipeline import build_translator, encode_pair_items, load_translator, save_translator
from kvtranslate.train import TRAIN_DEFAULTS, train_translator
from kvtranslate.translators import KVTranslator

HAVE_CHECKPOINTS = all(os.path.isdir(os.path.join(CHECKPOINT_DIR, n)) for n in TINY_SPECS)
needs_checkpoints = pytest.mark.skipif(not HAVE_CHECKPOINTS, reason="run `python -m kvtranslate pretrain` first")


def snapshot(folder):
    return {
        os.path.join(root, f): (os.path.getsize(os.path.join(root, f)), os.path.getmtime(os.path.join(root, f)))
        for root, _, files in os.walk(folder)
        for f in files
    }


def test_pretrain_refuses_the_committed_checkpoints_unless_told(capsys):
    before = snapshot(CHECKPOINT_DIR)
    for out in (CHECKPOINT_DIR, os.path.join(CHECKPOINT_DIR, "..", "checkpoints")):
        with pytest.raises(SystemExit) as stop:
            main(["pretrain", "--models", "tiny-qwen2", "--steps", "1", "--out", out])
        assert stop.value.code == 2 and "--overwrite-committed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # no --out at all: there is no default folder to overwrite
        main(["pretrain", "--models", "tiny-qwen2", "--steps", "1"])
    assert stop.value.code == 2 and "--out" in capsys.readouterr().err
    assert snapshot(CHECKPOINT_DIR) == before


def test_pretrain_log_lives_with_results_for_the_committed_folder(tmp_path):
    committed = argparse.Namespace(log=None, out=CHECKPOINT_DIR)
    assert pretrain_log_path(committed) == os.path.join(RESULTS_DIR, "pretrain_log.jsonl")
    scratch = argparse.Namespace(log=None, out=str(tmp_path))
    assert pretrain_log_path(scratch) == os.path.join(str(tmp_path), "pretrain_log.jsonl")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is absent")
def test_device_and_threads_are_checked_before_anything_loads(capsys, tmp_path):
    assert pick_device("auto").type == "cpu"
    with pytest.raises(ValueError, match="--device cuda"):
        pick_device("cuda")
    with pytest.raises(ValueError, match="--device must be"):
        pick_device("tpu")
    for flag, value in (("--device", "cuda"), ("--threads", "0")):
        with pytest.raises(SystemExit) as stop:
            main(
                ["train", "--source", "tiny-gpt2", "--target", "tiny-qwen2", "--out", str(tmp_path / "t"), flag, value]
            )
        assert stop.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_unsupported_family_is_named(tmp_path):
    LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported model family 'llama'.*gpt2, opt, qwen2"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="'llama'"):
        family_of(LlamaConfig())


def small_pair():
    return ModelPair(small_model("gpt2", layers=3), None, small_model("qwen2"), None)  # no tokenizer needed here


def same_outputs(a, b):
    feats, emb = torch.randn(2, 5, 3, 2 * 32), torch.randn(2, 5, 32)
    with torch.no_grad():
        return all(
            torch.equal(k1, k2) and torch.equal(v1, v2)
            for (k1, v1), (k2, v2) in zip(a(feats, emb)[0], b(feats, emb)[0])
        )


def test_saved_translator_loads_back_with_the_same_outputs(tmp_path):
    """A translator is saved as a folder of config.json and model.safetensors (tensors only, no pickled code) and
    comes back with one call, without the models it was trained for."""
    pair = small_pair()
    cfg = {**TRAIN_DEFAULTS, "hidden": 16, "window": 2, "kind": "mot-latent"}
    torch.manual_seed(0)
    translator = build_translator(pair, cfg).eval()
    save_translator(translator, cfg, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    loaded = KVTranslator.from_pretrained(str(tmp_path))
    assert same_outputs(translator, loaded) and not loaded.training
    assert loaded.training_settings["window"] == 2 and loaded.kind == "mot-latent"
    again, again_cfg = load_translator(pair, str(tmp_path))  # the pipeline's loader reads the same folder
    assert same_outputs(translator, again) and again_cfg["window"] == 2


def test_translator_pt_of_older_versions_still_loads(tmp_path):
    """A folder written the way older versions saved translators (translator.pt by torch.save, translator.json)."""
    pair = small_pair()
    cfg = {**TRAIN_DEFAULTS, "hidden": 16, "window": 2}
    torch.manual_seed(0)
    translator = build_translator(pair, cfg).eval()
    torch.save(translator.state_dict(), tmp_path / "translator.pt")
    (tmp_path / "translator.json").write_text(
        json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()})
    )
    loaded, loaded_cfg = load_translator(pair, str(tmp_path))
    assert same_outputs(translator, loaded) and loaded_cfg["window"] == 2


def test_translator_for_other_models_or_no_translator_is_refused(tmp_path):
    pair = small_pair()
    build_translator(pair, {**TRAIN_DEFAULTS, "hidden": 16}).save_pretrained(str(tmp_path / "t"))
    other = ModelPair(small_model("gpt2", layers=2), None, small_model("qwen2"), None)
    with pytest.raises(ValueError, match="source cache of .*'layers': 3.*this pair's is .*'layers': 2"):
        load_translator(other, str(tmp_path / "t"))
    with pytest.raises(FileNotFoundError, match="config.json / model.safetensors"):
        load_translator(pair, str(tmp_path))


@needs_checkpoints
def test_dtype_reaches_from_pretrained_and_auto_keeps_the_checkpoint_dtype():
    model, _ = load_model("tiny-gpt2", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model, _ = load_model("tiny-gpt2")  # auto: config.json's float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="--dtype must be one of auto, float32, bfloat16, float16, got 'float64'"):
        load_model("tiny-gpt2", dtype="float64")


def test_bad_dtype_is_a_usage_error_naming_the_flag_and_the_values(capsys, tmp_path):
    for command in (["train", "--out", str(tmp_path / "t")], ["eval", "--out", str(tmp_path / "t")]):
        with pytest.raises(SystemExit) as stop:
            main([*command, "--source", "tiny-gpt2", "--target", "tiny-qwen2", "--dtype", "float64"])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and "--dtype" in err and "'auto', 'float32', 'bfloat16', 'float16'" in err
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "t"), "--dtype", "half"])
    assert "--dtype" in capsys.readouterr().err and not (tmp_path / "t").exists()


@needs_checkpoints
def test_a_bfloat16_pair_trains_and_answers_from_a_float32_translator():
    """Models in bfloat16 feed a translator that computes in float32; its cache reaches the target in bfloat16."""
    pair = load_pair("tiny-gpt2", "tiny-qwen2", dtype="bfloat16")
    translator, history, _ = train_translator(pair, log=lambda line: None, steps=2, batch=4, n_train=8, ccl_start=0.0)
    assert translator.w_src.dtype == torch.float32 and all(math.isfinite(history[-1][k]) for k in ("rec", "ccl"))
    data = encode_pair_items(pair, make_dataset(4, seed=7, split="eval"))
    scores = qa_scores(data, "translated", pair, translator)[0]
    assert 0.0 <= scores["acc"] <= 1.0


def check_threads(monkeypatch, argv):
    """The thread counts `main`'s argument checks give torch (before anything loads)."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    parser = build_parser()
    check_args(parser, parser.parse_args(argv))
    return calls


def test_threads_stay_torchs_own_unless_given(monkeypatch, tmp_path):
    pair_args = ["--source", "tiny-gpt2", "--target", "tiny-qwen2", "--out", str(tmp_path)]
    for command in (["train", *pair_args], ["eval", *pair_args, "--modes", "direct"], ["demo", "--out", str(tmp_path)]):
        assert check_threads(monkeypatch, command) == []
        assert check_threads(monkeypatch, [*command, "--threads", "3"]) == [3]
    assert check_threads(monkeypatch, ["pretrain", "--models", "tiny-gpt2", "--out", str(tmp_path)]) == []


def test_demo_workers_share_the_cores_unless_threads_are_given():
    assert worker_threads(3, jobs=2) == 3
    assert worker_threads(None, jobs=2) == max(1, torch.get_num_threads() // 2)
    assert worker_threads(None, jobs=10 * torch.get_num_threads()) == 1


def test_cli_convention_help_on_every_flag_and_comma_lists(capsys, tmp_path):
    """Every flag of every subcommand has a help text, lists are one comma-separated argument, and a bad list item
    is named before anything loads."""
    from kvtranslate.__main__ import build_parser, parse_steps

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(subcommands) == {"pretrain", "train", "eval", "demo"}
    for name, sub in subcommands.items():
        assert sub.prog == f"python -m kvtranslate {name}"
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help"
    args = parser.parse_args(["pretrain", "--models", "tiny-gpt2,tiny-opt", "--out", str(tmp_path)])
    assert args.models == ["tiny-gpt2", "tiny-opt"]
    assert parse_steps("tiny-gpt2=3,tiny-opt=5", ["tiny-gpt2", "tiny-opt"]) == {"tiny-gpt2": 3, "tiny-opt": 5}
    assert parse_steps("7", ["tiny-gpt2"]) == 7
    for argv, flag in (
        (["eval", "--source", "a", "--target", "b", "--out", str(tmp_path / "e"), "--modes", "direct,foo"], "--modes"),
        (
            ["eval", "--source", "a", "--target", "b", "--out", str(tmp_path / "e"), "--modes", "native-keys"],
            "--translator",
        ),
        (["demo", "--out", str(tmp_path / "d"), "--pairs", "tiny-gpt2:tiny-opt"], "--pairs"),
        (["demo", "--out", str(tmp_path / "d"), "--jobs", "0"], "--jobs"),
        (["pretrain", "--models", "tiny-gpt2,tiny-llama", "--out", str(tmp_path / "p")], "--models"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and flag in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in ("e", "d", "p"))
