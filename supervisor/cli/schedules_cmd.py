"""`supervisor schedules`: every schedule of the config, its zone and its next fire times.

It reads the config alone; the last fire of each comes from the database when it
answers (within a few seconds), and is left out, with a note on stderr, when not."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from .. import admin, db
from ..schedules import describe
from .context import config_option, json_option, load_config, resolved_url
from .output import print_json, table

CONNECT_TIMEOUT = 3  # seconds: the listing is shown from the config when the database is slower


def _last_fires(ctx: click.Context) -> dict[str, datetime | None] | None:
    """Each schedule's last fire (scheduler_locks), None when the database does not answer."""
    try:
        with db.connect(resolved_url(ctx), connect_timeout=CONNECT_TIMEOUT) as conn:
            locks, _ = admin.schedule_state(conn, runs=0)
    except Exception as exc:  # unreachable, not migrated, no embedded server: the config still tells the rest
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        click.echo(f"note: last fires not shown, the database did not answer: {db.redact(first)}", err=True)
        return None
    return {name: lock.get("fire_at") for name, lock in locks.items()}


@click.command()
@config_option
@json_option
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Every schedule in the config: cron, time zone, catch_up, last fire and its next
    3 fire times (ISO 8601, in the schedule's zone with its offset). Works from
    the config alone when the database is unreachable (last fire: -)."""
    cfg = load_config(ctx)
    last = _last_fires(ctx) if cfg.schedules else {}
    now = datetime.now(UTC)
    found: list[dict[str, Any]] = [describe(s, now, (last or {}).get(s.name)) for s in cfg.schedules]
    if as_json:
        print_json([{"name": s["name"], "cron": s["cron"], "timezone": s["timezone"], "catch_up": s["catch_up"],
                     "actor": s["actor"], "queue": s["queue"], "last_fire": s["last_fire_local"], "next": s["next"]}
                    for s in found])
        return
    table([{**s, "last_fire": s["last_fire_local"], "next": "  ".join(s["next"])} for s in found],
          ["name", "cron", "timezone", "catch_up", "last_fire", "next"])
