"""Data gathering for the HTTP child: plain dicts from the database and the master.

Nothing here renders a response, so the JSON API, the metrics and the dashboard
share one way of finding things out. Every function is synchronous (Starlette
runs it in its thread pool) and bounded by the pool's statement timeout.
"""

from __future__ import annotations

import base64
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from .. import actor_stats, admin, apps, control, defaults, limits, ratelimit, workflow_ops
from ..identity import node_name
from ..schedules import describe
from .state import AppState, read_from

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
    local = [r for r in fresh if r["host"] == node_name()]
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


# --- the API's reads ----------------------------------------------------------------------

RECENT_RUNS = 10


def encode_cursor(created_at: datetime, job_id: str) -> str:
    """Where the next page of jobs starts (the API's and the dashboard's), opaque to clients."""
    raw = f"{created_at.isoformat()}|{job_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor points after; ValueError if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, job_id = raw.partition("|")
        return datetime.fromisoformat(at), str(uuid.UUID(job_id))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"bad cursor {cursor!r}: pass the next_cursor of the previous page") from exc


def jobs_page(state: AppState, where: admin.JobFilter, *, limit: int, cursor: str | None) -> dict[str, Any]:
    """A page and the cursor of the next; the first page (no cursor) also the ``count`` of
    the jobs that match (``admin.Count``: exact, or how it was estimated). A search no
    index serves adds ``scan``: the jobs it reads at most per page, and (``scanned_to``)
    the creation time of the last one read when older jobs were left for the next page."""
    after = decode_cursor(cursor) if cursor else None
    with state.reading() as conn:
        page = admin.jobs_page(conn, where, limit=limit, after=after)
        count = admin.page_count(conn, where, page, first=True) if cursor is None else None
    out: dict[str, Any] = {"jobs": page.rows, "next_cursor": encode_cursor(*page.after) if page.after else None,
                           "read_from": read_from.get()}
    if count is not None:
        out["count"] = count.json()
    if page.scan_rows is not None:
        out["scan"] = {"rows": page.scan_rows, "scanned_to": page.scanned_to}
    return out


def job_detail(state: AppState, job_id: str) -> dict[str, Any] | None:
    with state.reading() as conn:
        job = admin.show_job(conn, job_id)
        if job is not None:
            job["workflow"] = workflow_ops.workflow_of_job(conn, job_id)  # a step's workflow, else None
    if job is None:
        return None
    job["timeline"] = job.pop("events")
    return job


def workers(state: AppState) -> list[dict[str, Any]]:
    """The registry, with why a process is paused: its own beat's reason (every host),
    or the local master's fresher word for its children."""
    with state.reading() as conn:
        rows = admin.workers(conn)
    status = master_status(state)
    paused: dict[str, str | None] = {}
    if status is not None:
        paused = {p["owner"]: p["paused"] for r in status["roles"] for p in r["processes"]}
    for r in rows:
        r["paused_why"] = paused.get(r["id"]) or r.get("paused_reason")
        r["queues"] = list(r["queues"] or [])
    return rows


def schedules(state: AppState) -> list[dict[str, Any]]:
    """Configured schedules (schedules.describe: cron, zone, last and next fire in UTC
    and in the zone, the next 3), with recent runs; plus any the database knows of that
    the config does not name."""
    with state.reading() as conn:
        locks, recent = admin.schedule_state(conn, runs=RECENT_RUNS)
    now = datetime.now(UTC)
    out = []
    configured = state.config.schedules if state.config is not None else ()
    for s in configured:
        out.append({**describe(s, now, (locks.get(s.name) or {}).get("fire_at")),
                    "recent_runs": recent.get(s.name, [])})
    for name in sorted((set(locks) | set(recent)) - {s.name for s in configured}):
        out.append({"name": name, "cron": None, "timezone": None, "actor": None, "queue": None, "catch_up": None,
                    "last_fire": (locks.get(name) or {}).get("fire_at"), "last_fire_local": None,
                    "next_fire": None, "next_fire_local": None, "next": [], "recent_runs": recent.get(name, [])})
    return out


def system_state(state: AppState) -> dict[str, Any]:
    """The master (when local), the database, job counts by status (each exact up to
    admin.COUNT_EXACT_UPTO, else estimated: ``admin.Count``), the apps in use (their
    pages, alerts and gauges are shown), and this server."""
    out: dict[str, Any] = {"host": node_name(), "http": {"read_only": state.http.read_only,
                                                      "token_required": state.http.auth_required}}
    out["master"] = master_status(state)
    try:
        with state.reading() as conn:
            out["database"] = {"reachable": True, "server_version": conn.info.server_version}
            out["jobs"] = {status: c.json() for status, c in admin.counts_by_status(conn).items()}
            out["paused_queues"] = admin.paused_queues(conn)
            in_use = state.apps_in_use()
            out["apps"] = [a.name for a in in_use]
            out["app_state"] = {a.name: _app_state(conn, a) for a in in_use if a.state is not None}
    except Exception as exc:
        out["database"] = {"reachable": False, "error": str(exc)}
    return out


def _app_state(conn: Any, app: apps.App) -> dict[str, Any]:
    """An app's section of the state; one that fails says why instead (the rest stands)."""
    assert app.state is not None
    try:
        return dict(app.state(conn))
    except Exception as exc:
        log.warning("app %s: its state could not be read: %s", app.name, exc)
        return {"error": f"{type(exc).__name__}: {exc}"}


# --- the metrics snapshot -----------------------------------------------------------------------


def _app_gauges(conn: Any, in_use: tuple[apps.App, ...]) -> list[apps.Gauge]:
    """The gauges of the apps in use; one that fails reports none (and says why in the log)."""
    out: list[apps.Gauge] = []
    for app in in_use:
        if app.gauges is None:
            continue
        try:
            out.extend(app.gauges(conn))
        except Exception as exc:  # an app's code: the runtime's gauges are reported whatever it raises
            log.warning("app %s reported no gauges: %s", app.name, exc)
    return out


def metrics_snapshot(state: AppState) -> dict[str, Any]:
    """What /metrics reports from the database and the master: one connection, five
    short reads (capacity view, workers registry, rate limiters, the limit keys as the
    claim sees them, the start waits per actor of the last minutes' jobs), and the local
    master's status when there is one. Raises if the database is away."""
    in_use = state.apps_in_use()
    with state.reading() as conn:
        snapshot: dict[str, Any] = {
            "queues": admin.queue_capacity(conn, waits=False),
            "workers": [w for w in admin.workers(conn) if w["stopped_at"] is None],
            "limiters": ratelimit.states(conn),
            "limit_keys": limits.seen(conn).keys,
            "start_waits": actor_stats.start_waits(conn),
            "workflows": workflow_ops.counts_by_state(conn),
            "app_gauges": _app_gauges(conn, in_use),
        }
    snapshot["master"] = master_status(state)
    return snapshot
