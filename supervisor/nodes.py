"""Hosts as the workers registry knows them, and forgetting a dead one.

A host whose processes died without anyone seeing it (power off, a VM gone) leaves
its running jobs to the beat rule (worker/liveness.py) when its processes held
sessions of their own, else to their leases. An operator who knows the host is gone
need not wait: ``forget`` releases every job leased to its processes at once (a
lease loss each, as any release) and marks its processes lost. It refuses while the
host still beats, since a live host's jobs would then run twice.
"""

from __future__ import annotations

from typing import Any

import psycopg

from . import db, defaults, registry
from .broker import logstore, sql
from .broker.sql import joblog
from .identity import operator


class NodeError(RuntimeError):
    pass


def nodes(conn: psycopg.Connection, node: str | None = None) -> list[dict[str, Any]]:
    return db.dicts(conn, registry.NODES, {"node": node, "stale_beats": defaults.STALE_BEATS,
                                           "heartbeat_s": defaults.HEARTBEAT_SECONDS})


def forget(conn: psycopg.Connection, node: str) -> dict[str, Any]:
    """Release the jobs of ``node``'s processes and mark them lost. Returns what it did."""
    with conn.transaction():
        found = nodes(conn, node)
        if not found:
            raise NodeError(f"no node {node!r} in the workers registry (see `supervisor nodes list`)")
        if found[0]["beating"]:
            raise NodeError(f"node {node!r} still beats (last beat {found[0]['beat_age_s']:.0f}s ago): its "
                            "processes are alive; stop them (or wait until they stop beating) first")
        released = conn.execute(sql.RELEASE_NODE, {"node": node, "who": operator(), "why": f"node {node} forgotten",
                                                   "default_max_losses": defaults.MAX_LEASE_LOSSES}).fetchall()
        released += conn.execute(joblog.LOG_RELEASE, logstore.release_params(
            operator(), why=f"node {node} forgotten", node=node)).fetchall()
        lost = [r[0] for r in conn.execute(registry.FORGET_NODE, {"node": node})]
    return {"node": node, "jobs_released": len(released), "processes_lost": len(lost),
            "failed_as_poison": sum(1 for r in released if r[1] == "failed")}
