"""Files `fl_app.deploy` writes: `certs --force` (and key pairs) replace a set all or nothing, new folders are private
(0700), and the `flwr` connection is edited in config.toml line by line, keeping the user's comments and never writing
through a symlink. No network."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import tomllib

import pytest

from fl_app import deploy
from tests.harness import deployment as harness


def _snapshot(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _fail_on_call(monkeypatch, module, name: str, failing_call: int, error: OSError, only=lambda *a: True):
    """Make ``module.name`` raise ``error`` on its ``failing_call``-th call that ``only`` selects."""
    real, calls = getattr(module, name), []

    def wrapper(*args, **kwargs):
        if only(*args):
            calls.append(args)
            if len(calls) == failing_call:
                raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _creates(path, flags, *rest) -> bool:
    return bool(flags & os.O_CREAT)


def test_certs_force_keeps_the_old_set_when_writing_fails_midway(tmp_path, monkeypatch):
    certs = tmp_path / "certs"
    deploy.make_certs(certs)
    before = _snapshot(certs)
    disk_full = OSError(errno.ENOSPC, "No space left on device")
    _fail_on_call(monkeypatch, os, "open", 3, disk_full, only=_creates)  # the third file of the new set
    with pytest.raises(OSError, match="No space left"):
        deploy.make_certs(certs, force=True)
    monkeypatch.undo()
    assert _snapshot(certs) == before  # every old file intact, no staging folder left behind

    deploy.make_certs(certs, force=True)  # and the same request succeeds once the disk has room
    after = _snapshot(certs)
    assert sorted(after) == sorted(before) and all(after[name] != before[name] for name in before)


def test_certs_force_puts_the_old_files_back_when_a_rename_fails(tmp_path, monkeypatch):
    certs = tmp_path / "certs"
    deploy.make_certs(certs)
    before = _snapshot(certs)
    _fail_on_call(monkeypatch, os, "replace", 3, OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OSError, match="Input/output error"):
        deploy.make_certs(certs, force=True)
    monkeypatch.undo()
    assert _snapshot(certs) == before


def test_node_keys_are_written_as_one_set(tmp_path, monkeypatch):
    keys = tmp_path / "keys"
    _fail_on_call(monkeypatch, os, "open", 4, OSError(errno.ENOSPC, "No space left on device"), only=_creates)
    with pytest.raises(OSError):
        deploy.make_node_keys(keys, 3)
    monkeypatch.undo()
    assert not keys.exists() or os.listdir(keys) == []  # no first pair without the others


def test_new_deploy_folders_are_created_0700(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    old_umask = os.umask(0)  # a permissive umask must not open them up
    try:
        deploy.make_certs(tmp_path / "a" / "certs")
        deploy.make_node_keys(existing / "keys", 1)
        deploy.write_connection(tmp_path / "home" / "flwr", "deployment", "127.0.0.1:9093", insecure=True)
        proc = harness.start_process([sys.executable, "-c", "print('ok')"], tmp_path / "node" / "logs" / "n.log")
        proc.wait(timeout=60)
    finally:
        os.umask(old_umask)
    for folder in ("a", "a/certs", "existing/keys", "home", "home/flwr", "node", "node/logs"):
        assert _mode(tmp_path / folder) == 0o700, folder
    assert _mode(existing) == 0o755  # a folder that was there is left as it is
    assert _mode(tmp_path / "home" / "flwr" / "config.toml") == 0o600
    assert _mode(tmp_path / "node" / "logs" / "n.log") == 0o600
    assert (tmp_path / "node" / "logs" / "n.log").read_text() == "ok\n"


def test_a_symlink_at_a_log_file_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node.log").symlink_to(victim)
    with pytest.raises(OSError):
        harness.start_process([sys.executable, "-c", "print('x')"], tmp_path / "logs" / "node.log")
    assert victim.read_text() == "precious\n"


USER_CONFIG = """\
# my Flower settings: keep these notes
[superlink]
default = "local"  # the simulation

[superlink.local]
address = ":local:"
options.num-supernodes = 4   # Flower's own dotted keys

# the lab's SuperLink, reached through the VPN
[superlink.lab]
address = "10.0.0.1:9093"
root-certificates = "/etc/lab/ca.crt"
enable-account-auth = false
# end of file
"""


def test_connection_keeps_the_users_comments_and_settings(tmp_path):
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text(USER_CONFIG)
    ca = tmp_path / "ca.crt"
    ca.write_text("x")

    deploy.write_connection(home, "deployment", "127.0.0.1:9093", ca)
    text = (home / "config.toml").read_text()
    assert text.startswith(USER_CONFIG)  # a new connection is appended; nothing above it changes
    config = tomllib.loads(text)["superlink"]
    assert config["deployment"] == {"address": "127.0.0.1:9093", "root-certificates": str(ca.resolve())}
    assert config["default"] == "local" and config["local"]["options"] == {"num-supernodes": 4}

    # updating a connection rewrites its address lines only; its comment and other keys stay
    deploy.write_connection(home, "lab", "10.0.0.2:9093", insecure=True, default=True)
    text = (home / "config.toml").read_text()
    for line in USER_CONFIG.splitlines():
        if not line.startswith(('address = "10.0.0.1', "root-certificates", "default = ")):
            assert line in text.splitlines(), line
    config = tomllib.loads(text)["superlink"]
    assert config["lab"] == {"address": "10.0.0.2:9093", "insecure": True, "enable-account-auth": False}
    assert config["default"] == "lab" and config["deployment"]["address"] == "127.0.0.1:9093"


def test_a_fresh_connection_file_is_laid_out_like_flowers(tmp_path):
    path = deploy.write_connection(tmp_path / "home", "deployment", "127.0.0.1:9093", insecure=True)
    config = tomllib.loads(path.read_text())
    assert config == {
        "superlink": {
            "default": "local",
            "local": {"address": ":local:"},
            "deployment": {"address": "127.0.0.1:9093", "insecure": True},
        }
    }
    assert path.read_text().startswith('[superlink]\ndefault = "local"\n')


def test_connection_refuses_a_symlinked_config_and_leaves_its_target_alone(tmp_path, capsys):
    victim = tmp_path / "victim.toml"
    victim.write_text("# not Flower's\n[superlink]\ndefault = 'local'\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").symlink_to(victim)
    with pytest.raises(ValueError, match="config.toml is a symbolic link"):
        deploy.write_connection(home, "deployment", "127.0.0.1:9093", insecure=True)
    with pytest.raises(SystemExit) as exit_:
        deploy.main(["connection", "d", "--address", "127.0.0.1:9093", "--insecure", "--flwr-home", str(home)])
    assert exit_.value.code == 2 and "symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "# not Flower's\n[superlink]\ndefault = 'local'\n"
    assert (home / "config.toml").is_symlink()


@pytest.mark.parametrize(
    "layout",
    [
        'superlink = { default = "local", local = { address = ":local:" } }\n',  # inline tables
        '[superlink]\ndefault = "local"\nlocal.address = ":local:"\ndeployment.address = "x:1"\n',  # dotted keys
    ],
)
def test_a_layout_the_line_edit_cannot_handle_is_refused_unchanged(tmp_path, layout):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(layout)
    with pytest.raises(ValueError, match=r"add it by hand:\n\[superlink\.deployment\]"):
        deploy.write_connection(home, "deployment", "127.0.0.1:9093", insecure=True)
    assert (home / "config.toml").read_text() == layout


@pytest.mark.parametrize("name", ["default", "my lab", 'x"]\nbad = 1', "", "a.b"])
def test_connection_names_are_bare_toml_keys(tmp_path, name):
    with pytest.raises(ValueError, match="connection name"):
        deploy.write_connection(tmp_path / "home", name, "127.0.0.1:9093", insecure=True)
    assert not (tmp_path / "home" / "config.toml").exists()


def test_the_cli_writes_the_connection(tmp_path):
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-m", "fl_app.deploy", "connection", "t", "--address", "127.0.0.1:9", "--insecure"],
        env={**os.environ, "FLWR_HOME": str(home)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert tomllib.loads((home / "config.toml").read_text())["superlink"]["t"]["insecure"] is True
