"""Run the app on a real Flower deployment: one SuperLink with TLS and SuperNode authentication, N SuperNodes
(docs/deployment.md). One function per step, usable from scripts; ``python -m fl_app.deploy`` wraps the same steps.

- ``credentials``: the SuperLink's CA and server certificate, the SuperNodes' authentication keys;
- ``files``: private folders, key sets installed all or nothing, the ``flwr`` CLI's connection in config.toml;
- ``commands``: the ``flower-superlink`` / ``flower-supernode`` command lines, ``flwr supernode register|list``,
  the whole sequence as shell lines (``recipe``);
- ``results``: a finished run's output folder copied from the SuperLink's host;
- ``addresses``: checks of the host names and of the insecure local-test mode's loopback-only rule;
- ``cli``: the command line.

Starting and stopping these processes from tests is the test harness's job (tests/harness/deployment.py).
"""

from fl_app.deploy.cli import build_parser, main
from fl_app.deploy.commands import (
    DEFAULT_SUPERLINK_PORT,
    DEFAULT_SUPERNODE_PORT,
    flwr_cli,
    list_nodes,
    node_config,
    recipe,
    register_node,
    superlink_command,
    supernode_command,
)
from fl_app.deploy.credentials import MAX_CERT_DAYS, make_certs, make_node_key, make_node_keys
from fl_app.deploy.files import write_connection
from fl_app.deploy.results import fetch_results

__all__ = [
    "DEFAULT_SUPERLINK_PORT",
    "DEFAULT_SUPERNODE_PORT",
    "MAX_CERT_DAYS",
    "build_parser",
    "fetch_results",
    "flwr_cli",
    "list_nodes",
    "main",
    "make_certs",
    "make_node_key",
    "make_node_keys",
    "node_config",
    "recipe",
    "register_node",
    "superlink_command",
    "supernode_command",
    "write_connection",
]
