"""The dashboard's data: plain dicts from the database and the local master.

Nothing here renders. SQL lives with its table (``broker.sql`` for jobs,
``recorder`` for the samples, ``worker.scheduler_sql``, ``ratelimit``); each
function takes the app state and returns what one page shows.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psutil
import psycopg

from ... import actor_stats, admin, db, jobsearch, ratelimit, registry, servers, workflow_ops
from ... import limits as flow_limits
from ...broker import reads
from ...schedules import describe
from ...worker import scheduler_sql
from .. import data
from ..state import AppState
from . import recorder
from .extension import Page, Table

log = logging.getLogger(__name__)
T = TypeVar("T")

# window name -> (seconds, bucket seconds)
WINDOWS = {"1h": (3600, 60), "6h": (6 * 3600, 300), "24h": (24 * 3600, 900)}
RAW_WINDOW_S = 3600
PAGE_SIZE = 50
BULK_LIMIT = 10_000
RUNS_SHOWN = 30




def app_pages(state: AppState) -> list[Page]:
    """The pages of the apps in use here (an app without the hook adds none)."""
    return [p for app in state.apps_in_use() if app.pages is not None for p in app.pages()]


def _contributed(page: Page, what: str, read: Callable[[], Sequence[T]], failed: Callable[[str], T]) -> list[T]:
    """An app's contribution to a runtime page; when it fails, one line saying so
    instead: the runtime's own pages never fail for an app's sake."""
    try:
        return list(read())
    except Exception as exc:  # an app's code: whatever it raises, the page still renders
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning("the %s of page %s failed: %s", what, page.slug, first)
        return [failed(f"{page.title}: its {what} could not be read ({first})")]


# --- overview ----------------------------------------------------------------------------


def overview(state: AppState, window: str) -> dict[str, Any]:
    span, step = WINDOWS[window]
    with state.reading() as conn:
        # The last hour from the rows themselves (current to the second); longer windows
        # from the recorder's rollup, which never reads a day of jobs.
        series = reads.FINISHED_PER_BUCKET if span <= RAW_WINDOW_S else recorder.FINISHED_SERIES
        finished = db.dicts(conn, series, {"step_s": step, "window_s": span})
        depth = db.dicts(conn, recorder.QUEUE_SERIES, {"step_s": step, "window_s": span})
        # the start waits of the window's newest jobs, as many as the Actors page reads at most
        lat = conn.execute(reads.START_LATENCY, {"window_s": span, "cap": actor_stats.SCAN_CAP}).fetchone()
    q = queues(state, detail=False)
    now = time.time()
    pct = (lat[1] if lat and lat[1] else None) or [None, None, None]
    capped = lat is not None and lat[0] >= actor_stats.SCAN_CAP
    return {
        "window": window, "t0": now - span, "t1": now, "step": step,
        "finished": [(r["t"].timestamp(), (int(r["succeeded"]), int(r["failed"]))) for r in finished],
        "depth": [(name, [(r["t"].timestamp(), float(r[name])) for r in depth])
                  for name in ("waiting", "running", "scheduled")],
        "latency": {"n": lat[0] if lat else 0, "p50": pct[0], "p95": pct[1], "p99": pct[2],
                    # a window with more finished jobs than the cap: its newest, from this finish on
                    "covered_since": lat[2] if capped and lat else None},
        "roles": roles(state),
        "servers": servers_by_process(state),
        "alerts": alerts(state, q),
        "totals": {k: sum(r[k] for r in q) for k in ("ready", "scheduled", "running", "retryable")},
    }


def servers_by_process(state: AppState) -> dict[str, Any]:
    """The database server each process of this host reaches, as the local master's status
    says (the master's own, each child's from its beats: no read of the database), and the
    newest change of server one of them saw (a failover). Empty with no local master."""
    status = data.master_status(state)
    if status is None:
        return {"processes": [], "last": None}
    said = [("master", status["pid"], status.get("server"))] + [
        (f"{r['name']}[{p['slot']}]", p["pid"], p.get("server")) for r in status["roles"] for p in r["processes"]]
    rows = [{"process": name, "pid": pid, "address": seen["address"] if seen else None,
             "previous": seen.get("previous") if seen else None,
             "since": datetime.fromtimestamp(seen["since"], UTC) if seen and seen.get("previous") else None}
            for name, pid, seen in said]
    last = servers.last_change([seen for _, _, seen in said])
    if last is not None:
        last = {**last, "since": datetime.fromtimestamp(last["since"], UTC)}
    return {"processes": rows, "last": last}


def alerts(state: AppState, queue_rows: list[dict[str, Any]]) -> list[str]:
    out = [f"role {r['name']} is crash-looping ({r['running']}/{r['wanted']}; last exit: {r['last_exit']})"
           for r in roles(state) if r["state"] == "crash-looping"]
    for q in queue_rows:
        if q["paused"]:
            out.append(f"queue {q['queue']} is paused (by {q['paused']['paused_by']})")
        need = q["needed"].get("1h")
        if need is not None and need > q["workers"]:
            out.append(f"queue {q['queue']} needs {need} worker(s) to drain in 1 h; {q['workers']} running")
    pages = [p for p in app_pages(state) if p.alerts is not None]
    if pages:
        with state.reading() as conn:
            for page in pages:
                assert page.alerts is not None
                out.extend(_contributed(page, "alerts", functools.partial(page.alerts, conn), str))
    return out


# --- roles and processes ------------------------------------------------------------------


def roles(state: AppState) -> list[dict[str, Any]]:
    """Each role with its wanted and running counts: the local master's view when it
    answers, else the config against the registry."""
    status = data.master_status(state)
    if status is not None:
        return [{**r, "local": True} for r in status["roles"]]
    live: dict[str, int] = {}
    with state.reading() as conn:
        live = admin.live_processes_by_role(conn)
    configured = state.config.roles if state.config is not None else ()
    return [{"name": rc.name, "wanted": rc.processes, "running": live.get(rc.name, 0), "state": "registry",
             "restarts": None, "last_exit": None, "queues": list(rc.queues), "processes": [], "local": False}
            for rc in configured]


def _claims(row: dict[str, Any]) -> bool:
    """A live registry row of a process that claims jobs: not a master's row (role
    'master', as worker.registry writes it), not one serving no queue (the HTTP child)."""
    return row["stopped_at"] is None and row["role"] != "master" and bool(row["queues"])


def _level(pct: float | None) -> str:
    if pct is None:
        return "none"
    return "green" if pct < 50 else "yellow" if pct < 75 else "amber" if pct < 90 else "red"


def workers(state: AppState) -> dict[str, Any]:
    """Per role its processes: in flight / capacity, memory and CPU against the role's
    limits (colour level), a sparkline's points over the last hour, why it backs off."""
    span, step = WINDOWS["1h"]
    with state.reading() as conn:
        rows = db.dicts(conn, registry.LIST)
        series_rows = db.dicts(conn, recorder.PROCESS_SERIES, {"step_s": recorder.SAMPLE_SECONDS, "window_s": span})
    series: dict[str, list[tuple[float, float, float]]] = {}
    for r in series_rows:
        series.setdefault(r["worker_id"], []).append(
            (r["t"].timestamp(), float(r["rss_bytes"] or 0), float(r["cpu_percent"] or 0)))
    status = data.master_status(state)
    local = {p["owner"]: p for r in (status or {}).get("roles", []) for p in r["processes"]}
    role_info = {r["name"]: r for r in roles(state)}
    configs = {rc.name: rc for rc in state.config.roles} if state.config is not None else {}
    host_memory = psutil.virtual_memory().total
    by_role: dict[str, list[dict[str, Any]]] = {}
    for w in rows:
        if not _claims(w):
            continue
        rc = configs.get(w["role"])
        mem_limit = (rc.limits.max_rss if rc and rc.limits.max_rss else host_memory)
        cpu_limit = (rc.limits.cpu_percent if rc and rc.limits.cpu_percent else 100.0)
        capacity = rc.capacity if rc else None
        mine = local.get(w["id"], {})
        mem_pct = 100 * w["rss_bytes"] / mem_limit if w["rss_bytes"] else None
        cpu_pct = 100 * w["cpu_percent"] / cpu_limit if w["cpu_percent"] is not None else None
        points = series.get(w["id"], [])
        by_role.setdefault(w["role"], []).append({
            **w, "capacity": capacity, "mem_pct": mem_pct, "cpu_pct": cpu_pct,
            "mem_level": _level(mem_pct), "cpu_level": _level(cpu_pct),
            "mem_limit": mem_limit, "cpu_limit": cpu_limit,
            "mem_points": [(t, m) for t, m, _ in points], "cpu_points": [(t, c) for t, _, c in points],
            "paused": mine.get("paused") or w.get("paused_reason"), "beat_age": (datetime.now(UTC) - w["heartbeat_at"]).total_seconds(),
        })
    # A role that serves no queue (the master's HTTP child) runs no jobs: not a worker.
    names = [n for n, r in role_info.items() if r.get("queues")] + [n for n in by_role if n not in role_info]
    out = []
    for name in names:
        info = role_info.get(name, {"name": name, "wanted": None, "running": len(by_role.get(name, [])),
                                    "state": "registry", "restarts": None, "local": False})
        out.append({**info, "procs": by_role.get(name, [])})
    return {"roles": out, "t0": time.time() - span, "t1": time.time(), "scalable": status is not None}


# --- queues -------------------------------------------------------------------------------


def queues(state: AppState, *, detail: bool = True) -> list[dict[str, Any]]:
    """Per queue: live counts, the last hour's throughput and the workers needed; with
    ``detail`` (the Queues page), also run times and waits, failure rates over 6 h and
    24 h (the recorder's rollup) and the failed jobs kept (estimated when many:
    ``failed_estimated_by``)."""
    with state.reading() as conn:
        live = {r["queue"]: r for r in db.dicts(conn, reads.LIVE_BY_QUEUE)}
        done = {r["queue"]: r for r in db.dicts(conn, reads.FINISHED_BY_QUEUE)}
        rolled = {r["queue"]: r for r in db.dicts(conn, recorder.OUTCOMES_BY_QUEUE)} if detail else {}
        failed, failed_how = admin.failed_by_queue(conn) if detail else ({}, None)
        paused = {r["queue"]: r for r in admin.paused_queues(conn)}
        procs = [r for r in db.dicts(conn, registry.LIST) if _claims(r)]
    names = set(live) | set(done) | set(failed) | set(paused) | {q for p in procs for q in (p["queues"] or [])}
    if state.config is not None:
        names |= {q for rc in state.config.roles for q in rc.queues}
    out = []
    for name in sorted(names):
        lv, dn = live.get(name, {}), {**rolled.get(name, {}), **done.get(name, {})}
        count = {k: int(lv.get(k) or 0) for k in ("ready", "scheduled", "running", "retryable")}
        serving = sum(1 for p in procs if name in (p["queues"] or []))
        per_worker_hour = (dn["finished_1h"] / dn["owners_1h"]) if dn.get("owners_1h") else None
        backlog = sum(count.values())
        needed = {h: (math.ceil(backlog / (per_worker_hour * int(h[:-1]))) if per_worker_hour else None)
                  for h in ("1h", "4h", "8h")}
        out.append({
            "queue": name, **count,
            "failed": int(failed.get(name, 0)), "failed_estimated_by": failed_how,
            "oldest_wait_s": lv.get("oldest_wait_s"),
            "throughput_1h": int(dn.get("finished_1h") or 0),
            "avg_s": dn.get("avg_s"), "p95_s": dn.get("p95_s"),
            **{k: dn.get(k) for k in admin.WAITS},
            "failure_rate": {w: (dn[f"failed_{w}"] / dn[f"finished_{w}"] if dn.get(f"finished_{w}") else None)
                             for w in ("1h", "6h", "24h")},
            "workers": serving, "per_worker_hour": per_worker_hour, "needed": needed,
            "paused": paused.get(name),
        })
    return out


def queue_names(state: AppState) -> list[str]:
    """The Jobs page's queue choices: the queues the database knows of without reading
    the jobs (``admin.queue_names``), and the config's."""
    with state.reading() as conn:
        found = set(admin.queue_names(conn))
    if state.config is not None:
        found |= {q for rc in state.config.roles for q in rc.queues}
    return sorted(found)


# --- jobs ---------------------------------------------------------------------------------

# The jobs page's form: its time fields (datetime-local: no time zone, read as UTC) and
# the filter's fields they fill.
FORM_TIMES = {"since": "created_after", "until": "created_before"}


def form_filter(q: Any) -> admin.JobFilter:
    """The jobs page's filter from its query or form fields (the search's have the API's
    names); blanks are absent; a bad value raises ValueError."""
    def get(name: str) -> str | None:
        v = (q.get(name) or "").strip()
        return v or None
    times = {}
    for name, field in FORM_TIMES.items():
        v = get(name)
        t = datetime.fromisoformat(v) if v else None
        times[field] = t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t
    return admin.JobFilter(status=admin.job_status(get("status")), queue=get("queue"), actor=get("actor"),
                           text=get("text"), search=jobsearch.Search.parse(q), **times)


def form_fields(where: admin.JobFilter) -> dict[str, str]:
    """The filter as the jobs page's form fields (for links that keep it, and the form's
    own values: a time in UTC without its zone, which a datetime-local field refuses)."""
    own: dict[str, Any] = {"status": where.status, "queue": where.queue, "actor": where.actor, "text": where.text,
                           **{name: getattr(where, field) for name, field in FORM_TIMES.items()}}
    return {**{k: (v.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="minutes")
                   if isinstance(v, datetime) else v)
               for k, v in own.items() if v is not None}, **where.search.query()}


def jobs(state: AppState, where: admin.JobFilter, cursor: str | None) -> dict[str, Any]:
    after = data.decode_cursor(cursor) if cursor else None
    with state.reading() as conn:
        found = admin.jobs_page(conn, where, limit=PAGE_SIZE, after=after, columns=reads.PAGE_COLUMNS)
        total = admin.page_count(conn, where, found, first=cursor is None)
    return {"jobs": found.rows, "next": data.encode_cursor(*found.after) if found.after else None, "total": total,
            "scan_rows": found.scan_rows, "scanned_to": found.scanned_to, "queues": queue_names(state)}


def matching_ids(conn: psycopg.Connection, where: admin.JobFilter) -> list[str]:
    return admin.matching_ids(conn, where, limit=BULK_LIMIT)


def job(state: AppState, job_id: str) -> dict[str, Any] | None:
    with state.reading() as conn:
        found = admin.show_job(conn, job_id)
        owner = None
        if found is not None:  # a workflow's step links back to its workflow's page
            found["workflow"] = workflow_ops.workflow_of_job(conn, job_id)
        if found is not None and found["lease_owner"]:
            owner = next((w for w in db.dicts(conn, registry.LIST) if w["id"] == found["lease_owner"]), None)
    if found is None:
        return None
    heartbeat = None
    if owner is not None and state.config is not None:
        rc = state.config.roles_by_name.get(owner["role"])
        heartbeat = rc.heartbeat if rc else None
    now = datetime.now(UTC)
    found["lease"] = None
    if found["status"] == "running" and found["heartbeat_at"] is not None:
        found["lease"] = {"owner": found["lease_owner"], "age_s": (now - found["heartbeat_at"]).total_seconds(),
                          "heartbeat_s": heartbeat, "host": owner["host"] if owner else None,
                          "expires_in_s": ((found["lease_expires_at"] - now).total_seconds()
                                           if found["lease_expires_at"] else None)}
    for key in ("args", "kwargs", "options", "result"):
        found[f"{key}_json"] = json.dumps(found[key], indent=2, sort_keys=True, default=str)
    return found


# --- schedules and limits -----------------------------------------------------------------


def schedules(state: AppState) -> list[dict[str, Any]]:
    with state.reading() as conn:
        locks = {r["job_name"]: r for r in db.dicts(conn, scheduler_sql.LOCKS)}
        recent: dict[str, list[dict[str, Any]]] = {}
        for r in db.dicts(conn, scheduler_sql.RECENT_RUNS, {"per_schedule": RUNS_SHOWN}):
            recent.setdefault(r["job_name"], []).append(r)
    now = datetime.now(UTC)
    configured = state.config.schedules if state.config is not None else ()
    out = []
    for s in configured:
        runs = list(reversed(recent.get(s.name, [])))  # oldest first, for the strip
        last = (locks.get(s.name) or {}).get("fire_at") or (runs[-1]["started_at"] if runs else None)
        out.append({**describe(s, now, last), "runs": runs,
                    "strip": [(r["status"], r["started_at"].isoformat(timespec="seconds")) for r in runs]})
    return out


def limits(state: AppState, after: str = "") -> dict[str, Any]:
    """The limit keys as the claim sees them (``supervisor.limits.seen``, a page of
    them after ``after``), the buckets, and what apps add."""
    pages = [p for p in app_pages(state) if p.limits is not None]
    tables: list[Table] = []
    with state.reading() as conn:
        seen = flow_limits.seen(conn, after=after)
        buckets = ratelimit.states(conn)
        for page in pages:
            assert page.limits is not None
            # A failure is a table with the page's title and the failure as its note.
            tables += _contributed(page, "limits", functools.partial(page.limits, conn),
                                   functools.partial(Table, page.title, (), ()))
    return {"keys": seen.keys, "next_after": seen.next_after, "after": after, "buckets": buckets,
            "tables": tables, "max_keys": flow_limits.MAX_KEYS, "upto": flow_limits.WAITING_UPTO}


def app_page(state: AppState, slug: str) -> dict[str, Any] | None:
    page = next((p for p in app_pages(state) if p.slug == slug), None)
    if page is None:
        return None
    with state.reading() as conn:
        return {"page": page, "tables": list(page.tables(conn))}
