"""The partition query, both sides: the server asks each SuperNode which partition it holds (``partition_query``),
the node's ClientApp answers from its node config (``partition_answer``), and the server reads the answer, checked
(``partition_info``). One config record (``QUERY_RECORD``) carries the keys ``PARTITION_ID``, ``NUM_PARTITIONS``
and, when the node config sets one, ``BUDGET_MACS``."""

from __future__ import annotations

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fl_app.run.records import CONFIG_RECORD

QUERY_RECORD = CONFIG_RECORD  # the one record of a query and of its answer
PARTITION_ID, NUM_PARTITIONS, BUDGET_MACS = "partition-id", "num-partitions", "budget-macs"
NODE_ID = "node_id"  # added by the server to what a node answered: the node that answered


def partition_query(node_id: int) -> Message:
    """The QUERY a node answers with its node config's partition-id and num-partitions (and budget, if set)."""
    return Message(RecordDict({QUERY_RECORD: ConfigRecord({})}), message_type=MessageType.QUERY, dst_node_id=node_id)


def partition_answer(
    query: Message, partition_id: int, num_partitions: int, budget_macs: float | None = None
) -> Message:
    """A node's reply to ``query``: its partition and the federation size from its node config, and its budget
    when the node config declares one."""
    info = {PARTITION_ID: partition_id, NUM_PARTITIONS: num_partitions}
    if budget_macs is not None:
        info[BUDGET_MACS] = budget_macs
    return Message(RecordDict({QUERY_RECORD: ConfigRecord(info)}), reply_to=query)


def partition_info(reply: Message, num_partitions: int | None = None) -> dict:
    """A node's answer to ``partition_query``: {"node_id", "partition-id", "num-partitions", ...}. Raises ValueError
    naming the node and its values when the answer is malformed, or when ``num_partitions`` (the federation's) is
    given and the node's num-partitions or partition-id does not fit it."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        raise ValueError(f"SuperNode {node} did not answer the partition query: {reply.error.reason}")
    config = reply.content.config_records.get(QUERY_RECORD)
    info = dict(config) if config is not None else {}
    pid, num = info.get(PARTITION_ID), info.get(NUM_PARTITIONS)
    for key, value in ((PARTITION_ID, pid), (NUM_PARTITIONS, num)):
        if isinstance(value, bool):  # a bool is an int to Python, never a partition
            raise ValueError(f"SuperNode {node} answered {key}={value!r}: a bool, its node-config needs an integer")
    if not (isinstance(pid, int) and isinstance(num, int) and 0 <= pid < num):
        raise ValueError(
            f"SuperNode {node} answered partition-id={pid!r}, num-partitions={num!r}: its node-config "
            f"needs integers with 0 <= partition-id < num-partitions"
        )
    if num_partitions is not None and num != num_partitions:
        raise ValueError(
            f"SuperNode {node} (partition-id={pid}) has num-partitions={num} in its node-config, but "
            f"this federation has {num_partitions} partitions (0..{num_partitions - 1}): "
            f"start it with num-partitions={num_partitions}"
        )
    return {**info, NODE_ID: node}
