"""ServerApp: validates the run config, finds the nodes and their partitions, and hands the run to the method's
family (``fl_app.supernet_app`` or ``fl_app.multiarch_app``)."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fl_app.multiarch_app import MULTIARCH_METHODS, run_multiarch
from fl_app.node_discovery import check_federation, discover_nodes
from fl_app.run.config import SUPERNET_METHODS, validate_run_config
from fl_app.run.tracker import tracking
from fl_app.supernet_app import prepare_supernet, run_supernet

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = validate_run_config(dict(context.run_config))
    with tracking(run, context.run_id):  # the run id beside the results; the tracker's package checked before training
        nodes = discover_nodes(
            grid,
            timeout=run["round-timeout"],
            while_waiting=lambda: SERVER_PREPARE.get(run["method"], lambda r: None)(run),
        )
        check_federation(nodes)
        SERVER_RUNS[run["method"]](grid, run, nodes)


# method -> server run; every method in fl_app.run.config.METHODS has an entry

SERVER_RUNS = {**dict.fromkeys(SUPERNET_METHODS, run_supernet), **dict.fromkeys(MULTIARCH_METHODS, run_multiarch)}
# work a server run can do before it knows its nodes, done while they start up (results are cached per process)
SERVER_PREPARE = dict.fromkeys(SUPERNET_METHODS, prepare_supernet)
