"""`supervisor errors`: failed attempts of a recent window, grouped (as the Errors page)."""

from __future__ import annotations

import click

from .. import error_groups, exit_codes
from .context import config_option, connect, die, json_option
from .output import print_json, table

COLUMNS = ["attempts", "retried", "failed", "actor", "error_type", "where", "first_seen", "last_seen", "message"]
MESSAGE_WIDTH = 120


@click.command()
@config_option
@click.option("--since", default=error_groups.DEFAULT_WINDOW, show_default=True,
              help="The window: a duration up to 30d (1h, 24h, 7d, 90m).")
@click.option("--actor", default=None, help="Only this actor's.")
@click.option("--limit", default=error_groups.DEFAULT_GROUPS, show_default=True,
              type=click.IntRange(1, error_groups.MAX_GROUPS), help="Groups shown, most attempts first.")
@json_option
@click.pass_context
def errors(ctx: click.Context, since: str, actor: str | None, limit: int, as_json: bool) -> None:
    """Failed attempts of the last SINCE (retried, or failed for good), grouped by actor,
    exception type and where: the innermost frame of the actor's own code (file:function).
    Per group: attempts, retried, failed, first seen (the earliest kept), last seen and a
    sample's exception line; --json adds attempts per bucket and the sample's traceback."""
    try:
        window_s = error_groups.parse_window(since)
    except ValueError as exc:
        die(str(exc), exit_codes.USAGE)
    with connect(ctx) as conn:
        found = error_groups.error_groups(conn, window_s=window_s, actor=actor, limit=limit)
    if as_json:
        print_json(found)
        return
    at_least = "" if found["complete"] else "at least "
    click.echo(f"{at_least}{found['attempts']} failed attempt(s) since {found['since']:%Y-%m-%d %H:%M:%S}"
               f" in {found['groups_total']} group(s)")
    if not found["complete"]:
        click.echo(f"(counted from the newest {error_groups.SCAN_CAP}, since {found['covered_since']:%Y-%m-%d %H:%M:%S})")
    table([{**g, "where": g["where"] or None,
            "message": (g["sample"]["message"] or g["sample"]["reason"] or "")[:MESSAGE_WIDTH] or None}
           for g in found["groups"]], COLUMNS)
