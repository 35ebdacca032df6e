"""What a Flower runtime (SuperLink, SuperNode) sets on messages, set by hand where code drives strategies and client
functions without one (tests, ``experiments.runner.in_process_grid``). Flower 1.42 offers no public API for these: every
reach into its internals is here."""

from __future__ import annotations

import contextlib

from flwr.app import Message


def set_reply_source(reply: Message, node_id: int) -> None:
    """The node a reply comes from (a SuperLink sets it on delivery)."""
    reply.metadata.__dict__["_src_node_id"] = node_id


def set_message_id(message: Message, message_id: str) -> None:
    """A pushed message's id (a SuperLink assigns it on push)."""
    message.metadata.__dict__["_message_id"] = message_id


@contextlib.contextmanager
def message_identity():
    """Messages need a task identity, which a Flower runtime normally sets (internal API)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
