"""A saved translator: dtype round trip, config.json checked before anything is built, writes never through links
and never over another run's files."""

import functools
import json
import os

import pytest
import torch

from kvtranslate.__main__ import main
from kvtranslate.config_check import parameter_count
from kvtranslate.models import CHECKPOINT_DIR, TINY_SPECS
from kvtranslate.translators import KINDS, KVTranslator

HAVE_CHECKPOINTS = all(os.path.isdir(os.path.join(CHECKPOINT_DIR, n)) for n in TINY_SPECS)
needs_checkpoints = pytest.mark.skipif(not HAVE_CHECKPOINTS, reason="run `python -m kvtranslate pretrain` first")
SRC = dict(layers=3, kv_heads=4, head_dim=8)
TGT = dict(layers=2, kv_heads=2, head_dim=8)


def small(kind: str = "mot", **kw) -> KVTranslator:
    torch.manual_seed(0)
    return KVTranslator(SRC, TGT, 24, kind=kind, hidden=16, latent=16, window=2, embed_dim=8, **kw)


def test_bfloat16_round_trip_keeps_the_dtype(tmp_path):
    tr = small().to(torch.bfloat16)
    tr.save_pretrained(str(tmp_path / "t"))
    assert json.loads((tmp_path / "t" / "config.json").read_text())["dtype"] == "bfloat16"
    back = KVTranslator.from_pretrained(str(tmp_path / "t"))
    assert back.w_src.dtype == torch.bfloat16 and torch.equal(back.w_src, tr.w_src)
    as_float = KVTranslator.from_pretrained(str(tmp_path / "t"), dtype="float32")
    assert as_float.w_src.dtype == torch.float32 and torch.equal(as_float.w_src, tr.w_src.float())
    assert KVTranslator.from_pretrained(str(tmp_path / "t"), dtype=torch.float16).w_src.dtype == torch.float16


@pytest.mark.parametrize("kind", KINDS)
def test_closed_form_count_equals_the_built_translator(kind):
    tr = small(kind, src_window=2)
    assert parameter_count(tr.config) == sum(p.numel() for p in tr.parameters())


def edited(tmp_path, **changes) -> str:
    folder = str(tmp_path / "t")
    small().save_pretrained(folder)
    path = os.path.join(folder, "config.json")
    config = json.loads(open(path).read())
    config.update(changes)
    os.unlink(path)
    with open(path, "w") as f:
        json.dump(config, f)
    return folder


def test_huge_config_is_refused_before_building(tmp_path, monkeypatch):
    folder = edited(tmp_path, hidden=1_000_000, latent=1_000_000)
    built, init = [], KVTranslator.__init__

    @functools.wraps(init)
    def recording(*args, **kwargs):
        built.append(1)
        init(*args, **kwargs)

    monkeypatch.setattr(KVTranslator, "__init__", recording)
    with pytest.raises(ValueError, match=r"config.json: the settings ask for [\d,]+ parameters"):
        KVTranslator.from_pretrained(folder)
    assert not built


@pytest.mark.parametrize(
    "changes,key",
    [
        (dict(hiden=16), "'hiden' is not a translator setting"),
        (dict(hidden=-4), "hidden must be a whole number"),
        (dict(window=True), "window must be a whole number"),
        (dict(kind="moe"), "kind must be one of"),
        (dict(dtype="int8"), "dtype must be one of"),
        (dict(source_geom=dict(layers=3)), "source_geom must be an object with layers"),
    ],
)
def test_bad_config_key_is_refused_naming_folder_and_key(tmp_path, changes, key):
    folder = edited(tmp_path, **changes)
    with pytest.raises(ValueError, match=key) as caught:
        KVTranslator.from_pretrained(folder)
    assert folder in str(caught.value)


def test_planted_symlinks_are_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "config.json").symlink_to(victim)
    with pytest.raises(FileExistsError, match="symlink"):
        small().save_pretrained(str(folder))
    assert victim.read_text() == "keep"
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(FileExistsError, match="symlink"):
        small().save_pretrained(str(linked))
    assert not os.listdir(tmp_path / "elsewhere")


def test_another_runs_translator_is_not_overwritten_but_own_rewrite_is(tmp_path):
    folder = str(tmp_path / "t")
    small().save_pretrained(folder)
    small().save_pretrained(folder)  # this process's own files: replaced
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")  # another run's result
    with pytest.raises(FileExistsError, match="did not write"):
        small().save_pretrained(str(other))
    assert (other / "config.json").read_text() == "{}"
    assert not [n for n in os.listdir(other) if n.endswith(".tmp")]


@needs_checkpoints
def test_eval_does_not_write_through_a_planted_eval_json_link(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval.json").symlink_to(victim)
    args = ["eval", "--source", "tiny-gpt2", "--target", "tiny-qwen2", "--modes", "no-context", "--n", "2"]
    with pytest.raises(FileExistsError, match="symlink"):
        main([*args, "--out", str(out)])
    assert victim.read_text() == "keep"
    main([*args, "--out", str(tmp_path / "fresh")])  # a fresh folder is written
    assert "no-context" in json.loads((tmp_path / "fresh" / "eval.json").read_text())
    with pytest.raises(FileExistsError, match="did not write"):  # an earlier run's results are kept
        (tmp_path / "earlier").mkdir()
        (tmp_path / "earlier" / "eval.json").write_text("{}")
        main([*args, "--out", str(tmp_path / "earlier")])
    assert (tmp_path / "earlier" / "eval.json").read_text() == "{}"
