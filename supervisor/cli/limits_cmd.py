"""`supervisor limits`: every limit key as the claim sees it (`list`, the default), and an
operator's override of one key's limits at runtime (`set`, `clear`), written to the audit
log as the HTTP API's changes are."""

from __future__ import annotations

from typing import Any

import click

from .. import audit, exit_codes, limits
from ..identity import operator
from .context import config_option, connect, die, json_option
from .output import print_json, rows

COLUMNS = ["key", "queues", "waiting", "wait_s", "running", "concurrency", "tokens", "burst", "rate",
           "quota_used", "quota", "blocked_until", "gate", "override"]


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    """A key as the table shows it: short numbers, the gate and the override in a word each."""
    gate = row["gated_by"] or "open"
    if row["gated_by"] and row["opens_in_s"] is not None:
        gate += f" {row['opens_in_s']:.1f}s"
    override = limits.override_text(row["override"])
    return {**row, "queues": ",".join(row["queues"]) or None, "gate": gate, "override": override or None,
            "waiting": f"{row['waiting']}+" if row["waiting_more"] else row["waiting"],
            "rate": None if row["rate"] is None else limits.rate_text(row["rate"]),
            **{k: None if row[k] is None else round(row[k], 3) for k in ("wait_s", "tokens")}}


def _audit(conn: Any, action: str, key: str, detail: dict[str, Any], outcome: str | None = None) -> None:
    audit.record(conn, audit.Entry(action=action, target=f"limit {key}", detail=detail, status=200,
                                   outcome=outcome, client=operator()))


@click.group("limits", invoke_without_command=True)
@config_option
@click.option("--after", default="", metavar="KEY", help="Keys after KEY (the last one of the previous page).")
@json_option
@click.pass_context
def limits_group(ctx: click.Context, after: str, as_json: bool) -> None:
    """Every limit key jobs wait on or run under (and every bucket), as the next claim sees
    it: waiting jobs (counted up to 1,000 a queue), how long the oldest due one has waited,
    running against the concurrency limit, tokens and burst, rate (per second), the daily
    quota used, a block, the gate (what stops the key now, and when it opens), the
    operator's override. The first 500 keys by name; --after pages on.

    `limits set KEY ...` overrides a key's limits on every host from the next claim;
    `limits clear KEY` drops the override."""
    if ctx.invoked_subcommand is None:
        _list(ctx, after, as_json)


def _list(ctx: click.Context, after: str, as_json: bool) -> None:
    with connect(ctx) as conn:
        seen = limits.seen(conn, after=after)
    if as_json:
        print_json({"keys": [limits.as_json(k) for k in seen.keys], "next_after": seen.next_after})
        return
    rows([_listed(k) for k in seen.keys], False, COLUMNS)
    if seen.next_after:
        click.echo(f"(more: --after {seen.next_after})")


@limits_group.command("list")
@config_option
@click.option("--after", default="", metavar="KEY", help="Keys after KEY (the last one of the previous page).")
@json_option
@click.pass_context
def list_cmd(ctx: click.Context, after: str, as_json: bool) -> None:
    """Every limit key as the next claim sees it (as `supervisor limits`)."""
    _list(ctx, after, as_json)


@limits_group.command("set")
@config_option
@click.argument("key")
@click.option("--rate", default=None, help="Rate as an actor's rate_limit: 10/s, 30/m, 2/h, 5/d, '20/s burst 5'; "
                                           "none lifts it.")
@click.option("--burst", default=None, help="Tokens at most in the bucket (a whole number >= 1).")
@click.option("--daily-quota", default=None, help="Starts per UTC day (a whole number >= 0; none lifts it).")
@click.option("--concurrency", default=None, help="Jobs of the key running at once (>= 1; none lifts it).")
@json_option
@click.pass_context
def set_cmd(ctx: click.Context, key: str, rate: str | None, burst: str | None, daily_quota: str | None,
            concurrency: str | None, as_json: bool) -> None:
    """Override KEY's limits on every process and host, from the next claim, without a
    reload. A limit not given keeps the jobs' own; the override replaces the key's last."""
    given = {name: value for name, value in (("rate", rate), ("burst", burst), ("daily_quota", daily_quota),
                                             ("concurrency", concurrency)) if value is not None}
    try:
        override = limits.parse(given)
        limits.check_key(key)
    except limits.LimitValueError as exc:
        die(f"limits set {key}: {exc}", exit_codes.USAGE)
    with connect(ctx) as conn:
        row = limits.set_override(conn, key, override, operator())
        _audit(conn, "limits.set", key, {"override": row["override"], "previous": row["previous"]})
    if as_json:
        print_json(limits.as_json(row))
    else:
        click.echo(f"{key}: override set ({limits.override_text(row['override'])}); applies from the next claim")




@limits_group.command("clear")
@config_option
@click.argument("key")
@json_option
@click.pass_context
def clear_cmd(ctx: click.Context, key: str, as_json: bool) -> None:
    """Drop KEY's override: its jobs' own limits apply again from the next claim."""
    try:
        limits.check_key(key)
    except limits.LimitValueError as exc:
        die(f"limits clear: {exc}", exit_codes.USAGE)
    with connect(ctx) as conn:
        previous = limits.clear_override(conn, key, operator())
        _audit(conn, "limits.clear", key, {"previous": previous}, None if previous else "it had no override")
    if as_json:
        print_json({"key": key, "cleared": previous is not None, "previous": previous})
    else:
        click.echo(f"{key}: override cleared ({limits.override_text(previous)})" if previous is not None
                   else f"{key} had no override")
