"""Deployment helpers with hostile or careless input: private keys are created 0600 atomically and never silently
replaced (nor written through a planted symlink), host names and certificate lifetimes are checked, the insecure
local-test mode stays on loopback unless told loudly, and the printed recipe quotes every path. No network."""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import stat

import pytest
from cryptography import x509

import fl_app.io.files
from fl_app import deploy


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _snapshot(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def open_calls(monkeypatch):
    """Every os.open that fl_app.io.files makes: (path, flags, mode)."""
    calls, real_open = [], os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        calls.append((str(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(fl_app.io.files.os, "open", spy)
    return calls


def test_private_keys_are_created_0600_atomically(tmp_path, open_calls):
    old_umask = os.umask(0)  # a permissive umask must not widen what is asked for
    try:
        paths = deploy.make_certs(tmp_path / "certs")
        ((private, public),) = deploy.make_node_keys(tmp_path / "keys", 1)
    finally:
        os.umask(old_umask)
    for key in (paths["key"], tmp_path / "certs" / "ca.key", private):
        assert _mode(key) == 0o600, key
    for cert in (paths["ca"], paths["cert"], public):
        assert _mode(cert) == 0o644, cert
    exclusive = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    created = [(path, mode) for path, flags, mode in open_calls if flags & exclusive == exclusive]
    assert len(created) == 6  # every file is born with O_CREAT|O_EXCL|O_NOFOLLOW and its final mode
    for name in ("ca.key", "server.key", "supernode-0"):
        temp_name = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{12}}\.tmp")
        assert [mode for path, mode in created if temp_name.fullmatch(os.path.basename(path))] == [0o600]
    assert sorted(os.listdir(tmp_path / "certs")) == ["ca.crt", "ca.key", "server.key", "server.pem"]  # no temp files


def test_existing_ca_and_node_keys_are_never_silently_replaced(tmp_path, capsys):
    deploy.make_certs(tmp_path / "certs")
    deploy.make_node_keys(tmp_path / "keys", 2)
    certs, keys = _snapshot(tmp_path / "certs"), _snapshot(tmp_path / "keys")
    with pytest.raises(FileExistsError, match=r"ca\.crt.*already exist.*pass --force"):
        deploy.make_certs(tmp_path / "certs")
    with pytest.raises(FileExistsError, match="supernode-1"):
        deploy.make_node_keys(tmp_path / "keys", 3)  # one new pair among existing ones: none is written
    with pytest.raises(SystemExit) as exit_:
        deploy.main(["keys", "--out", str(tmp_path / "keys"), "--nodes", "1"])
    assert exit_.value.code == 2 and "already exist" in capsys.readouterr().err
    assert _snapshot(tmp_path / "certs") == certs and _snapshot(tmp_path / "keys") == keys

    deploy.main(["certs", "--out", str(tmp_path / "certs"), "--force"])  # the explicit request replaces the whole set
    replaced = _snapshot(tmp_path / "certs")
    assert all(replaced[name] != certs[name] for name in certs)
    assert _mode(tmp_path / "certs" / "server.key") == 0o600


def test_a_planted_symlink_at_a_key_path_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "supernode-0").symlink_to(victim)
    (tmp_path / "keys" / "supernode-1").symlink_to(tmp_path / "where-the-attacker-reads")  # dangling
    for index in (0, 1):
        with pytest.raises(FileExistsError):
            deploy.make_node_key(tmp_path / "keys" / f"supernode-{index}")
    assert victim.read_text() == "precious" and not (tmp_path / "where-the-attacker-reads").exists()

    private, _ = deploy.make_node_key(tmp_path / "keys" / "supernode-0", force=True)
    assert not private.is_symlink() and _mode(private) == 0o600  # the link itself is replaced, not its target
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    "host",
    [
        "",
        " ",
        "bad host",
        "a;rm -rf ~",
        "-lead.example",
        "x" * 64 + ".example",
        "under_score.example",
        "a..b",
        "example.com.",
        "1.2.3.4:80",
    ],
)
def test_bad_host_names_are_refused_before_anything_is_written(tmp_path, host):
    with pytest.raises(ValueError, match=r"--host .*: not a DNS name or an IP address"):
        deploy.make_certs(tmp_path / "certs", [host])
    assert not (tmp_path / "certs").exists() or not os.listdir(tmp_path / "certs")


def test_good_host_names_end_up_in_the_certificate(tmp_path):
    paths = deploy.make_certs(tmp_path / "certs", ["fl-1.example.org", "10.0.0.5", "fe80::1"], days=1)
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "fl-1.example.org" in san.get_values_for_type(x509.DNSName)
    assert {ipaddress.ip_address("10.0.0.5"), ipaddress.ip_address("fe80::1")} <= set(
        san.get_values_for_type(x509.IPAddress)
    )
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 86400 < lifetime.total_seconds() <= 86400 + 600


@pytest.mark.parametrize("days", [0, -1, deploy.MAX_CERT_DAYS + 1, 1.5])
def test_certificate_lifetime_must_be_positive_and_bounded(tmp_path, days):
    with pytest.raises(ValueError, match=rf"--days {days!r}: a certificate lifetime in whole days in \[1, 3650\]"):
        deploy.make_certs(tmp_path / "certs", days=days)
    assert not (tmp_path / "certs").exists()


def test_insecure_mode_stays_on_loopback_unless_told_loudly(tmp_path, capsys):
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert "--insecure" in deploy.superlink_command(tmp_path, host=host, insecure=True)
    for host in ("0.0.0.0", "::", "10.0.0.5", "fl.example.org"):
        with pytest.raises(
            ValueError,
            match=rf"--host '{host}': the insecure local-test mode .* loopback .* "
            "--insecure-allow-remote",
        ):
            deploy.superlink_command(tmp_path, host=host, insecure=True)
    with pytest.raises(ValueError, match="--superlink '10.0.0.5'"):
        deploy.supernode_command("10.0.0.5:9093", 0, 1, 9094, insecure=True)
    assert "--insecure" in deploy.supernode_command("[::1]:9093", 0, 1, 9094, insecure=True)
    with pytest.raises(ValueError, match="--host '0.0.0.0'"):
        deploy.recipe(tmp_path, 2, superlink_host="0.0.0.0", insecure_local_test=True)
    with pytest.raises(SystemExit):
        deploy.main(["superlink", "--state", str(tmp_path), "--host", "0.0.0.0", "--insecure-local-test", "--print"])
    assert "--insecure-allow-remote" in capsys.readouterr().err

    command = deploy.superlink_command(tmp_path, host="0.0.0.0", insecure=True, allow_remote_insecure=True)
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert "WARNING: --host '0.0.0.0' is not a loopback address" in capsys.readouterr().err
    assert "--ssl-certfile" in deploy.superlink_command(tmp_path, tmp_path, host="0.0.0.0")  # TLS: any address


def test_the_superlink_keeps_its_state_in_the_state_folder_unless_told_to_keep_it_in_memory(tmp_path):
    command = deploy.superlink_command(tmp_path / "state", tmp_path / "certs")
    assert command[command.index("--database") + 1] == str((tmp_path / "state" / "state.db").resolve())
    in_memory = deploy.superlink_command(tmp_path / "state", tmp_path / "certs", in_memory=True)
    assert "--database" not in in_memory  # Flower's in-memory state
    at = command.index("--database")
    assert in_memory == command[:at] + command[at + 2 :]  # nothing else differs


def test_recipe_quotes_every_path(tmp_path):
    folder = tmp_path / "my deploy; touch $(echo pwned) 'x'"
    lines = deploy.recipe(folder, 2, budgets=[5e6, 7e6]).splitlines()
    parsed = [shlex.split(line.removesuffix(" &")) for line in lines if not line.startswith("#")]
    assert ["python", "-m", "fl_app.deploy", "certs", "--out", str(folder / "certs")] in parsed
    assert ["python", "-m", "fl_app.deploy", "keys", "--out", str(folder / "keys"), "--nodes", "2"] in parsed
    assert ["mkdir", "-p", "-m", "700", str(folder / "superlink")] in parsed
    assert ["flwr", "supernode", "register", str(folder / "keys" / "supernode-1.pub"), "deployment"] in parsed
    superlink = next(tokens for tokens in parsed if tokens[0] == "flower-superlink")
    assert superlink[superlink.index("--ssl-keyfile") + 1] == str((folder / "certs" / "server.key").resolve())
    node = next(tokens for tokens in parsed if tokens[0] == "flower-supernode")
    assert node[node.index("--auth-supernode-private-key") + 1] == str((folder / "keys" / "supernode-0").resolve())
    insecure = deploy.recipe(folder, 1, insecure_local_test=True).splitlines()
    assert ["mkdir", "-p", "-m", "700", str(folder / "insecure-superlink")] in [
        shlex.split(line) for line in insecure if line.startswith("mkdir")
    ]


def test_recipe_and_node_options_are_checked(capsys):
    for argv, fragment in (
        (["recipe", "--budgets", "5e6,inf"], "--budgets '5e6,inf': inf is out of range"),
        (["recipe", "--nodes", "2", "--budgets", "5e6"], "1 values for --nodes 2"),
        (["recipe", "--host", "bad host"], "--host 'bad host': not a DNS name"),
        (
            [
                "supernode",
                "--superlink",
                "127.0.0.1:9093",
                "--partition-id",
                "2",
                "--num-partitions",
                "2",
                "--insecure-local-test",
                "--print",
            ],
            "--partition-id 2: must be in [0, --num-partitions 2)",
        ),
    ):
        with pytest.raises(SystemExit) as exit_:
            deploy.main(argv)
        assert exit_.value.code == 2 and fragment in capsys.readouterr().err, argv


# -- counts, ports and addresses: checked before anything is generated, written or printed -------------------------
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["keys", "--nodes", "100000000"], "--nodes 100000000: allowed: a whole number from 1 to 10000"),
        (["keys", "--nodes", "-3"], "--nodes -3: allowed: a whole number from 1 to 10000"),
        (["recipe", "--nodes", "-3"], "--nodes -3: allowed"),
        (["recipe", "--port", "70000"], "--port 70000: not a TCP port; allowed: a whole number from 1 to 65535"),
        (["recipe", "--nodes", "3", "--port", "0"], "--port 0: not a TCP port"),
        (["superlink", "--state", "STATE", "--insecure-local-test", "--port", "70000", "--print"], "--port 70000"),
        (
            [
                "supernode",
                "--superlink",
                "127.0.0.1:9093",
                "--insecure-local-test",
                "--partition-id",
                "0",
                "--num-partitions",
                "1",
                "--port",
                "70000",
                "--print",
            ],
            "--port 70000",
        ),
        (
            [
                "supernode",
                "--superlink",
                "127.0.0.1:99999",
                "--insecure-local-test",
                "--partition-id",
                "0",
                "--num-partitions",
                "1",
                "--print",
            ],
            "--superlink '127.0.0.1:99999': port 99999: not a TCP port",
        ),
        (
            ["connection", "x", "--address", "bad host:1", "--insecure"],
            "--address 'bad host:1': host 'bad host': not a DNS name",
        ),
        (["connection", "x", "--address", "127.0.0.1", "--insecure"], "--address '127.0.0.1': expected HOST:PORT"),
        (["connection", "x", "--address", "::1:9093", "--insecure"], "expected HOST:PORT (an IPv6 address as"),
    ],
)
def test_counts_ports_and_addresses_are_refused_before_anything_is_written(tmp_path, capsys, argv, fragment):
    argv = [a.replace("STATE", str(tmp_path / "state")) for a in argv]
    extra = {"keys": ["--out", str(tmp_path / "keys")], "connection": ["--flwr-home", str(tmp_path / "home")]}
    with pytest.raises(SystemExit):
        deploy.main([*argv, *extra.get(argv[0], [])])
    captured = capsys.readouterr()
    assert fragment in captured.err and "Traceback" not in captured.err, captured.err
    assert "flower-" not in captured.out and "python -m fl_app.deploy" not in captured.out  # nothing printed
    assert list(tmp_path.iterdir()) == []  # no key, folder or config written


def test_valid_addresses_and_the_ipv6_recipe_parse_back():
    from fl_app.deploy.addresses import parse_address

    assert parse_address("[::1]:9093") == ("::1", 9093)
    assert parse_address("fl.example.org:9093") == ("fl.example.org", 9093)
    text = deploy.recipe("d", 2, superlink_host="::1", insecure_local_test=True)
    assert "--superlink '[::1]:9093'" in text or "--superlink [::1]:9093" in text, text
