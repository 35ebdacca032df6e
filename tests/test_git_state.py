"""experiments/tools/git_state.py: the commit and the dirty flag that run.json and kvtranslate's study rows record,
on a scratch git repository. Dirty: a tracked file (under the paths asked about) differs from HEAD; untracked files
never count."""

from __future__ import annotations

import subprocess

from experiments.runner.records import recorded_git_state
from experiments.tools.git_state import git_state


def git(cwd, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def scratch_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kvtranslate").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "kvtranslate" / "a.py").write_text("x = 1\n")
    (repo / "other.py").write_text("y = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    return repo, git(repo, "rev-parse", "HEAD").strip()


def test_outside_a_checkout_nothing_is_known(tmp_path):
    assert git_state(tmp_path) == (None, None)
    assert recorded_git_state(tmp_path) == ("unknown", True)  # run.json's form: nothing says the code is committed


def test_a_clean_checkout_is_not_dirty_and_untracked_files_never_count(tmp_path):
    repo, commit = scratch_repo(tmp_path)
    assert git_state(repo) == (commit, False)
    assert recorded_git_state(repo) == (commit, False)
    (repo / "notes.txt").write_text("new")
    (repo / "kvtranslate" / "b.py").write_text("new\n")  # untracked, even inside the paths asked about
    (repo / "results").mkdir()
    (repo / "results" / "metrics.csv").write_text("round\n1\n")  # a run's outputs inside the checkout
    assert git_state(repo) == (commit, False)
    assert git_state(repo, ("kvtranslate",)) == (commit, False)


def test_a_changed_staged_or_deleted_tracked_file_is_dirty_within_the_paths_asked_about(tmp_path):
    repo, commit = scratch_repo(tmp_path)
    (repo / "other.py").write_text("y = 2\n")  # outside the paths asked about
    assert git_state(repo, ("kvtranslate",)) == (commit, False)
    assert git_state(repo) == (commit, True)  # the whole checkout
    assert recorded_git_state(repo) == (commit, True)
    git(repo, "checkout", "--", "other.py")
    (repo / "kvtranslate" / "a.py").write_text("x = 2\n")
    git(repo, "add", "kvtranslate/a.py")  # staged, not committed
    assert git_state(repo, ("kvtranslate",)) == (commit, True)
    git(repo, "commit", "-q", "-m", "two")
    assert git_state(repo, ("kvtranslate",)) == (git(repo, "rev-parse", "HEAD").strip(), False)
    (repo / "kvtranslate" / "a.py").unlink()
    assert git_state(repo, ("kvtranslate",))[1] is True
