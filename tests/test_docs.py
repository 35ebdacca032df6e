"""The documentation follows the code: docs/run-config.md is what the registry makes, and the command-line tools
follow the one convention (``python -m`` usage, help and default on every flag, ``--out``, comma lists, Flower's
run-config syntax, JSON on stdout with a table on stderr)."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pytest

from fl_app.io.cli import HelpFormatter, comma_list, print_json, run_config_overrides
from fl_app.run import config_reference
from fl_app.run.config import KEYS, Key, Range

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "run-config.md"

TOOLS = (
    "fl_app.extract",
    "fl_app.deploy",
    "fl_app.report",
    "fl_app.run.config_reference",
    "experiments.runner",
    "experiments.studies.compare",
    "experiments.studies.gamma",
    "experiments.studies.fedtopo_compare",
    "experiments.studies.fedtopo_inprocess",
    "experiments.studies.method_traffic",
    "experiments.studies.traffic",
    "experiments.studies.frontier",
    "experiments.studies.split_difference",
    "experiments.studies.validation_choice",
    "experiments.tools.search_subnets",
    "experiments.studies.train_supernet",
    "experiments.tools.make_sample",
    "experiments.benchmarks.bench_aggregate",
    "experiments.benchmarks.bench_compile",
    "experiments.benchmarks.bench_default_run",
    "experiments.benchmarks.bench_lanes",
    "experiments.benchmarks.bench_overhead",
    "experiments.benchmarks.bench_scale",
    "experiments.benchmarks.bench_startup",
    "experiments.benchmarks.bench_traffic",
    "experiments.benchmarks.bench_train",
    "experiments.benchmarks.phase_table",
    "experiments.benchmarks.gpu_check_feast",
)
OTHER_OUTPUT_NAMES = {"--output", "--output-dir", "--out-dir", "--outdir", "-o"}


def test_run_config_reference_is_current():
    text = REFERENCE.read_text()
    assert config_reference.render(text) == text, (
        "stale: python -m fl_app.run.config_reference --out docs/run-config.md"
    )


def test_reference_follows_a_changed_registry_and_keeps_the_prose(tmp_path):
    keys = {
        **KEYS,
        "lr": Key(0.2, KEYS["lr"].help, check=KEYS["lr"].check),
        "new-knob": Key(3, "a knob", check=Range(0, 5)),
    }
    current = REFERENCE.read_text()
    changed = config_reference.render(current, keys)
    assert "| `lr` | `0.2` | in (0, 10] | local SGD learning rate |" in changed
    assert changed.rstrip().endswith(current.rstrip().split(config_reference.END, 1)[1].strip())  # notes kept
    assert "| `new-knob` | `3` | in [0, 5] | a knob |\n" + config_reference.END in changed
    assert changed.split(config_reference.START)[0] == current.split(config_reference.START)[0]  # intro kept

    out = tmp_path / "run-config.md"
    out.write_text("# Run config\n\nhand-written intro\n\n" + config_reference.START + "\nold\n" + config_reference.END)
    assert config_reference.main(["--out", str(out), "--check"]) == 1
    assert config_reference.main(["--out", str(out)]) == 0
    assert config_reference.main(["--out", str(out), "--check"]) == 0
    assert out.read_text().startswith("# Run config\n\nhand-written intro\n\n")
    assert f"| `seed` | `0` | {KEYS['seed'].check.rule} |" in out.read_text()


def test_comma_lists_and_run_config_overrides_parse_like_flower():
    assert comma_list(int)("0, 1,2") == [0, 1, 2]
    for bad in ("0,,1", "0,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="comma-separated list of int"):
            comma_list(int)(bad)
    assert run_config_overrides("num-server-rounds=8 data-path='/a b' lr=0.1 routing=false") == {
        "num-server-rounds": 8,
        "data-path": "/a b",
        "lr": 0.1,
        "routing": False,
    }
    with pytest.raises(argparse.ArgumentTypeError, match="'eval-every' is not KEY=VALUE"):
        run_config_overrides("num-server-rounds=8 eval-every")
    with pytest.raises(argparse.ArgumentTypeError, match="values are TOML"):
        run_config_overrides("method=feast")  # an unquoted string
    assert run_config_overrides(str(ROOT / "experiments/conf/fedtopo-cifar10.toml"))["method"] == "fedtopo"


def test_json_goes_to_stdout_and_its_table_to_stderr(capsys):
    print_json({"ratio": 7.4}, [{"payload": "float32", "ratio": 7.4}, {"payload": "bfloat16", "ratio": 14.78}])
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ratio": 7.4}
    assert err.splitlines() == ["payload   ratio", "float32   7.4", "bfloat16  14.78"]


def parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


@pytest.mark.parametrize("module", TOOLS)
def test_tool_follows_the_command_line_convention(module):
    parser = importlib.import_module(module).build_parser()
    assert parser.prog == f"python -m {module}"
    for each in parsers(parser):
        assert each.formatter_class is HelpFormatter, each.prog
        formatter = each._get_formatter()
        for action in each._actions:
            if (
                isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
                or action.help == argparse.SUPPRESS
            ):
                continue
            name = action.option_strings[-1] if action.option_strings else action.dest
            assert action.help, f"{each.prog} {name}: no help text"
            assert not set(action.option_strings) & OTHER_OUTPUT_NAMES, f"{each.prog} {name}: the output flag is --out"
            assert not (action.option_strings and action.nargs in ("+", "*")), (
                f"{each.prog} {name}: a list is one comma-separated argument"
            )
            if action.option_strings and action.default is not None and not action.required:
                assert "(default: " in formatter._expand_help(action), f"{each.prog} {name}: default not shown"
            if name == "--run-config":
                assert action.type is run_config_overrides, f"{each.prog} {name}: Flower's run-config syntax"


def test_every_generated_block_names_the_command_that_regenerates_it():
    import subprocess

    from fl_app.io.markdown import generated_blocks

    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    blocks = [
        (path, name, command)
        for path in tracked.stdout.split()
        for name, command in generated_blocks((ROOT / path).read_text())
    ]
    assert len(blocks) > 50  # the READMEs' blocks are read, report tables included
    bare = [f"{path}: {name}" for path, name, command in blocks if not command.startswith("python -m ")]
    assert bare == [], "a generated block without its command: <!-- generated:NAME (python -m ...) -->"


def test_a_start_marker_keeps_its_command_and_a_bare_one_still_reads():
    from fl_app.io.markdown import block_body, generated_blocks, replace_block, replace_each

    named = "a\n<!-- generated:x (python -m tool --out f) -->\nold\n<!-- /generated:x -->\nz\n"
    assert replace_block(named, "x", "new") == named.replace("old", "new")
    assert block_body(named, "x") == "old" and generated_blocks(named) == [("x", "python -m tool --out f")]
    bare = "<!-- generated:x -->\nold\n<!-- /generated:x -->"
    assert replace_block(bare, "x", "new") == bare.replace("old", "new") and generated_blocks(bare) == [("x", "")]
    two = named + named.replace("--out f", "--out g")
    text, count = replace_each(two, "x", lambda command: command.split()[-1])
    assert count == 2 and [block_body(part, "x") for part in text.split("z\n")[:2]] == ["f", "g"]
    assert replace_block("`<!-- generated:x (python -m t) -->` in prose", "x", "new") is None
