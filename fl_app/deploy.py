"""Run the app on a real Flower deployment: one SuperLink with TLS and SuperNode authentication, N SuperNodes.

One function per step, usable from tests and scripts; the CLI wraps the same steps:

    python -m fl_app.deploy certs --out deploy/certs                # ca.crt, server.pem, server.key
    python -m fl_app.deploy keys --out deploy/keys --nodes 2        # supernode-<i> / supernode-<i>.pub
    python -m fl_app.deploy superlink --certs deploy/certs --state deploy/superlink --port 9093
    python -m fl_app.deploy connection deployment --address 127.0.0.1:9093 --root-certificates deploy/certs/ca.crt
    python -m fl_app.deploy register deploy/keys/supernode-0.pub deploy/keys/supernode-1.pub --connection deployment
    python -m fl_app.deploy supernode --superlink 127.0.0.1:9093 --ca deploy/certs/ca.crt \\
        --key deploy/keys/supernode-0 --partition-id 0 --num-partitions 2 --port 9094
    flwr run . deployment --stream
    python -m fl_app.deploy results RUN_ID --connection deployment --out results/RUN_ID [--ssh user@superlink-host]

`python -m fl_app.deploy recipe --dir deploy --nodes 2` prints the whole sequence as plain Flower commands.
`superlink` and `supernode` replace the Python process with the Flower command (logs in the foreground, Ctrl-C
stops it); `--print` only prints the command. `results` copies a finished run's output folder from the SuperLink's
host (fl_app.deploy_results); certificates, keys and connections are written by fl_app.deploy_files (new folders
0700, key sets all or nothing, config.toml edited in place).

Key formats (Flower 1.42): the SuperLink's TLS files are PEM (CA certificate, server certificate, PKCS#8 key);
SuperNode authentication keys are NIST elliptic-curve (P-384) keys, the private key in OpenSSH format and the
public key as an OpenSSH `ecdsa-sha2-nistp384 ...` line (what `ssh-keygen -t ecdsa -b 384` writes).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fl_app.deploy_files import install_file_set, make_private_dir, refuse_existing, write_connection
from fl_app.deploy_results import DEFAULT_RUNS, fetch_results
from fl_app.run.cli import add_command, comma_list, print_json, tool_parser
from fl_app.run.config import MACS_RANGE, parse_macs_list
from fl_app.run.processes import related_pids, terminate

CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.pem", "server.key"
DEFAULT_SUPERLINK_PORT = 9093
DEFAULT_SUPERNODE_PORT = 9094
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MAX_CERT_DAYS = 3650  # certificate lifetime in days: at least one, at most ten years
PRIVATE, PUBLIC = 0o600, 0o644
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
INSECURE_REMOTE_FLAG = "--insecure-allow-remote"


# ---------------------------------------------------------------------------------------------------------------
# 0. Checks of what the operator types
# ---------------------------------------------------------------------------------------------------------------
def check_host(host: str, what: str = "--host") -> str:
    """A DNS name (labels of letters, digits and '-', 1-63 characters each, at most 253 in all) or an IP address;
    raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(host, str) and host:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            if len(host) <= 253 and all(DNS_LABEL.fullmatch(label) for label in host.split(".")):
                return host
    raise ValueError(
        f"{what} {host!r}: not a DNS name or an IP address (DNS names: labels of letters, digits and "
        "'-', 1-63 characters each, at most 253 characters in all)"
    )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_insecure_address(host: str, what: str, allow_remote: bool) -> None:
    """The insecure local-test mode sends everything in plain text without authentication: loopback only, unless
    the operator says otherwise in so many words (``allow_remote``), and then it is said loudly."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ValueError(
            f"{what} {host!r}: the insecure local-test mode (no TLS, no SuperNode authentication) only "
            f"uses loopback addresses ({', '.join(LOOPBACK_NAMES)}); for anything else set up TLS "
            f"(certs, keys) or pass {INSECURE_REMOTE_FLAG}"
        )
    print(
        f"WARNING: {what} {host!r} is not a loopback address: traffic is unencrypted and any host that reaches it "
        "can join or submit runs",
        file=sys.stderr,
        flush=True,
    )


def _split_address(address: str) -> str:
    """The host of HOST:PORT or [IPv6]:PORT."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


# ---------------------------------------------------------------------------------------------------------------
# 1. TLS certificates for the SuperLink
# ---------------------------------------------------------------------------------------------------------------
def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fl-app deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_bytes(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_certs(
    out_dir: str | Path, hosts: tuple[str, ...] | list[str] = (), days: int = 365, force: bool = False
) -> dict[str, Path]:
    """A local CA and a SuperLink server certificate signed by it, valid for localhost, 127.0.0.1, ::1 and `hosts`
    (DNS names or IP addresses the SuperNodes and the `flwr` CLI use to reach the SuperLink) for `days` days.
    Returns {"ca": ca.crt, "cert": server.pem, "key": server.key}; the CA's own key stays in ca.key. Private keys
    are created with mode 0600; existing files are refused unless `force`."""
    hosts = [check_host(host) for host in hosts]
    if not (isinstance(days, int) and 1 <= days <= MAX_CERT_DAYS):
        raise ValueError(f"--days {days!r}: a certificate lifetime in whole days in [1, {MAX_CERT_DAYS}]")
    out = Path(out_dir)
    paths = {"ca": out / CA_CERT, "cert": out / SERVER_CERT, "key": out / SERVER_KEY}
    refuse_existing([out / CA_KEY, *paths.values()], force)  # before any key is generated
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = _name("fl-app deployment CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*LOOPBACK_NAMES, *hosts]):  # ordered, without duplicates
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    install_file_set(  # all four or none: a failure midway leaves the previous set as it was
        out,
        {
            CA_KEY: (_key_bytes(ca_key), PRIVATE),
            SERVER_KEY: (_key_bytes(server_key), PRIVATE),
            CA_CERT: (ca_cert.public_bytes(serialization.Encoding.PEM), PUBLIC),
            SERVER_CERT: (server_cert.public_bytes(serialization.Encoding.PEM), PUBLIC),
        },
        force,
    )
    return paths


# ---------------------------------------------------------------------------------------------------------------
# 2. SuperNode authentication keys
# ---------------------------------------------------------------------------------------------------------------
def _node_key_files(name: str) -> dict[str, tuple[bytes, int]]:
    """A fresh EC P-384 key pair: the private key in OpenSSH format (mode 0600) and its public key line."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    return {name: (private, PRIVATE), f"{name}.pub": (public, PUBLIC)}


def make_node_key(private_path: str | Path, force: bool = False) -> tuple[Path, Path]:
    """One SuperNode key pair: an EC P-384 private key in OpenSSH format at `private_path` (mode 0600) and its public
    key (`ecdsa-sha2-nistp384 ...`) at `private_path`.pub. Existing files are refused unless `force`.
    Returns (private, public)."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + ".pub")
    refuse_existing([private_path, public_path], force)
    install_file_set(private_path.parent, _node_key_files(private_path.name), force)
    return private_path, public_path


def make_node_keys(
    out_dir: str | Path, nodes: int, prefix: str = "supernode", start: int = 0, force: bool = False
) -> list[tuple[Path, Path]]:
    """`nodes` key pairs named <prefix>-<i> / <prefix>-<i>.pub, i = start .. start+nodes-1 (i = partition id),
    written as one set: all pairs or none."""
    if nodes < 1 or start < 0 or not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix) or prefix.startswith("."):
        raise ValueError(
            f"--nodes {nodes}, --start {start}, --prefix {prefix!r}: need nodes >= 1, start >= 0 and a "
            "file-name prefix of letters, digits, '_', '.' and '-' (not starting with '.')"
        )
    out = Path(out_dir)
    names = [f"{prefix}-{i}" for i in range(start, start + nodes)]
    refuse_existing([out / n for name in names for n in (name, f"{name}.pub")], force)  # before any key is made
    files = {}
    for name in names:
        files.update(_node_key_files(name))
    install_file_set(out, files, force)
    return [(out / name, out / f"{name}.pub") for name in names]


# ---------------------------------------------------------------------------------------------------------------
# 3. SuperLink
# ---------------------------------------------------------------------------------------------------------------
def superlink_command(
    state_dir: str | Path,
    certs_dir: str | Path | None = None,
    port: int = DEFAULT_SUPERLINK_PORT,
    host: str = "127.0.0.1",
    insecure: bool = False,
    allow_remote_insecure: bool = False,
) -> list[str]:
    """`flower-superlink` with TLS and SuperNode authentication (or, only for a local test, `--insecure` and no
    node authentication, bound to a loopback address unless `allow_remote_insecure`), its state in
    `state_dir`/state.db and no runtime `uv sync` of app dependencies.
    In Flower 1.42 one HTTP(S) port serves the Fleet, Control and Runtime APIs."""
    check_host(host)
    if insecure:
        check_insecure_address(host, "--host", allow_remote_insecure)
    command = [
        "flower-superlink",
        "--host",
        host,
        "--port",
        str(port),
        "--database",
        str(Path(state_dir).resolve() / "state.db"),
        "--disable-runtime-dependency-installation",
    ]
    if insecure:
        return command + ["--insecure"]
    certs = Path(certs_dir).resolve()
    return command + [
        "--ssl-ca-certfile",
        str(certs / CA_CERT),
        "--ssl-certfile",
        str(certs / SERVER_CERT),
        "--ssl-keyfile",
        str(certs / SERVER_KEY),
        "--enable-supernode-auth",
    ]


def flower_env(flwr_home: str | Path | None = None, base: dict | None = None) -> dict:
    """Environment for Flower processes: FLWR_HOME (apps, config.toml) and no runtime dependency installation."""
    env = {**(os.environ if base is None else base), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    if flwr_home is not None:
        env["FLWR_HOME"] = str(Path(flwr_home).resolve())
    return env


def start_process(
    command: list[str], log_file: str | Path, env: dict | None = None, cwd: str | Path | None = None
) -> subprocess.Popen:
    """Start a Flower process in its own session (stop it with `stop_processes`), output appended to `log_file`
    (created 0600 in a folder created 0700; a symlink at its name is refused, not followed)."""
    log_file = Path(log_file)
    make_private_dir(log_file.parent)
    fd = os.open(log_file, LOG_FLAGS, PRIVATE)
    with os.fdopen(fd, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


def start_superlink(
    state_dir: str | Path,
    certs_dir: str | Path | None = None,
    port: int = DEFAULT_SUPERLINK_PORT,
    host: str = "127.0.0.1",
    env: dict | None = None,
    insecure: bool = False,
    allow_remote_insecure: bool = False,
) -> subprocess.Popen:
    """Start the SuperLink (log in `state_dir`/superlink.log) and return its Popen."""
    command = superlink_command(state_dir, certs_dir, port, host, insecure, allow_remote_insecure)
    state_dir = make_private_dir(state_dir)
    return start_process(command, state_dir / "superlink.log", env=env, cwd=state_dir)


def wait_for_port(host: str, port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until something accepts TCP connections on host:port; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode} before opening port {port}")
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f} s")


# ---------------------------------------------------------------------------------------------------------------
# 4. The `flwr` CLI: its connection to the SuperLink (`write_connection`, in fl_app.deploy_files) and its commands
# ---------------------------------------------------------------------------------------------------------------
def flwr_cli(args: list[str], env: dict | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run `flwr <args>` and return the completed process (text output)."""
    return subprocess.run(
        ["flwr", *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )


def _json_tail(text: str) -> dict:
    """The JSON object `flwr ... --format json` prints (after any banner lines)."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in flwr output:\n{text[-2000:]}")
    return json.loads(text[start:])


# ---------------------------------------------------------------------------------------------------------------
# 5. Register SuperNode public keys (needs the SuperLink running with --enable-supernode-auth)
# ---------------------------------------------------------------------------------------------------------------
def register_node(
    public_key: str | Path, connection: str, env: dict | None = None, name: str | None = None, timeout: float = 120.0
) -> int:
    """`flwr supernode register <public key> <connection>`; returns the node id the SuperLink assigned."""
    args = ["supernode", "register", str(public_key), connection, "--format", "json"]
    if name:
        args += ["--name", name]
    proc = flwr_cli(args, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"flwr supernode register failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    result = _json_tail(proc.stdout)
    if not result.get("success"):
        raise RuntimeError(f"flwr supernode register failed: {result}")
    return int(result["node-id"])


def list_nodes(connection: str, env: dict | None = None, timeout: float = 120.0) -> list[dict]:
    """`flwr supernode list <connection> --format json` -> the SuperLink's registered nodes."""
    proc = flwr_cli(["supernode", "list", connection, "--format", "json"], env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"flwr supernode list failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return _json_tail(proc.stdout)["nodes"]


# ---------------------------------------------------------------------------------------------------------------
# 6. SuperNodes
# ---------------------------------------------------------------------------------------------------------------
def node_config(partition_id: int, num_partitions: int, budget_macs: float | None = None) -> str:
    """The `--node-config` string the app reads (`budget-macs` is FEAST's optional per-node budget)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"--partition-id {partition_id}: must be in [0, --num-partitions {num_partitions})")
    text = f"partition-id={partition_id} num-partitions={num_partitions}"
    if budget_macs is not None and not MACS_RANGE(float(budget_macs)):
        raise ValueError(f"--budget-macs {budget_macs!r}: must be a number {MACS_RANGE.rule}")
    return text if budget_macs is None else f"{text} budget-macs={float(budget_macs)!r}"


def supernode_command(
    superlink: str,
    partition_id: int,
    num_partitions: int,
    port: int,
    root_certificates: str | Path | None = None,
    private_key: str | Path | None = None,
    budget_macs: float | None = None,
    insecure: bool = False,
    max_retries: int | None = None,
    allow_remote_insecure: bool = False,
) -> list[str]:
    """`flower-supernode` for one partition: TLS towards the SuperLink (`root_certificates` = the CA), its
    authentication key, and its own `--port` for the local ClientApp runtime API (one per SuperNode on a host).
    `insecure=True` (no TLS, no key) is only for a local test against an `--insecure` SuperLink on a loopback
    address (another one only with `allow_remote_insecure`)."""
    if insecure:
        check_insecure_address(_split_address(superlink), "--superlink", allow_remote_insecure)
    command = [
        "flower-supernode",
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        node_config(partition_id, num_partitions, budget_macs),
    ]
    if max_retries is not None:
        command += ["--max-retries", str(max_retries)]
    if insecure:
        return command + ["--insecure"]
    if root_certificates is None or private_key is None:
        raise ValueError("a secure SuperNode needs root_certificates and private_key")
    return command + [
        "--root-certificates",
        str(Path(root_certificates).resolve()),
        "--auth-supernode-private-key",
        str(Path(private_key).resolve()),
    ]


def start_supernode(
    log_file: str | Path,
    superlink: str,
    partition_id: int,
    num_partitions: int,
    port: int,
    root_certificates: str | Path | None = None,
    private_key: str | Path | None = None,
    budget_macs: float | None = None,
    env: dict | None = None,
    insecure: bool = False,
    max_retries: int | None = None,
    allow_remote_insecure: bool = False,
) -> subprocess.Popen:
    """Start one SuperNode (see `supernode_command`) and return its Popen."""
    command = supernode_command(
        superlink,
        partition_id,
        num_partitions,
        port,
        root_certificates,
        private_key,
        budget_macs,
        insecure,
        max_retries,
        allow_remote_insecure,
    )
    return start_process(command, log_file, env=env, cwd=Path(log_file).parent)


# ---------------------------------------------------------------------------------------------------------------
# 7. Stopping everything
# ---------------------------------------------------------------------------------------------------------------
def stop_processes(procs: list[subprocess.Popen], markers: tuple[str, ...] = (), timeout: float = 15.0) -> None:
    """Stop `procs`, everything they spawned (Flower detaches SuperExec, ServerApp and ClientApp processes into
    their own sessions) and Flower processes whose command line names one of `markers` (e.g. "127.0.0.1:9093":
    catches ones already orphaned). Order: the spawned processes, then `procs` in reverse start order (SuperNodes
    sign off while their SuperLink still runs: one killed hard stays "online" on the SuperLink for up to two
    heartbeat intervals, ~60 s, and is refused if restarted in that time), then whatever still names a marker.
    SIGTERM to each process and its group, SIGKILL after `timeout`; never this process or its group."""

    def reap() -> None:
        for p in procs:
            p.poll()

    roots = [p.pid for p in procs if p.poll() is None]
    terminate(related_pids(roots, markers) - set(roots), groups=False, timeout=min(timeout, 5.0), reap=reap)
    for p in reversed(procs):
        if p.poll() is None:
            terminate(related_pids([p.pid]) | {p.pid}, groups=True, timeout=timeout, reap=reap)
    if markers:
        terminate(related_pids([], markers), groups=True, timeout=timeout, reap=reap)
    for p in procs:
        try:
            p.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass


# ---------------------------------------------------------------------------------------------------------------
# The whole sequence as shell commands
# ---------------------------------------------------------------------------------------------------------------
def recipe(
    deploy_dir: str | Path,
    nodes: int,
    connection: str | None = None,
    superlink_host: str = "127.0.0.1",
    superlink_port: int = DEFAULT_SUPERLINK_PORT,
    first_node_port: int = DEFAULT_SUPERNODE_PORT,
    budgets: list[float] | None = None,
    insecure_local_test: bool = False,
    allow_remote_insecure: bool = False,
) -> str:
    """The commands for a deployment with `nodes` SuperNodes on one host (start each long-running one in its own
    terminal). `insecure_local_test=True` gives the local-test-only variant without TLS and node authentication.
    Every path and name is shell-quoted: the lines can be pasted as they are, whatever the folder is called."""
    check_host(superlink_host)
    if budgets is not None and len(budgets) != nodes:
        raise ValueError(f"--budgets: {len(budgets)} values for --nodes {nodes}; give one budget per node")
    d = Path(deploy_dir)
    connection = connection or ("local-test" if insecure_local_test else "deployment")
    address = f"{superlink_host}:{superlink_port}"
    me = "python -m fl_app.deploy"
    q = shlex.join
    lines = [
        "# SuperLink and SuperNodes: no `uv sync` of app dependencies at run time",
        "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1",
    ]
    if insecure_local_test:
        lines += [
            "# LOCAL TEST ONLY: no TLS, no SuperNode authentication",
            q(["mkdir", "-p", "-m", "700", str(d / "insecure-superlink")]),
            q(
                superlink_command(
                    d / "insecure-superlink",
                    None,
                    superlink_port,
                    superlink_host,
                    insecure=True,
                    allow_remote_insecure=allow_remote_insecure,
                )
            )
            + " &",
        ]
        lines += [
            q(
                supernode_command(
                    address, i, nodes, first_node_port + i, insecure=True, allow_remote_insecure=allow_remote_insecure
                )
            )
            + " &"
            for i in range(nodes)
        ]
        lines += [
            f"{me} {q(['connection', connection, '--address', address, '--insecure'])}",
            q(["flwr", "run", ".", connection, "--stream"]),
        ]
        return "\n".join(lines)
    host_option = [] if superlink_host in LOOPBACK_NAMES else ["--host", superlink_host]
    lines += [
        f"{me} {q(['certs', '--out', str(d / 'certs'), *host_option])}",
        f"{me} {q(['keys', '--out', str(d / 'keys'), '--nodes', str(nodes)])}",
        q(["mkdir", "-p", "-m", "700", str(d / "superlink")]),
        q(superlink_command(d / "superlink", d / "certs", superlink_port, superlink_host)) + " &",
        f"{me} "
        + q(["connection", connection, "--address", address, "--root-certificates", str(d / "certs" / CA_CERT)]),
        *[
            q(["flwr", "supernode", "register", str(d / "keys" / f"supernode-{i}.pub"), connection])
            for i in range(nodes)
        ],
    ]
    lines += [
        q(
            supernode_command(
                address,
                i,
                nodes,
                first_node_port + i,
                d / "certs" / CA_CERT,
                d / "keys" / f"supernode-{i}",
                budgets[i] if budgets else None,
            )
        )
        + " &"
        for i in range(nodes)
    ]
    lines += [q(["flwr", "run", ".", connection, "--stream"]), q(["flwr", "ls", connection])]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------
def _exec_or_print(command: list[str], print_only: bool) -> None:
    print(shlex.join(command), flush=True)
    if not print_only:
        os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        os.execvp(command[0], command)


INSECURE_REMOTE_HELP = "with --insecure-local-test: allow a non-loopback address (unencrypted, unauthenticated)"


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("fl_app.deploy", __doc__)
    sub = parser.add_subparsers(dest="step", required=True, metavar="STEP")

    p = add_command(sub, "certs", "local CA + SuperLink TLS certificate (ca.crt, server.pem, server.key)")
    p.add_argument("--out", required=True, help="folder for the certificates and keys")
    p.add_argument(
        "--host",
        type=comma_list(str, "DNS names / IPs"),
        default=[],
        help="extra DNS names / IPs for the server certificate, comma-separated; localhost, 127.0.0.1 and ::1 are "
        "always included",
    )
    p.add_argument("--days", type=int, default=365, help=f"certificate lifetime in days, 1-{MAX_CERT_DAYS}")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing CA, server certificate and keys "
        "(SuperNodes and the flwr CLI must then get the new ca.crt)",
    )

    p = add_command(sub, "keys", "SuperNode authentication key pairs (EC P-384, OpenSSH format)")
    p.add_argument("--out", required=True, help="folder for the key pairs")
    p.add_argument("--nodes", type=int, required=True, help="number of key pairs")
    p.add_argument("--prefix", default="supernode", help="file names: <prefix>-<index> and <prefix>-<index>.pub")
    p.add_argument("--start", type=int, default=0, help="first index in the file names")
    p.add_argument("--force", action="store_true", help="replace existing key pairs (register the new public keys)")

    p = add_command(sub, "superlink", "run flower-superlink with TLS + SuperNode authentication (foreground)")
    p.add_argument("--certs", help="folder with ca.crt, server.pem, server.key")
    p.add_argument("--state", required=True, help="folder for the SuperLink database (state.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 to accept remote SuperNodes)")
    p.add_argument("--port", type=int, default=DEFAULT_SUPERLINK_PORT, help="the SuperLink's port")
    p.add_argument(
        "--insecure-local-test", action="store_true", help="LOCAL TEST ONLY: no TLS and no SuperNode authentication"
    )
    p.add_argument(INSECURE_REMOTE_FLAG, action="store_true", help=INSECURE_REMOTE_HELP)
    p.add_argument("--print", action="store_true", help="only print the command")

    p = add_command(sub, "connection", "write the `flwr` CLI's SuperLink connection into $FLWR_HOME/config.toml")
    p.add_argument("name", help="connection name, as in `flwr run . NAME`")
    p.add_argument("--address", required=True, help="SuperLink HOST:PORT")
    p.add_argument("--root-certificates", help="the CA certificate (ca.crt)")
    p.add_argument("--insecure", action="store_true", help="LOCAL TEST ONLY: plain HTTP")
    p.add_argument("--default", action="store_true", help="make it the default connection")
    p.add_argument(
        "--flwr-home",
        default=os.environ.get("FLWR_HOME", str(Path.home() / ".flwr")),
        help="the flwr CLI's home folder ($FLWR_HOME, else ~/.flwr)",
    )

    p = add_command(sub, "register", "flwr supernode register for each public key")
    p.add_argument("public_keys", nargs="+", help="SuperNode public key files (<name>.pub)")
    p.add_argument("--connection", required=True, help="connection name written by the connection step")

    p = add_command(sub, "supernode", "run one flower-supernode (foreground)")
    p.add_argument("--superlink", required=True, help="SuperLink HOST:PORT")
    p.add_argument("--ca", help="CA certificate (ca.crt)")
    p.add_argument("--key", help="this SuperNode's private key")
    p.add_argument("--partition-id", type=int, required=True, help="this node's data partition")
    p.add_argument("--num-partitions", type=int, required=True, help="number of partitions (SuperNodes)")
    p.add_argument("--budget-macs", type=float, help="FEAST: this node's MACs budget (unset: drawn by the server)")
    p.add_argument(
        "--port", type=int, help=f"local ClientApp runtime API port (unset: {DEFAULT_SUPERNODE_PORT} + partition id)"
    )
    p.add_argument("--insecure-local-test", action="store_true", help="LOCAL TEST ONLY: no TLS, no authentication key")
    p.add_argument(INSECURE_REMOTE_FLAG, action="store_true", help=INSECURE_REMOTE_HELP)
    p.add_argument("--print", action="store_true", help="only print the command")

    p = add_command(sub, "results", "copy a finished run's output folder from the SuperLink's host")
    p.add_argument("run_id", help="the run id `flwr run` printed")
    p.add_argument("--connection", required=True, help="connection name the run was started on (flwr run . NAME)")
    p.add_argument("--out", required=True, help="new local folder for the run's files")
    p.add_argument(
        "--runs",
        type=comma_list(str, "folders"),
        default=list(DEFAULT_RUNS),
        help="folders on the SuperLink's host that hold run folders (the parent of the run's output-dir), "
        "comma-separated; a run folder itself works too",
    )
    p.add_argument("--ssh", help="[USER@]HOST of the SuperLink, reached with ssh (unset: this machine)")

    p = add_command(sub, "recipe", "print the whole sequence of commands")
    p.add_argument("--dir", default="deploy", help="folder the printed commands put certificates, keys and state in")
    p.add_argument("--nodes", type=int, default=2, help="number of SuperNodes")
    p.add_argument("--connection", help="connection name (unset: deployment, or local-test when insecure)")
    p.add_argument("--host", default="127.0.0.1", help="SuperLink host name/IP as the SuperNodes reach it")
    p.add_argument("--port", type=int, default=DEFAULT_SUPERLINK_PORT, help="the SuperLink's port")
    p.add_argument("--budgets", help="comma-separated MACs budget per node (FEAST; unset: drawn by the server)")
    p.add_argument(
        "--insecure-local-test", action="store_true", help="LOCAL TEST ONLY: no TLS and no SuperNode authentication"
    )
    p.add_argument(INSECURE_REMOTE_FLAG, action="store_true", help=INSECURE_REMOTE_HELP)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _run_step(parser, args)
    except (ValueError, FileExistsError) as error:  # bad input: the message, not a traceback
        parser.error(str(error))
    except RuntimeError as error:  # a command it ran failed: its message, not a traceback
        print(f"{parser.prog}: {error}", file=sys.stderr)
        sys.exit(1)


def _run_step(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.step == "certs":
        for path in make_certs(args.out, args.host, args.days, args.force).values():
            print(path)
    elif args.step == "keys":
        for private, public in make_node_keys(args.out, args.nodes, args.prefix, args.start, args.force):
            print(private, public)
    elif args.step == "superlink":
        if not args.insecure_local_test and not args.certs:
            parser.error("superlink needs --certs (or --insecure-local-test)")
        command = superlink_command(
            args.state, args.certs, args.port, args.host, args.insecure_local_test, args.insecure_allow_remote
        )
        make_private_dir(args.state)
        _exec_or_print(command, args.print)
    elif args.step == "connection":
        if not args.insecure and not args.root_certificates:
            parser.error("connection needs --root-certificates (or --insecure for a local test)")
        print(
            write_connection(
                args.flwr_home, args.name, args.address, args.root_certificates, args.insecure, args.default
            )
        )
    elif args.step == "register":
        for key in args.public_keys:
            print(f"{key}: node id {register_node(key, args.connection)}")
    elif args.step == "supernode":
        if not args.insecure_local_test and not (args.ca and args.key):
            parser.error("supernode needs --ca and --key (or --insecure-local-test)")
        port = args.port if args.port is not None else DEFAULT_SUPERNODE_PORT + args.partition_id
        _exec_or_print(
            supernode_command(
                args.superlink,
                args.partition_id,
                args.num_partitions,
                port,
                args.ca,
                args.key,
                args.budget_macs,
                args.insecure_local_test,
                allow_remote_insecure=args.insecure_allow_remote,
            ),
            args.print,
        )
    elif args.step == "results":
        fetched = fetch_results(args.run_id, args.connection, args.out, args.runs, args.ssh)
        print_json(fetched, [fetched], ["run_id", "status", "folder", "out"])
    elif args.step == "recipe":
        budgets = None
        if args.budgets:
            try:
                budgets = list(parse_macs_list(args.budgets))
            except ValueError as error:
                raise ValueError(f"--budgets {args.budgets!r}: {error}") from None
        print(
            recipe(
                args.dir,
                args.nodes,
                args.connection,
                args.host,
                args.port,
                budgets=budgets,
                insecure_local_test=args.insecure_local_test,
                allow_remote_insecure=args.insecure_allow_remote,
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:])
