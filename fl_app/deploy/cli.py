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
host (fl_app.deploy.results); certificates, keys and connections are written by fl_app.deploy.credentials and
fl_app.deploy.files (new folders 0700, key sets all or nothing, config.toml edited in place).

Key formats (Flower 1.42): the SuperLink's TLS files are PEM (CA certificate, server certificate, PKCS#8 key);
SuperNode authentication keys are NIST elliptic-curve (P-384) keys, the private key in OpenSSH format and the
public key as an OpenSSH `ecdsa-sha2-nistp384 ...` line (what `ssh-keygen -t ecdsa -b 384` writes).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from fl_app.deploy.addresses import INSECURE_REMOTE_FLAG
from fl_app.deploy.commands import (
    DEFAULT_SUPERLINK_PORT,
    DEFAULT_SUPERNODE_PORT,
    recipe,
    register_node,
    superlink_command,
    supernode_command,
)
from fl_app.deploy.credentials import MAX_CERT_DAYS, make_certs, make_node_keys
from fl_app.deploy.files import make_private_dir, write_connection
from fl_app.deploy.results import DEFAULT_RUNS, fetch_results
from fl_app.io.cli import add_command, comma_list, print_json, tool_parser
from fl_app.run.config import parse_macs_list


def _exec_or_print(command: list[str], print_only: bool) -> None:
    print(shlex.join(command), flush=True)
    if not print_only:
        os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        os.execvp(command[0], command)


INSECURE_REMOTE_HELP = "with --insecure-local-test: allow a non-loopback address (unencrypted, unauthenticated)"


# long: a flat listing, one subcommand after another with one argument per line
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
        _run_supernode(parser, args)
    elif args.step == "results":
        fetched = fetch_results(args.run_id, args.connection, args.out, args.runs, args.ssh)
        print_json(fetched, [fetched], ["run_id", "status", "folder", "out"])
    elif args.step == "recipe":
        print(_recipe_text(args))


def _run_supernode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Run (or print) the SuperNode command; TLS needs both --ca and --key unless it is a local test."""
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


def _recipe_text(args: argparse.Namespace) -> str:
    """The recipe the options ask for; a bad --budgets list is an error naming the option."""
    budgets = None
    if args.budgets:
        try:
            budgets = list(parse_macs_list(args.budgets))
        except ValueError as error:
            raise ValueError(f"--budgets {args.budgets!r}: {error}") from None
    return recipe(
        args.dir,
        args.nodes,
        args.connection,
        args.host,
        args.port,
        budgets=budgets,
        insecure_local_test=args.insecure_local_test,
        allow_remote_insecure=args.insecure_allow_remote,
    )
