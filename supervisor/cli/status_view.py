"""`supervisor status` for humans: the master's status reply as a few tables."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import servers
from ..units import human_bytes


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _table(rows: list[list[str]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _server(seen: dict[str, Any] | None) -> str:
    """Which server a process reaches, and since when it does if it changed (a failover)."""
    if not seen:
        return ""
    if not seen.get("previous"):
        return str(seen["address"])
    at = datetime.fromtimestamp(seen["since"]).strftime("%Y-%m-%d %H:%M:%S")
    return f"{seen['address']} (since {at}; before: {seen['previous']})"


def last_failover(status: dict[str, Any]) -> str | None:
    """The newest change of server the master or any child saw: when, from which to which,
    and how many of the processes reach that server now."""
    last = servers.last_change([status.get("server")] + [p.get("server") for r in status["roles"]
                                                          for p in r["processes"]])
    if last is None:
        return None
    at = datetime.fromtimestamp(last["since"]).strftime("%Y-%m-%d %H:%M:%S")
    return (f"last failover seen {at}: {last['previous']} -> {last['address']}"
            f" ({last['there']} of {last['known']} processes there now)")


def render(status: dict[str, Any]) -> str:
    lines = [
        f"node {status.get('node', '?')}  master pid {status['pid']}  {status['state']}  up {human_duration(status['uptime'])}  "
        f"rss {human_bytes(status['rss'])}  reloads {status['reloads']}",
        f"config {status['config']}  database {status['database']}"
        + ("  (pooled)" if status.get("pooled") else "")
        + (f"  server {_server(status.get('server'))}" if status.get("server") else ""),
        "",
    ]
    failover = last_failover(status)
    if failover:
        lines.insert(-1, failover)
    paused = {p["queue"]: p for p in status.get("paused_queues") or []}
    for queue, p in paused.items():
        why = f": {p['reason']}" if p.get("reason") else ""
        lines.insert(-1, f"queue {queue} paused by {p.get('paused_by') or '?'}{why}")
    for w in status.get("backing_off") or []:  # every host's, from the registry
        lines.insert(-1, f"{w['host']} pid {w['pid']} ({w['role']}) not claiming: {w['paused_reason']}")
    for role in status["roles"]:
        scaled = " (scaled)" if role["scaled"] else ""
        queues = ",".join(q + (" (paused)" if q in paused else "") for q in role["queues"])
        head = (f"{role['name']}: {role['running']}/{role['wanted']} running{scaled}  {role['state']}  "
                f"queues {queues}  threads {role['threads']}  restarts {role['restarts']}")
        lines.append(head)
        if role["last_exit"]:
            lines.append(f"  last exit {human_duration(role['last_exit_ago'])} ago: {role['last_exit']}")
        if role["next_restart_in"] is not None:
            lines.append(f"  next start in {human_duration(role['next_restart_in'])}")
        procs = role["processes"]
        if procs:
            rows = [["PID", "SLOT", "STATE", "UPTIME", "RSS", "CPU%", "IN FLIGHT", "DONE", "SERVER", "NOTE"]]
            for p in procs:
                note = p["stop_reason"] or p["paused"] or (f"recycle: {p['recycle']}" if p["recycle"] else "")
                if not p["current"] and not note:
                    note = "old settings"
                rows.append([str(p["pid"]), str(p["slot"]), p["state"], human_duration(p["uptime"]),
                             human_bytes(p["rss"]), f"{p['cpu']:.0f}", str(p["in_flight"]), str(p["done"]),
                             _server(p.get("server")) or "-", note or ""])
            lines += _table(rows, "  ")
        lines.append("")
    return "\n".join(lines).rstrip()
