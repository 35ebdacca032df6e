"""No file the project writes is redirected or lost: every writer creates its file without following a symlink
planted at the final name or at a temporary name (the old fixed ``NAME.tmp`` / ``NAME.partial`` and the random one),
replaces only a file this run wrote, and a run's output folder or its clients' model files are never another run's."""

from __future__ import annotations

import csv
import io
import itertools
import json
import secrets

import pytest
import torch

from experiments.runner.in_process_grid import run_in_process
from fl_app.run.config import validate_run_config
from tests.harness.in_process import TINY_RUN, CrashingGrid

FORCED = "f0f0f0f0f0f0"  # the first random temporary-name part handed out (token_hex(6): 12 hex digits)
VICTIM = b"a file the writer must never touch\n"
TINY = {**TINY_RUN, "checkpoint-every": 2}


# -- the writers, each writing its file into a folder ---------------------------------------------------------------
def _summary(folder):
    from fl_app.run.outputs import write_json

    write_json(folder / "summary.json", {"completed": True})


def _metrics(folder):
    from fl_app.run.outputs import write_csv

    write_csv(folder / "metrics.csv", [{"round": 1, "accuracy": 0.5}])


def _rounds(folder):
    from fl_app.run.outputs import write_round_files

    write_round_files(folder, [{"round": 1, "accuracy": 0.5}], {})


def _clients(folder):
    from fl_app.run.outputs import ClientRecords, write_round_files

    write_round_files(folder, [{"round": 1, "accuracy": 0.5}], {}, ClientRecords({0: 100}))


def _round_plot(folder):
    from fl_app.run.outputs import plot_accuracy_per_round

    plot_accuracy_per_round(folder / "accuracy_per_round.png", {"fedtopo": [(1, 0.5), (2, 0.6)]}, "t")


def _macs_plot(folder):
    from fl_app.run.outputs import plot_accuracy_vs_macs

    plot_accuracy_vs_macs(folder / "accuracy_vs_macs.png", {"feast": [(1e6, 0.5), (2e6, 0.6)]}, "t")


def _checkpoint(folder):
    from fl_app.run.checkpoint import model_fingerprint, save_verified

    save_verified(folder / "checkpoint.pt", {"x": torch.zeros(2)}, model_fingerprint(validate_run_config({}), {}))


def _client_model(folder):
    from fl_app.models.multiarch import client_model
    from fl_app.run.checkpoint import save_model_file

    run = validate_run_config({"method": "fedtopo", "checkpoint-every": 1})
    save_model_file(run, 0, 3, client_model(run["model-family"], 0, 10, run["feature-dim"]), str(folder), 1)


def _subnet_cache(folder):
    from experiments.tools.search_subnets import main

    main(["--targets", "2", "--out", str(folder / "cache.csv")])


def _run_config_reference(folder):
    from fl_app.run import config_reference

    assert config_reference.main(["--out", str(folder / "run-config.md")]) == 0


WRITERS = {
    "summary.json": _summary,
    "metrics.csv": _metrics,
    "rounds.csv": _rounds,
    "clients.csv": _clients,
    "accuracy_per_round.png": _round_plot,
    "accuracy_vs_macs.png": _macs_plot,
    "checkpoint.pt": _checkpoint,
    "partition-0-round-1.pt": _client_model,
    "cache.csv": _subnet_cache,
    "run-config.md": _run_config_reference,
}


@pytest.fixture
def forced_temp_name(monkeypatch):
    """The first random name part any writer draws is FORCED (a name an attacker planted), later ones are fresh."""
    counter = itertools.count()

    def token_hex(nbytes=None):
        drawn = next(counter)
        return FORCED if drawn == 0 else f"{drawn:0{2 * (nbytes or 32)}x}"

    monkeypatch.setattr(secrets, "token_hex", token_hex)


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_symlink_at_the_final_name_is_never_followed_nor_replaced(tmp_path, name, dangling):
    folder, victim = tmp_path / "out", tmp_path / "victim"
    folder.mkdir()
    if not dangling:
        victim.write_bytes(VICTIM)
    (folder / name).symlink_to(victim)
    with pytest.raises((FileExistsError, SystemExit)):
        WRITERS[name](folder)
    assert (folder / name).is_symlink() and (folder / name).readlink() == victim  # the link is kept
    if dangling:
        assert not victim.exists()  # never created through the link
    else:
        assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("name", list(WRITERS))
def test_symlinks_at_the_temporary_names_are_never_written_through(tmp_path, name, forced_temp_name):
    folder = tmp_path / "out"
    folder.mkdir()
    planted = [f"{name}.tmp", f"{name}.partial", f".{name}.{FORCED}.tmp"]
    for i, link in enumerate(planted):
        (tmp_path / f"victim{i}").write_bytes(VICTIM)
        (folder / link).symlink_to(tmp_path / f"victim{i}")
    WRITERS[name](folder)
    written = folder / name
    assert written.is_file() and not written.is_symlink() and written.stat().st_size > 0
    for i, link in enumerate(planted):
        assert (tmp_path / f"victim{i}").read_bytes() == VICTIM, link
        assert (folder / link).is_symlink(), link  # not consumed either
    left = [p.name for p in folder.iterdir() if p.name not in planted and (p.name.startswith(".") or "tmp" in p.name)]
    assert left == []  # no temporary file left behind


def test_round_files_replace_only_what_this_run_wrote(tmp_path):
    """metrics.csv, rounds.csv and clients.csv are rewritten after every round; a file put in their place since
    (another run's, or a symlink) is kept and the rewrite refused."""
    from fl_app.run.outputs import ClientRecords, write_round_files

    records = ClientRecords({0: 100})
    write_round_files(tmp_path, [{"round": 1, "accuracy": 0.5}], {}, records)
    write_round_files(tmp_path, [{"round": 1, "accuracy": 0.5}, {"round": 2, "accuracy": 0.6}], {}, records)
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 3

    other = tmp_path / "other.csv"
    other.write_text("another run's metrics\n")
    other.replace(tmp_path / "metrics.csv")
    with pytest.raises(FileExistsError, match="metrics.csv exists and was not written by this run"):
        write_round_files(tmp_path, [{"round": 3, "accuracy": 0.7}], {}, records)
    assert (tmp_path / "metrics.csv").read_text() == "another run's metrics\n"

    (tmp_path / "victim").write_bytes(VICTIM)
    (tmp_path / "clients.csv").unlink()
    (tmp_path / "clients.csv").symlink_to(tmp_path / "victim")
    (tmp_path / "metrics.csv").unlink()
    with pytest.raises(FileExistsError, match="clients.csv"):
        write_round_files(tmp_path, [{"round": 3, "accuracy": 0.7}], {}, records)
    assert (tmp_path / "victim").read_bytes() == VICTIM and (tmp_path / "clients.csv").is_symlink()


def test_a_round_checkpoint_replaces_only_the_file_this_run_wrote(tmp_path):
    """checkpoint.pt is rewritten every N rounds; one another run (same run config) wrote there is kept."""
    from fl_app.run.checkpoint import write_round_checkpoint

    run = validate_run_config({"num-server-rounds": 6})
    write_round_checkpoint(tmp_path, 1, run, 3, {}, {}, {})
    write_round_checkpoint(tmp_path, 2, run, 3, {}, {}, {})  # this run's own earlier round: replaced

    other = tmp_path / "other"
    other.mkdir()
    write_round_checkpoint(other, 2, run, 3, {}, {}, {})
    theirs = (other / "checkpoint.pt").read_bytes()
    (other / "checkpoint.pt").unlink()
    (other / "checkpoint.pt").write_bytes(theirs)  # as another process of a run with the same config leaves it
    with pytest.raises(FileExistsError, match="another run"):
        write_round_checkpoint(other, 4, run, 3, {}, {}, {})
    assert (other / "checkpoint.pt").read_bytes() == theirs


def test_csv_and_json_bytes_are_as_before(tmp_path):
    """Only the way bytes reach the disk changed: the same rows give the bytes ``csv`` and ``json`` always wrote."""
    from fl_app.run.outputs import write_csv, write_json

    rows = [{"round": 1, "accuracy": 0.123456789, "name": 'a "quoted", text'}, {"round": 2, "accuracy": float("nan")}]
    write_csv(tmp_path / "m.csv", rows)
    expected = io.StringIO(newline="")
    writer = csv.DictWriter(expected, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    assert (tmp_path / "m.csv").read_bytes() == expected.getvalue().encode()
    write_json(tmp_path / "s.json", {"a": [1, 2.5], "b": None})
    assert (tmp_path / "s.json").read_text() == json.dumps({"a": [1, 2.5], "b": None}, indent=2) + "\n"


def test_a_planted_symlink_at_a_run_log_is_never_written_through(tmp_path, monkeypatch):
    import experiments.runner.flower_runs as flower_runs

    def no_run(*args, **kwargs):
        raise AssertionError("flwr run started although the log could not be created safely")

    monkeypatch.setattr(flower_runs.subprocess, "run", no_run)
    (tmp_path / "victim").write_bytes(VICTIM)
    (tmp_path / "run.log").symlink_to(tmp_path / "victim")
    with pytest.raises(FileExistsError, match="run.log"):
        flower_runs.flwr_run({"method": "feast"}, log_file=tmp_path / "run.log")
    assert (tmp_path / "victim").read_bytes() == VICTIM


# -- output folders ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "held", ["clients.csv", "client-models", "accuracy_per_round.png", "summary.json (a dangling link)"]
)
def test_an_output_folder_holding_another_runs_files_is_refused(tmp_path, held):
    from fl_app.run.outputs import prepare_output_dir

    name = held.split(" ")[0]
    if held == "client-models":
        (tmp_path / name).mkdir()
    elif "link" in held:
        (tmp_path / name).symlink_to(tmp_path / "nowhere")
    else:
        (tmp_path / name).write_text("another run's\n")
    with pytest.raises(ValueError, match=f"already holds results \\({name}\\)"):
        prepare_output_dir(str(tmp_path), "fedtopo", "cifar10", 0)


def test_a_model_heterogeneous_run_refuses_a_folder_with_another_runs_client_models(flower_ids, tmp_path):
    (tmp_path / "client-models").mkdir()
    (tmp_path / "client-models" / "partition-0-round-1.pt").write_bytes(b"another run's model")
    run = validate_run_config({**TINY, "method": "fedtopo", "output-dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"already holds results \(client-models\)"):
        run_in_process(run, 3)
    assert (tmp_path / "client-models" / "partition-0-round-1.pt").read_bytes() == b"another run's model"


# -- FedTopo-family client model files in a node's state-dir -------------------------------------------------------


class StateDirGrid(CrashingGrid):
    """Every node keeps its model files in its own ``state-dir`` (a deployment's node config), one per node and
    shared by every run on it; the server dies when it sends round ``crash_round``."""

    def __init__(self, run, num_clients, state_root, crash_round=None):
        super().__init__(run, num_clients, crash_round)
        for pid, context in self.contexts.items():
            context.node_config["state-dir"] = str(state_root / f"node-{pid}")


def test_another_run_on_the_same_nodes_never_replaces_a_runs_client_model_files(flower_ids, tmp_path):
    def run_of(name, **overrides):
        return validate_run_config({**TINY, "method": "fedtopo", "output-dir": str(tmp_path / name), **overrides})

    straight = run_in_process(run_of("straight"), 3, StateDirGrid(run_of("straight"), 3, tmp_path / "own-state"))
    shared = tmp_path / "state"
    with pytest.raises(RuntimeError, match="the server died"):
        run_in_process(run_of("first"), 3, StateDirGrid(run_of("first"), 3, shared, crash_round=3))
    # another run (another seed) on the same nodes while the first waits for its resume: same rounds, same node
    run_in_process(run_of("second", seed=1), 3, StateDirGrid(run_of("second", seed=1), 3, shared))
    resume = run_of("first-resumed", **{"resume-from": str(tmp_path / "first")})
    resumed = run_in_process(resume, 3, StateDirGrid(resume, 3, shared))  # fresh node states: only the files remain
    assert resumed["history"] == straight["history"]
    folders = {p.name for node in shared.iterdir() for p in node.iterdir()}
    assert len(folders) == 2 and all(name.startswith("run-") for name in folders)  # one folder per run


def test_a_client_model_file_of_another_run_is_neither_replaced_nor_resumed_from(tmp_path):
    from fl_app.models.multiarch import client_model
    from fl_app.run.checkpoint import client_model_file, restore_model_file, save_model_file

    run = validate_run_config({"method": "fedtopo", "checkpoint-every": 1})

    def model(seed):
        torch.manual_seed(seed)
        return client_model(run["model-family"], 0, 10, run["feature-dim"])

    save_model_file(run, 0, 3, model(0), str(tmp_path), 1, "run-a")
    before = client_model_file(str(tmp_path), 0, 1).read_bytes()
    with pytest.raises(FileExistsError, match="another run"):
        save_model_file(run, 0, 3, model(1), str(tmp_path), 1, "run-b")
    assert client_model_file(str(tmp_path), 0, 1).read_bytes() == before
    with pytest.raises(ValueError, match="saved by another run"):
        restore_model_file(run, 0, 3, model(2), str(tmp_path), 1, "run-b")
    save_model_file(run, 0, 3, model(3), str(tmp_path), 1, "run-a")  # the same run training that round again
    restored = model(4)
    assert restore_model_file(run, 0, 3, restored, str(tmp_path), 1, "run-a")
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), model(3).state_dict().values()))
