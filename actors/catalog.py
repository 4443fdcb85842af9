"""Sources and watches: what the tracker looks at, from the CLI or the config.

One set of checks for both ways in (each error is one line naming the input),
and the operations on the rows. ``sync`` applies the config's declared
``pipeline: {sources: ..., watches: ...}`` by name: declared entries are created
or updated, others are left alone unless ``prune`` is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from supervisor.config import checks as check
from supervisor.config.checks import Check, Item
from supervisor.config.keys import key, to_fields
from supervisor.units import parse_duration

from .queries import pipeline as watch_sql
from .queries import sources as source_sql
from .queries import state as state_sql
from .settings import ScoringSettings

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
FORMATS = ("auto", "json", "html")


class CatalogError(ValueError):
    """A bad input or a missing row: the message is the whole one-line error."""


# --- checks (each raises ValueError with a message naming nothing but the value) -------


def check_name(value: str) -> str:
    if not NAME.match(value or ""):
        raise ValueError(f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 100)")
    return value


def _redact(url: str) -> str:
    from .http import redact_url  # httpx: only when there is a URL to show

    return redact_url(url)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{_redact(value)!r} is not an http(s) URL with a host")
    return value


def check_search_url(value: str) -> str:
    """An http(s) URL template with exactly the placeholder {query}."""
    if "{query}" not in value:
        raise ValueError(f"{value!r} has no {{query}} placeholder (e.g. https://example.com/search?q={{query}})")
    rest = value.replace("{query}", "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"{value!r} has a placeholder other than {{query}}")
    _http_url(value.replace("{query}", "q"))
    return value


def check_webhook(value: str) -> str:
    _http_url(value)
    return value


def price_cents(value: Any) -> int:
    """12.50 or "12.50" -> 1250; zero, negative or more than two decimals is an error."""
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a price (e.g. 12.50)") from None
    if not amount.is_finite() or amount <= 0:
        raise ValueError(f"{value!r} must be a positive price (e.g. 12.50)")
    cents = amount * 100
    if cents != cents.to_integral_value():
        raise ValueError(f"{value!r} has more than two decimals")
    return int(cents)


def check_threshold(value: float) -> float:
    if not 0 < float(value) < 1:
        raise ValueError(f"{value!r} must be a fraction between 0 and 1 (0.2: 20% under the typical price)")
    return float(value)


def check_every(value: Any) -> int:
    seconds = parse_duration(value)
    if seconds < 1:
        raise ValueError(f"{value!r} must be at least 1s")
    return round(seconds)


def _at_least(minimum: float):
    def check(value: Any) -> Any:
        if value < minimum:
            raise ValueError(f"{value!r} must be at least {minimum:g}")
        return value
    return check


CHECKS: dict[str, Any] = {
    "name": check_name, "search_url": check_search_url, "webhook": check_webhook, "target_price": price_cents,
    "deal_threshold": check_threshold, "every": check_every, "rate_per_minute": _at_least(0.001),
    "burst": _at_least(1), "daily_quota": _at_least(0),
}


def checked(option: str, key: str, value: Any) -> Any:
    """Run the check for ``key``; a failure becomes a CatalogError naming ``option``."""
    if value is None:
        return None
    try:
        return CHECKS[key](value)
    except ValueError as exc:
        raise CatalogError(f"{option} {exc}") from None


# The same checks as the config's keys (`pipeline.sources.<source>`, `pipeline.watches.<watch>`).


def _text(what: str, fn: Callable[[str], Any]) -> Check[Any]:
    return Check(what, lambda item: fn(check.string(item)), text=str)


def _format(value: str) -> str:
    if value not in FORMATS:
        raise ValueError(f"must be one of {', '.join(FORMATS)}, got {value!r}")
    return value


def _threshold(item: Item) -> float:
    return check_threshold(check.number(0, 1)(item))


def _every(item: Item) -> int:
    return round(check.duration(1)(item))


def _price(item: Item) -> int:
    return price_cents(item.value)


# --- rows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSpec:
    name: str
    search_url: str = key(_text("URL with {query}", check_search_url), "The search page's URL, {query} standing for "
                          "the watch's query.", required=True)
    format: str = key(_text(" | ".join(FORMATS), _format), "How its pages are read (auto: by content type, else sniffed).", "auto")
    rate_limit_per_minute: float = key(check.number(0.001), "Requests to it per minute, across every host.", 60.0,
                                       name="rate_per_minute")
    burst: int = key(check.integer(1), "Requests it may take at once (the token bucket's size).", 1)
    daily_quota: int | None = key(check.integer(0), "Requests to it per day, across every host.", None, shown="none")
    enabled: bool = key(check.boolean, "Poll it (false: its watches wait).", True)


@dataclass(frozen=True)
class WatchSpec:
    query: str = key(check.string, "What to search for.", required=True)
    source: str = key(check.string, "The source to search (a name under pipeline.sources, or added with "
                      "`supervisor sources add`).", required=True)
    name: str | None = None
    target_price_cents: int | None = key(Check("price", _price), "A listing at or under this price is a deal "
                                         "(excludes deal_threshold).", None, name="target_price")
    deal_threshold: float | None = key(Check("number 0-1", _threshold), "A listing this fraction under its "
                                       "baseline is a deal (excludes target_price).", None,
                                       shown="scoring.deal_threshold")
    webhook_url: str | None = key(_text("http(s) URL", check_webhook), "Where its alerts are posted (Discord or "
                                  "JSON).", None, name="webhook", shown="none")
    poll_interval_seconds: int = key(Check("duration >= 1s", _every, shows=check.duration(1).shows, text=str),
                                     "How often it is polled.", 3600, name="every")
    enabled: bool = key(check.boolean, "Poll it.", True)
    re_alerts: bool | None = key(check.boolean, "A listing may alert again.", None,
                                 shown="alerts.re_alerts_enabled")

    def __post_init__(self) -> None:
        if not self.query.strip():
            raise CatalogError("--query must not be empty")
        if self.target_price_cents is not None and self.deal_threshold is not None:
            raise CatalogError("--target-price and --deal-threshold exclude each other: give one")


def _dicts(cursor) -> list[dict[str, Any]]:
    names = [c.name for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _public_watch(row: dict[str, Any]) -> dict[str, Any]:
    """A watch for output: the webhook URL is a secret, only its redacted form shows."""
    out = dict(row)
    if out.get("webhook_url"):
        out["webhook_url"] = _redact(out["webhook_url"])
    cents = out.pop("target_price_cents", None)
    out["target_price"] = None if cents is None else f"{cents / 100:.2f}"
    return out


def source_names(conn) -> list[str]:
    return [r[0] for r in conn.execute(source_sql.NAMES)]


def source_id(conn, name: str) -> int:
    row = conn.execute(source_sql.BY_NAME, {"name": name}).fetchone()
    if row is None:
        known = ", ".join(source_names(conn)) or "none yet; add one with `supervisor sources add`"
        raise CatalogError(f"unknown source {name!r} (known: {known})")
    return int(row[0])


def list_sources(conn) -> list[dict[str, Any]]:
    return _dicts(conn.execute(source_sql.LIST))


def get_source(conn, name: str) -> dict[str, Any]:
    source_id(conn, name)
    return _dicts(conn.execute(source_sql.BY_NAME, {"name": name}))[0]


def add_source(conn, spec: SourceSpec) -> int:
    if conn.execute(source_sql.BY_NAME, {"name": spec.name}).fetchone():
        raise CatalogError(f"source {spec.name!r} exists already (see `supervisor sources show {spec.name}`)")
    return int(conn.execute(source_sql.UPSERT, asdict(spec)).fetchone()[0])


def set_source_enabled(conn, name: str, enabled: bool) -> None:
    source_id(conn, name)
    conn.execute(source_sql.SET_ENABLED, {"name": name, "enabled": enabled})


def remove_source(conn, name: str, force: bool = False) -> None:
    source = get_source(conn, name)
    if source["watches"] and not force:
        raise CatalogError(f"source {name!r} has {source['watches']} watch(es); remove them first or pass --force")
    conn.execute(source_sql.DELETE, {"name": name})


def list_watches(conn, source: str | None = None) -> list[dict[str, Any]]:
    if source is not None:
        source_id(conn, source)
    return [_public_watch(r) for r in _dicts(conn.execute(watch_sql.WATCHES, {"source": source}))]


def watch_id(conn, ref: str) -> int:
    """A watch by id, or by name."""
    if ref.isdigit():
        if conn.execute(watch_sql.WATCH, {"id": int(ref)}).fetchone():
            return int(ref)
    else:
        row = conn.execute(watch_sql.WATCH_ID_BY_NAME, {"name": ref}).fetchone()
        if row:
            return int(row[0])
    raise CatalogError(f"unknown watch {ref!r} (see `supervisor watches list`)")


def get_watch(conn, ref: str) -> dict[str, Any]:
    return _public_watch(_dicts(conn.execute(watch_sql.WATCH, {"id": watch_id(conn, ref)}))[0])


def _watch_values(conn, spec: WatchSpec) -> dict[str, Any]:
    values = asdict(spec)
    values["source_id"] = source_id(conn, values.pop("source"))
    values["webhook_format"] = "auto"
    return values


def add_watch(conn, spec: WatchSpec) -> int:
    if spec.name is not None and conn.execute(watch_sql.WATCH_ID_BY_NAME, {"name": spec.name}).fetchone():
        raise CatalogError(f"watch {spec.name!r} exists already (see `supervisor watches show {spec.name}`)")
    return int(conn.execute(watch_sql.INSERT_WATCH, _watch_values(conn, spec)).fetchone()[0])


def set_watch_enabled(conn, ref: str, enabled: bool) -> int:
    wid = watch_id(conn, ref)
    conn.execute(watch_sql.SET_WATCH_ENABLED, {"id": wid, "enabled": enabled})
    return wid


def set_watch_re_alerts(conn, ref: str, re_alerts: bool | None) -> int:
    wid = watch_id(conn, ref)
    conn.execute(watch_sql.SET_WATCH_RE_ALERTS, {"id": wid, "re_alerts": re_alerts})
    return wid


def remove_watch(conn, ref: str) -> int:
    wid = watch_id(conn, ref)
    conn.execute(watch_sql.DELETE_WATCH, {"id": wid})
    return wid


# --- the config's declared entries -----------------------------------------------------


def given(**values: Any) -> dict[str, Any]:
    """Only the values that were given (None: use the spec's default)."""
    return {k: v for k, v in values.items() if v is not None}


def declared_sources(section: Mapping[str, Any]) -> list[SourceSpec]:
    # Entries as the config read them (checked): a key not given leaves the spec's default.
    return [SourceSpec(name=name, **to_fields(SourceSpec, entry))
            for name, entry in (section.get("sources") or {}).items()]


def declared_watches(section: Mapping[str, Any]) -> list[WatchSpec]:
    return [WatchSpec(name=name, **to_fields(WatchSpec, entry))
            for name, entry in (section.get("watches") or {}).items()]


@dataclass
class SyncReport:
    created: list[str]
    updated: list[str]
    removed: list[str]
    errors: list[str]

    def line(self) -> str:
        parts = [f"{k} {', '.join(v)}" for k, v in
                 (("created", self.created), ("updated", self.updated), ("removed", self.removed)) if v]
        return "; ".join(parts) or "nothing to change"


SYNC_LOCK = "SELECT pg_advisory_xact_lock(hashtext('actors.catalog.sync'))"


def sync(conn, section: Mapping[str, Any], *, prune: bool = False) -> SyncReport:
    """Apply the declared sources and watches by name, and the settings system_state
    reads, in one transaction (one process at a time: every worker of a fleet calls
    this at boot)."""
    report = SyncReport([], [], [], [])
    sources, watches = declared_sources(section), declared_watches(section)
    with conn.transaction():
        conn.execute(SYNC_LOCK)
        for spec in sources:
            row = conn.execute(source_sql.UPSERT, asdict(spec)).fetchone()
            if row is not None:
                (report.created if row[1] else report.updated).append(f"source {spec.name}")
        for w in watches:
            try:
                values = _watch_values(conn, w)
            except CatalogError as exc:
                report.errors.append(f"pipeline.watches.{w.name}: {exc}")
                continue
            if conn.execute(watch_sql.WATCH_ID_BY_NAME, {"name": w.name}).fetchone() is None:
                conn.execute(watch_sql.INSERT_WATCH, values)
                report.created.append(f"watch {w.name}")
            elif conn.execute(watch_sql.UPDATE_WATCH_BY_NAME, values).fetchone() is not None:
                report.updated.append(f"watch {w.name}")
        # What system_state judges by (warm baselines), the same as the extraction does.
        min_samples = (section.get("scoring") or {}).get("min_samples") or ScoringSettings.min_samples
        if conn.execute(state_sql.SYNC_SETTINGS, {"min_samples": int(min_samples)}).fetchone() is not None:
            report.updated.append(f"setting scoring.min_samples = {int(min_samples)}")
        if prune:
            names = [w.name for w in watches]
            report.removed += [f"watch {r[0]}" for r in conn.execute(watch_sql.DELETE_UNDECLARED_WATCHES,
                                                                      {"names": names})]
            report.removed += [f"source {r[0]}" for r in conn.execute(source_sql.DELETE_UNDECLARED,
                                                                       {"names": [s.name for s in sources]})]
    return report
