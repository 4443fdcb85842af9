"""The price tracker's `supervisor` commands, added through the apps entry point:
`sources`, `watches`, `alerts` and `tracker` (the demo is in actors/demo.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import click
import psycopg
from dramatiq.message import Message

from supervisor import exit_codes, runtime
from supervisor.cli.context import (
    config_given,
    config_option,
    connect,
    die,
    json_option,
    load_config,
    producer,
    url,
)
from supervisor.cli.output import fmt, print_json, rows
from supervisor.migrate import migrate

from . import catalog, tracker
from .queries import pipeline as pipeline_sql
from .settings import SECTION


@contextlib.contextmanager
def tracker_db(ctx: click.Context) -> Iterator[psycopg.Connection]:
    """A connection to a database with the tracker's tables (migrated on first use);
    a bad input or a missing row ends the command with one line."""
    from .app import APP

    try:
        migrate(url(ctx), [APP])
    except Exception as exc:
        die(f"cannot prepare the database: {exc}", exit_codes.DATABASE)
    with connect(ctx) as conn:
        try:
            yield conn
        except catalog.CatalogError as exc:
            die(str(exc), exit_codes.USAGE)
        except psycopg.Error as exc:
            die(f"database: {str(exc).strip().splitlines()[0]}", exit_codes.DATABASE)


def _print(data: Any, as_json: bool) -> None:
    if as_json:
        print_json(data)
    elif isinstance(data, dict):
        width = max(map(len, data), default=0)
        for key, value in data.items():
            click.echo(f"{key.ljust(width)}  {fmt(value)}")
    else:
        click.echo(data)


def _done(as_json: bool, data: dict[str, Any], text: str) -> None:
    if as_json:
        print_json(data)
    else:
        click.echo(text)


def _ref_command(argument: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a command on one source or watch: -c, REF, --json, the context."""
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        return config_option(click.argument("ref", metavar=argument)(json_option(click.pass_context(f))))

    return apply


def _show(kind: str, argument: str, get: Callable[[psycopg.Connection, str], dict[str, Any]]) -> click.Command:
    @_ref_command(argument)
    def command(ctx, ref, as_json) -> None:
        with tracker_db(ctx) as conn:
            _print(get(conn, ref), as_json)

    command.__doc__ = f"One {kind} ({argument}: {'id or name' if kind == 'watch' else 'its name'}), every column."
    return click.command("show")(command)


def _toggle(kind: str, argument: str, change: Callable[[psycopg.Connection, str, bool], Any],
            enabled: bool) -> click.Command:
    verb = "enable" if enabled else "disable"

    @_ref_command(argument)
    def command(ctx, ref, as_json) -> None:
        with tracker_db(ctx) as conn:
            change(conn, ref, enabled)
            _done(as_json, {kind: ref, "enabled": enabled}, f"{kind} {ref} {verb}d")

    command.__doc__ = f"{verb.capitalize()} {kind} {argument} ({'resume' if enabled else 'pause'} its polling)."
    return click.command(verb)(command)


def _remove(kind: str, argument: str, remove: Callable[[psycopg.Connection, str, bool], Any], doc: str,
            force_help: str | None = None) -> click.Command:
    def command(ctx, ref, as_json, force: bool = False) -> None:
        with tracker_db(ctx) as conn:
            remove(conn, ref, force)
            _done(as_json, {kind: ref, "removed": True}, f"{kind} {ref} removed")

    command.__doc__ = doc
    if force_help:
        command = click.option("--force", is_flag=True, help=force_help)(command)
    for decorate in (json_option, click.argument("ref", metavar=argument), config_option):
        command = decorate(command)
    return click.command("remove")(click.pass_context(command))


def _plain_read(f: Callable[..., Any]) -> Callable[..., Any]:
    """-c/--config, --json and the click context: a read command with no other option."""
    return config_option(json_option(click.pass_context(f)))


# --- sources -------------------------------------------------------------------------


@click.group()
def sources() -> None:
    """Where watches search: a URL template with {query}, politeness limits, health."""


@sources.command("add")
@config_option
@click.argument("name")
@click.option("--search-url", required=True, metavar="TEMPLATE",
              help="Search URL with {query} where the URL-encoded query goes.")
@click.option("--format", "fmt", type=click.Choice(catalog.FORMATS), default=catalog.SourceSpec.format,
              show_default=True)
@click.option("--rate-per-minute", type=float, default=None,
              help="Requests per minute to this source, across every process and host (default: 60).")
@click.option("--burst", type=int, default=None, help="Requests allowed at once (default: 1).")
@click.option("--daily-quota", type=int, default=None, help="At most this many requests a day (default: none).")
@json_option
@click.pass_context
def sources_add(ctx, name, search_url, fmt, rate_per_minute, burst, daily_quota, as_json) -> None:
    """Add a source NAME."""
    with tracker_db(ctx) as conn:
        spec = catalog.SourceSpec(
            name=catalog.checked("NAME", "name", name),
            search_url=catalog.checked("--search-url", "search_url", search_url), format=fmt,
            **catalog.given(
                rate_limit_per_minute=catalog.checked("--rate-per-minute", "rate_per_minute", rate_per_minute),
                burst=catalog.checked("--burst", "burst", burst),
                daily_quota=catalog.checked("--daily-quota", "daily_quota", daily_quota)))
        sid = catalog.add_source(conn, spec)
        _done(as_json, {"id": sid, "name": name}, f"source {name} added (id {sid})")


@sources.command("list")
@_plain_read
def sources_list(ctx, as_json) -> None:
    """Sources with their health: failure streak, paused until, last success and failure, last error."""
    with tracker_db(ctx) as conn:
        rows(catalog.list_sources(conn), as_json,
             ["name", "enabled", "watches", "failure_streak", "paused_until", "last_success_at", "last_failure_at",
              "last_error"])


sources.add_command(_show("source", "NAME", catalog.get_source))
sources.add_command(_toggle("source", "NAME", catalog.set_source_enabled, True))
sources.add_command(_toggle("source", "NAME", catalog.set_source_enabled, False))


sources.add_command(_remove("source", "NAME", catalog.remove_source,
                           "Remove source NAME (refused while it has watches, unless --force).",
                           force_help="Also remove the source's watches, listings and alerts."))


# --- watches -------------------------------------------------------------------------


watches = click.Group("watches", help="What to look for: a query on a source, a deal rule, a webhook.")


@watches.command("add")
@config_option
@click.option("--source", required=True, help="The source's name.")
@click.option("--query", required=True, help="What to search for.")
@click.option("--name", default=None, help="A name (declared watches are synced by name).")
@click.option("--target-price", default=None, metavar="PRICE", help="A deal is at or under this price (12.50).")
@click.option("--deal-threshold", type=float, default=None, metavar="FRACTION",
              help="A deal is this fraction under the typical price (0.2); default pipeline.scoring.")
@click.option("--webhook", default=None, metavar="URL", help="Where alerts are posted (Discord or JSON).")
@click.option("--every", default=None, help="How often to poll (30m, 1h, ...; default: 1h).")
@click.option("--re-alerts/--no-re-alerts", "re_alerts", default=None,
              help="Alert again for a listing notified before, after the cooldown (default: "
                   "pipeline.alerts.re_alerts_enabled).")
@json_option
@click.pass_context
def watches_add(ctx, source, query, name, target_price, deal_threshold, webhook, every, re_alerts,
                as_json) -> None:
    """Add a watch."""
    with tracker_db(ctx) as conn:
        spec = catalog.WatchSpec(
            query=query, source=source, name=catalog.checked("--name", "name", name),
            target_price_cents=catalog.checked("--target-price", "target_price", target_price),
            deal_threshold=catalog.checked("--deal-threshold", "deal_threshold", deal_threshold),
            webhook_url=catalog.checked("--webhook", "webhook", webhook), re_alerts=re_alerts,
            **catalog.given(poll_interval_seconds=catalog.checked("--every", "every", every)))
        wid = catalog.add_watch(conn, spec)
        _done(as_json, {"id": wid, "query": query, "source": source}, f"watch {wid} added: {query!r} on {source}")


@watches.command("list")
@config_option
@click.option("--source", default=None, help="Only this source's watches.")
@json_option
@click.pass_context
def watches_list(ctx, source, as_json) -> None:
    """Watches: last polled ("never" until the first poll, whatever its outcome), when next
    due (a failing watch backs off: its interval, doubling per failed poll up to a day),
    the last poll's error, and pending alerts."""
    with tracker_db(ctx) as conn:
        data = catalog.list_watches(conn, source)
        if not as_json:
            data = [{**w, "last_polled_at": w["last_polled_at"] or "never", "next_poll_at": w["next_poll_at"] or "now",
                     "last_error": w["last_error"] or ""} for w in data]
        rows(data, as_json, ["id", "name", "query", "source", "enabled", "every_seconds", "last_polled_at",
                             "next_poll_at", "pending_alerts", "last_error"])


@watches.command("set")
@click.option("--re-alerts/--no-re-alerts", "re_alerts", default=None,
              help="Alert again for a listing notified before, after the cooldown (on), or only once "
                   "the pending alert is notified (off).")
@click.option("--re-alerts-default", "follow_config", is_flag=True,
              help="Follow pipeline.alerts.re_alerts_enabled again.")
@_ref_command("WATCH")
def watches_set(ctx, ref, as_json, re_alerts, follow_config) -> None:
    """Change a watch's alerting (WATCH: id or name)."""
    if (re_alerts is None) == (not follow_config):
        die("give one of --re-alerts, --no-re-alerts or --re-alerts-default", exit_codes.USAGE)
    with tracker_db(ctx) as conn:
        wid = catalog.set_watch_re_alerts(conn, ref, None if follow_config else re_alerts)
        shown = "the config's default" if follow_config else ("on" if re_alerts else "off")
        _done(as_json, {"watch": wid, "re_alerts": None if follow_config else re_alerts},
              f"watch {ref}: re-alerts {shown}")


watches.add_command(_show("watch", "WATCH", catalog.get_watch))
watches.add_command(_toggle("watch", "WATCH", catalog.set_watch_enabled, True))
watches.add_command(_toggle("watch", "WATCH", catalog.set_watch_enabled, False))


watches.add_command(_remove("watch", "WATCH", lambda conn, ref, force: catalog.remove_watch(conn, ref),
                           "Remove WATCH (by id or name) with its price points and alerts."))


# --- alerts --------------------------------------------------------------------------


alerts = click.Group("alerts", help="Price alerts and their delivery.")


@alerts.command("list")
@config_option
@click.option("--watch", default=None, help="Only this watch's alerts (id or name).")
@click.option("--pending", is_flag=True, help="Only alerts not yet delivered.")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@click.pass_context
def alerts_list(ctx, watch, pending, limit, as_json) -> None:
    """Alerts, newest first, with their delivery state from the webhook ledger."""
    with tracker_db(ctx) as conn:
        wid = catalog.watch_id(conn, watch) if watch else None
        cursor = conn.execute(pipeline_sql.ALERTS, {"watch_id": wid, "pending": pending, "limit": max(1, limit)})
        names = [c.name for c in cursor.description or ()]
        data = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
        rows(data, as_json, ["id", "watch_id", "title", "price_cents", "delivery", "attempts", "created_at"])


@alerts.command("resend")
@config_option
@click.argument("alert_id", type=int)
@json_option
@click.pass_context
def alerts_resend(ctx: click.Context, alert_id: int, as_json: bool) -> None:
    """Deliver ALERT_ID again even if an earlier attempt's outcome is unknown
    (at-least-once: the receiver may see it twice; the Idempotency-Key is reused)."""
    message: Message[Any] = Message(queue_name="notification", actor_name="deliver_alert", args=(alert_id,),
                      kwargs={"resend_unknown": True}, options={})
    with producer(ctx) as broker:
        sent = broker.enqueue(message)
    if as_json:
        print_json({"id": sent.message_id, "alert_id": alert_id})
    else:
        click.echo(sent.message_id)


# --- tracker -------------------------------------------------------------------------


@click.group("tracker")
def tracker_group() -> None:
    """The tracker as a whole: its state, re-extraction, config sync."""


@tracker_group.command("state")
@_plain_read
def tracker_state(ctx, as_json) -> None:
    """The system_state view: watches, listings, alerts, baselines, queue depth."""
    with tracker_db(ctx) as conn:
        _print(tracker.system_state(conn), as_json)


@tracker_group.command("reextract")
@config_option
@click.option("--watch", default=None, help="Only this watch's listings (id or name).")
@click.option("--all", "everything", is_flag=True, help="Every listing.")
@click.option("--incomplete", is_flag=True,
              help="Only listings whose extraction was incomplete (system_state's listings_incomplete_extraction).")
@click.option("--now", is_flag=True, help="Extract here and now, one listing at a time, instead of enqueueing.")
@json_option
@click.pass_context
def tracker_reextract(ctx, watch, everything, incomplete, now, as_json) -> None:
    """Extract listings again: enqueued at priority 1 (ahead of new listings), or here with --now."""
    if (bool(watch) and everything) or not (watch or everything or incomplete):
        die("give --watch ID or --all (either may take --incomplete), or --incomplete alone", exit_codes.USAGE)
    with tracker_db(ctx) as conn:
        wid = catalog.watch_id(conn, watch) if watch else None
    # Both paths read the pipeline settings: the model's limits (enqueued), the model (--now).
    runtime.configure(app_settings=load_config(ctx).app_settings if config_given(ctx) else {})
    with producer(ctx) as broker:
        if not now:
            count = tracker.reextract(broker, wid, incomplete)
            _done(as_json, {"enqueued": count, "watch_id": wid, "priority": tracker.REEXTRACT_PRIORITY},
                  f"{count} listing(s) enqueued for extraction at priority {tracker.REEXTRACT_PRIORITY}")
            return

        def progress(done: int, total: int) -> None:
            if not as_json and (done == total or done % 100 == 0):
                click.echo(f"extracted {done} of {total}", err=True)

        counts = tracker.reextract_now(broker, wid, incomplete, progress)
    _done(as_json, {**counts, "watch_id": wid},
          f"{counts['listings']} listing(s) extracted: {counts['deals']} deal(s), {counts['errors']} error(s)")
    if counts["errors"]:
        raise SystemExit(exit_codes.PROBLEM)


@tracker_group.command("sync")
@click.option("--prune", is_flag=True, help="Also remove sources and watches the config does not declare.")
@_plain_read
def tracker_sync(ctx, prune, as_json) -> None:
    """Apply the config's pipeline.sources and pipeline.watches now (workers do it at start and reload)."""
    section = load_config(ctx).app_settings.get(SECTION, {})
    with tracker_db(ctx) as conn:
        report = catalog.sync(conn, section, prune=prune)
    if report.errors:
        die("; ".join(report.errors), exit_codes.USAGE)
    _done(as_json, {"created": report.created, "updated": report.updated, "removed": report.removed},
          report.line())


def commands() -> list[click.Command]:
    from .demo import demo

    return [sources, watches, alerts, tracker_group, demo]
