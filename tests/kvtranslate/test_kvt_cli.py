"""Command-line safety: the committed checkpoints are only replaced when asked to, devices and threads are checked
before anything loads, unsupported model families are named, saved translators load back (tensors only)."""

import argparse
import os

import pytest
import torch
from kvt_helpers import small_model
from transformers import LlamaConfig

from kvtranslate.__main__ import main, pretrain_log_path
from kvtranslate.models import CHECKPOINT_DIR, RESULTS_DIR, ModelPair, family_of, load_model, pick_device
from kvtranslate.pipeline import build_translator, load_translator, save_translator
from kvtranslate.train import TRAIN_DEFAULTS


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
    with pytest.raises(SystemExit):  # no --out at all: there is no default folder to overwrite
        main(["pretrain", "--models", "tiny-qwen2", "--steps", "1"])
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


def test_saved_translator_loads_back_with_the_same_outputs(tmp_path):
    pair = ModelPair(small_model("gpt2", layers=3), None, small_model("qwen2"), None)  # no tokenizer needed here
    cfg = {**TRAIN_DEFAULTS, "hidden": 16, "window": 2}
    torch.manual_seed(0)
    translator = build_translator(pair, cfg).eval()
    save_translator(translator, cfg, str(tmp_path))
    loaded, loaded_cfg = load_translator(pair, str(tmp_path))
    feats, emb = torch.randn(2, 5, 3, 2 * 32), torch.randn(2, 5, 32)
    with torch.no_grad():
        for (k1, v1), (k2, v2) in zip(translator(feats, emb)[0], loaded(feats, emb)[0]):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert loaded_cfg["window"] == 2


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
