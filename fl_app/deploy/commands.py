"""The Flower commands of a deployment: `flower-superlink` and `flower-supernode` command lines, the `flwr` CLI's
`supernode register` / `supernode list`, and the whole sequence as shell lines (`recipe`).

In Flower 1.42 one HTTP(S) port of the SuperLink serves the Fleet, Control and Runtime APIs; every SuperNode on a
host needs its own `--port` for the local ClientApp runtime API.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from fl_app.deploy.addresses import (
    LOOPBACK_NAMES,
    check_count,
    check_host,
    check_insecure_address,
    check_port,
    join_address,
    parse_address,
    split_address,
)
from fl_app.deploy.credentials import CA_CERT, SERVER_CERT, SERVER_KEY
from fl_app.run.config import MACS_RANGE

DEFAULT_SUPERLINK_PORT = 9093
DEFAULT_SUPERNODE_PORT = 9094


# ---------------------------------------------------------------------------------------------------------------
# SuperLink
# ---------------------------------------------------------------------------------------------------------------
def superlink_command(
    state_dir: str | Path,
    certs_dir: str | Path | None = None,
    port: int = DEFAULT_SUPERLINK_PORT,
    host: str = "127.0.0.1",
    insecure: bool = False,
    allow_remote_insecure: bool = False,
    in_memory: bool = False,
) -> list[str]:
    """`flower-superlink` with TLS and SuperNode authentication (or, only for a local test, `--insecure` and no
    node authentication, bound to a loopback address unless `allow_remote_insecure`), its state in
    `state_dir`/state.db (or, with `in_memory`, in the SuperLink's memory: nothing survives a restart) and no
    runtime `uv sync` of app dependencies.
    In Flower 1.42 one HTTP(S) port serves the Fleet, Control and Runtime APIs."""
    check_host(host)
    check_port(port)
    if insecure:
        check_insecure_address(host, "--host", allow_remote_insecure)
    command = ["flower-superlink", "--host", host, "--port", str(port)]
    if not in_memory:
        command += ["--database", str(Path(state_dir).resolve() / "state.db")]
    command.append("--disable-runtime-dependency-installation")
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


# ---------------------------------------------------------------------------------------------------------------
# The `flwr` CLI: its connection to the SuperLink (`write_connection`, in fl_app.deploy.files) and its commands
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
# Register SuperNode public keys (needs the SuperLink running with --enable-supernode-auth)
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
# SuperNodes
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
    parse_address(superlink, "--superlink")
    check_port(port)
    check_count(num_partitions, "--num-partitions")
    if insecure:
        check_insecure_address(split_address(superlink), "--superlink", allow_remote_insecure)
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
    check_count(nodes)
    check_port(superlink_port)
    check_port(first_node_port, "first SuperNode port")
    check_port(first_node_port + nodes - 1, f"the last SuperNode's port (first {first_node_port} + --nodes - 1)")
    if budgets is not None and len(budgets) != nodes:
        raise ValueError(f"--budgets: {len(budgets)} values for --nodes {nodes}; give one budget per node")
    d = Path(deploy_dir)
    connection = connection or ("local-test" if insecure_local_test else "deployment")
    lines = [
        "# SuperLink and SuperNodes: no `uv sync` of app dependencies at run time",
        "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1",
    ]
    if insecure_local_test:
        lines += _insecure_recipe(
            d, nodes, connection, superlink_host, superlink_port, first_node_port, allow_remote_insecure
        )
    else:
        lines += _secure_recipe(d, nodes, connection, superlink_host, superlink_port, first_node_port, budgets)
    return "\n".join(lines)


RECIPE_TOOL = "python -m fl_app.deploy"


def _insecure_recipe(
    d: Path,
    nodes: int,
    connection: str,
    superlink_host: str,
    superlink_port: int,
    first_node_port: int,
    allow_remote_insecure: bool,
) -> list[str]:
    """The local-test-only lines: no certificates, no keys, no registration."""
    q = shlex.join
    address = join_address(superlink_host, superlink_port)
    lines = [
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
        f"{RECIPE_TOOL} {q(['connection', connection, '--address', address, '--insecure'])}",
        q(["flwr", "run", ".", connection, "--stream"]),
    ]
    return lines


def _secure_recipe(
    d: Path,
    nodes: int,
    connection: str,
    superlink_host: str,
    superlink_port: int,
    first_node_port: int,
    budgets: list[float] | None,
) -> list[str]:
    """The lines with TLS and SuperNode authentication: certificates, keys, SuperLink, registration, SuperNodes."""
    q = shlex.join
    address = join_address(superlink_host, superlink_port)
    host_option = [] if superlink_host in LOOPBACK_NAMES else ["--host", superlink_host]
    lines = [
        f"{RECIPE_TOOL} {q(['certs', '--out', str(d / 'certs'), *host_option])}",
        f"{RECIPE_TOOL} {q(['keys', '--out', str(d / 'keys'), '--nodes', str(nodes)])}",
        q(["mkdir", "-p", "-m", "700", str(d / "superlink")]),
        q(superlink_command(d / "superlink", d / "certs", superlink_port, superlink_host)) + " &",
        f"{RECIPE_TOOL} "
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
    return lines
