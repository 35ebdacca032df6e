"""The demo run with pairs side by side (`--jobs 2`) gives exactly the numbers of the one-process run."""

import json
import os

import pytest
import torch

from kvtranslate.demo import run_demo
from kvtranslate.models import CHECKPOINT_DIR, TINY_SPECS

HAVE_CHECKPOINTS = all(os.path.isdir(os.path.join(CHECKPOINT_DIR, n)) for n in TINY_SPECS)
TINY = dict(steps=2, coverage_steps=2, n_train=32, n_eval=6, n_long=2, n_inject=4, n_docs=2)
PAIRS = [("tiny-qwen2-b", "tiny-qwen2"), ("tiny-opt", "tiny-gpt2")]
TIMED = ("translate_ms", "prefill_ms", "timing", "bounds_seconds")  # wall-clock numbers differ run to run


def numbers(folder):
    with open(os.path.join(folder, "summary.json")) as f:
        pairs = json.load(f)["pairs"]
    return {p: {k: v for k, v in r.items() if k not in TIMED} for p, r in pairs.items()}


@pytest.mark.skipif(not HAVE_CHECKPOINTS, reason="run `python -m kvtranslate pretrain` first")
def test_pairs_side_by_side_give_the_one_process_numbers(tmp_path):
    run_demo(str(tmp_path / "one"), quick=True, sizes=TINY, pairs=PAIRS)
    # each worker with this process's thread count, like the one-process run (by default they share the cores)
    run_demo(str(tmp_path / "two"), quick=True, sizes=TINY, pairs=PAIRS, jobs=2, threads=torch.get_num_threads())
    one, two = numbers(tmp_path / "one"), numbers(tmp_path / "two")
    assert list(one) == ["tiny-qwen2-b->tiny-qwen2", "tiny-opt->tiny-gpt2"] == list(two)  # PAIRS order
    assert one == two
    with open(tmp_path / "two" / "demo_log.jsonl") as f:
        lines = [json.loads(line) for line in f]  # every line whole: no process overwrote another's
    assert lines[0]["event"] == "command" and lines[-1]["event"] == "done"
    assert sum(line.get("event") == "trained" for line in lines) == 6  # both workers' lines reach the run's log


@pytest.mark.skipif(not HAVE_CHECKPOINTS, reason="run `python -m kvtranslate pretrain` first")
def test_full_run_log_keeps_every_workers_line(tmp_path, monkeypatch):
    """A run of every pair starts a fresh log; its own lines and the workers' all stay whole."""
    import kvtranslate.demo as demo

    monkeypatch.setattr(demo, "PAIRS", {p: demo.PAIRS[p] for p in PAIRS})  # every pair of a smaller demo
    out = tmp_path / "full"
    out.mkdir()
    (out / "demo_log.jsonl").write_text('{"event": "an earlier run"}\n')
    demo.run_demo(str(out), quick=True, sizes=TINY, jobs=2)
    with open(out / "demo_log.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert lines[0]["event"] == "command" and lines[-1]["event"] == "done"
    assert sum(line.get("event") == "trained" for line in lines) == 6
