"""The results index: every committed results folder listed with its title, suite, commits and the documents that
cite it; the committed block is what the study writes."""

from __future__ import annotations

import json
import subprocess

from experiments.studies import results_index


def _repo(tmp_path):
    results = tmp_path / "experiments/results"
    (results / "suite-run/runs/feast/seed0").mkdir(parents=True)
    (results / "suite-run/README.md").write_text("# A suite | with a bar\n\ntext\n")
    (results / "suite-run/suite.json").write_text(json.dumps({"suite": "experiments/suites/x.toml"}))
    (results / "suite-run/runs/feast/seed0/run.json").write_text(json.dumps({"commit": "abcdef0123"}))
    (results / "suite-run-old/runs/feast").mkdir(parents=True)
    (results / "suite-run-old/runs/feast/summary.json").write_text("{}")
    (tmp_path / "README.md").write_text("see [it](experiments/results/suite-run/README.md)\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.md").write_text("`results/suite-run-old/` and results/suite-runner (another name)\n")
    (results / "suite-run/NOTES.md").write_text("results/suite-run cites itself\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    return tmp_path


def test_each_folder_is_listed_with_its_suite_commits_and_the_documents_citing_it(tmp_path):
    rows = {row["folder"]: row for row in results_index.index_rows(_repo(tmp_path))}
    assert rows["suite-run"] == {
        "folder": "suite-run",
        "what": "A suite \\| with a bar",
        "suite": "experiments/suites/x.toml",
        "commits": ["abcdef0"],
        "cited by": ["README.md"],  # not its own NOTES.md
    }
    assert rows["suite-run-old"]["commits"] == ["unrecorded"]
    assert rows["suite-run-old"]["what"] == "(no README)"
    assert rows["suite-run-old"]["cited by"] == ["docs/a.md"]  # 'suite-runner' names another folder
    text = results_index.index_text(list(rows.values()))
    assert text.count("\n| [") == 2


def test_every_committed_results_folder_has_a_readme_and_the_index_is_current():
    rows = results_index.index_rows()
    assert [row["folder"] for row in rows if row["what"] == "(no README)"] == []
    assert results_index.main(["--check"]) == 0
