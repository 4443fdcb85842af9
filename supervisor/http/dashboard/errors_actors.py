"""The Errors and Actors pages' data and the Errors page's actions on a group.

The figures are ``supervisor.error_groups`` and ``supervisor.actor_stats`` (the
API's and `supervisor errors`' too); this adds what the pages draw: sparkline points,
links, the body each group's buttons send.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from ... import actor_stats, error_groups
from ..state import AppState

ERROR_WINDOWS, ERROR_DEFAULT = tuple(error_groups.WINDOWS), error_groups.DEFAULT_WINDOW
ACTOR_WINDOWS, ACTOR_DEFAULT = tuple(actor_stats.WINDOWS), actor_stats.DEFAULT_WINDOW


def errors(state: AppState, window: str, actor: str | None) -> dict[str, Any]:
    """``window`` is one of ERROR_WINDOWS (checked by the caller)."""
    with state.reading() as conn:
        found = error_groups.error_groups(conn, window_s=error_groups.WINDOWS[window], actor=actor)
    step = found["step_s"]
    for g in found["groups"]:
        g["points"] = [(t.timestamp() + step / 2, float(n)) for t, n in g["buckets"]]
        g["body"] = {"actor": g["actor"], "error_type": g["error_type"], "where": g["where"], "window": window}
    buckets = found["groups"][0]["buckets"] if found["groups"] else []
    found["t0"] = buckets[0][0].timestamp() if buckets else found["since"].timestamp()
    found["t1"] = buckets[-1][0].timestamp() + step if buckets else found["now"].timestamp()
    found["cap"] = error_groups.SCAN_CAP
    found["links"] = [(w, "/errors?" + urlencode({"window": w, **({"actor": actor} if actor else {})}))
                      for w in ERROR_WINDOWS]
    return found


def change_group(state: AppState, action: str, body: dict[str, Any]) -> dict[str, Any]:
    """``retry`` or ``cancel`` (checked by the caller) on the group ``body`` names, over
    the page's window. ValueError for a body that names no group."""
    key, window = _group(body)
    with state.connection() as conn:
        done = error_groups.change_group(conn, action, key, window_s=error_groups.WINDOWS[window])
    skipped = done["matched"] - done["changed"]
    tail = f"; {skipped} not in a state that allows it" if skipped else ""
    return {"ok": True, "message": f"{done['changed']} job(s) {done['verb']}{tail}", "changed": done["ids"]}


def _group(body: dict[str, Any]) -> tuple[error_groups.GroupKey, str]:
    for name in ("actor", "error_type"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise ValueError(f"{name}: required (the group's)")
    where, window = body.get("where", ""), body.get("window", error_groups.DEFAULT_WINDOW)
    if not isinstance(where, str):
        raise ValueError("where: a text (the group's)")
    if window not in error_groups.WINDOWS:
        raise ValueError(f"window: one of {', '.join(ERROR_WINDOWS)}")
    return error_groups.GroupKey(body["actor"], body["error_type"], where), window


def actors(state: AppState, window: str) -> dict[str, Any]:
    """``window`` is one of ACTOR_WINDOWS (checked by the caller). Each actor links to
    its jobs and to its errors over the Errors page's window that holds this one."""
    window_s = actor_stats.WINDOWS[window]
    with state.reading() as conn:
        found = actor_stats.actor_stats(conn, window_s=window_s)
    errors_window = next(w for w, s in error_groups.WINDOWS.items() if s >= window_s)
    for a in found["actors"]:
        a["jobs_href"] = "/jobs?" + urlencode({"actor": a["actor"]})
        a["errors_href"] = "/errors?" + urlencode({"actor": a["actor"], "window": errors_window})
    found["cap"] = actor_stats.SCAN_CAP
    found["links"] = [(w, "/actors?" + urlencode({"window": w})) for w in ACTOR_WINDOWS]
    return found
