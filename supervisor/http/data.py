"""Data gathering for the HTTP child: plain dicts from the database and the master.

Nothing here renders a response, so the JSON API, the metrics and the dashboard
share one way of finding things out. Every function is synchronous (Starlette
runs it in its thread pool) and bounded by the pool's statement timeout.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import admin, control, defaults
from ..identity import HOSTNAME
from .state import AppState

log = logging.getLogger(__name__)

CONTROL_TIMEOUT = 2.0  # seconds: the master answers from its loop, at once when healthy


def master_status(state: AppState) -> dict[str, Any] | None:
    """The local master's status over its control socket (None: no local master)."""
    path = state.control_socket
    if path is None or not path.exists():
        return None
    try:
        reply = control.request(path, {"cmd": "status"}, timeout=CONTROL_TIMEOUT)
    except control.ControlError as exc:
        log.debug("no master status: %s", exc)
        return None
    return reply if reply.get("ok") else None


def master_health(state: AppState) -> dict[str, Any]:
    """Is a master alive and beating? The local control socket says so at once;
    otherwise the master's row in the `workers` registry must be fresh."""
    status = master_status(state)
    if status is not None:
        ok = status["state"] != "stopping"
        return {"ok": ok, "source": "control socket", "pid": status["pid"], "state": status["state"],
                **({} if ok else {"problem": "the master is stopping"})}
    stale_after = 3 * defaults.MASTER_BEAT_SECONDS
    try:
        with state.connection() as conn:
            rows = admin.masters(conn)
    except Exception as exc:
        return {"ok": False, "source": "database", "problem": f"database unreachable: {exc}"}
    fresh = [r for r in rows if r["stopped_at"] is None and r["beat_age"] <= stale_after]
    local = [r for r in fresh if r["host"] == HOSTNAME]
    chosen = local or fresh
    if not chosen:
        return {"ok": False, "source": "database",
                "problem": f"no master has beaten in the last {stale_after:g}s"}
    m = chosen[0]
    return {"ok": True, "source": "database", "host": m["host"], "pid": m["pid"], "state": m["state"],
            "beat_age": m["beat_age"]}


def readiness(state: AppState) -> dict[str, Any]:
    """The database answers and every role runs its wanted count."""
    problems: list[str] = []
    roles: dict[str, dict[str, Any]] = {}
    try:
        with state.connection() as conn:
            conn.execute("SELECT 1")
            live = admin.live_processes_by_role(conn)
    except Exception as exc:
        problems.append(f"database unreachable: {exc}")
        live = None
    status = master_status(state)
    if status is not None:
        for r in status["roles"]:
            roles[r["name"]] = {"wanted": r["wanted"], "running": r["running"], "state": r["state"]}
    elif state.config is not None and live is not None:
        for rc in state.config.roles:
            roles[rc.name] = {"wanted": rc.processes, "running": live.get(rc.name, 0), "state": "registry"}
    for name, r in roles.items():
        if r["running"] < r["wanted"]:
            problems.append(f"role {name}: {r['running']} of {r['wanted']} process(es) running ({r['state']})")
    return {"ok": not problems, "problems": problems, "roles": roles}
