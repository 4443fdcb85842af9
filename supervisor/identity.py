"""Who a process is: the owner id written into leases, the registry and logs.

Format: ``node:pid:token``. The node is ``supervisor.node_name`` (default: the
host name), so two supervisors on one machine can act as two hosts. The random
token tells apart two processes that got the same pid (after a reboot, or in a
container) so a late writer of an old process never matches a new one.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket

HOSTNAME = socket.gethostname()
_node = os.environ.get("SUPERVISOR_NODE_NAME") or HOSTNAME


def node_name() -> str:
    """This process's node: set by the master before it forks, so children share it."""
    return _node


def set_node_name(name: str | None) -> None:
    global _node
    _node = name or os.environ.get("SUPERVISOR_NODE_NAME") or HOSTNAME


def new_token() -> str:
    return secrets.token_hex(3)


def owner_id(pid: int | None = None, token: str | None = None) -> str:
    """The owner id of process ``pid`` (default: this one). A supervisor picks the
    token before forking, so it knows its child's id as soon as it has the pid."""
    return f"{_node}:{os.getpid() if pid is None else pid}:{token or new_token()}"


def operator() -> str:
    """Who ran a CLI command, for `job_events.who`."""
    return f"operator {getpass.getuser()}@{_node}"
