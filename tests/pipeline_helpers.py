"""Shared helpers for the pipeline tests: a broker with the bundled actors, an
in-process worker, a real worker process with a ``pipeline:`` config, seed data,
and the rate-limiter hammer. Also runnable: ``python -m tests.pipeline_helpers``
starts one worker process from the JSON in $PIPELINE_WORKER (used by PipelineWorker).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from actors.queries import pipeline as pipeline_sql
from actors.queries import sources as sources_sql
from supervisor import db, runtime
from supervisor.broker import PostgresBroker
from tests.conftest import WorkerProc, in_process_worker, stacks, wait_for

ROOT = Path(__file__).resolve().parent.parent
QUEUES = ("scraping", "extraction", "notification", "forecasting")
ACTOR_MODULES = ("actors.scraping", "actors.extraction", "actors.notification", "actors.forecasting")


# --- fixtures (import them into a test module under these names) ------------------


@pytest.fixture(scope="session", name="pipeline_broker")
def pipeline_broker_fixture(database_url: str) -> Iterator[PostgresBroker]:
    """A broker with the bundled actors declared on it (they bind at import)."""
    broker = PostgresBroker(database_url, lease_seconds=30, poll_interval=0.1, pool_size=16)
    dramatiq.set_broker(broker)
    import importlib

    # Dependency order, so a reloaded module picks up reloaded actors it chains to.
    for name in ("actors.notification", "actors.extraction", "actors.scraping", "actors.forecasting"):
        module = importlib.import_module(name)
        declared = [v for v in vars(module).values() if isinstance(v, dramatiq.Actor)]
        if any(a.broker is not broker for a in declared if a.fn.__module__ == name):
            importlib.reload(module)  # imported earlier under another broker
    for queue in QUEUES:
        broker.declare_queue(queue)
    yield broker
    broker.close()


class LivePipeline(dict):
    """A ``pipeline:`` mapping that the actors see as soon as a key is set."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        runtime.configure(app_settings={"pipeline": self})


@pytest.fixture(name="pipeline_config")
def pipeline_config_fixture() -> Iterator[LivePipeline]:
    """The ``pipeline:`` mapping the actors see; tests fill it in, it is reset after."""
    config = LivePipeline()
    runtime.configure(app_settings={"pipeline": config})
    yield config
    runtime.configure(app_settings={})


@pytest.fixture(autouse=True)
def _actor_pool_given_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run a pipeline test on the pipeline broker, and fail it if it leaves
    actor-pool connections checked out: otherwise a later test of the same process
    waits out the pool's timeout and fails with PoolTimeout, far from the cause."""
    if "pipeline_broker" not in request.fixturenames:
        yield
        return
    broker: PostgresBroker = request.getfixturevalue("pipeline_broker")
    # Actor code finds its broker and pool through the global broker at call time,
    # and a session broker of another module (test_broker's) may have taken that
    # place since the pipeline broker was made.
    previous = dramatiq.broker.global_broker
    dramatiq.set_broker(broker)
    pool = broker.actor_pool

    def checked_out() -> int:
        stats = pool.get_stats()
        return stats["pool_size"] - stats["pool_available"] + stats["requests_waiting"]

    before = checked_out()  # not 0 only after a test that failed this check: blame that one alone
    yield
    dramatiq.broker.global_broker = previous
    # A connection is given back after the block that used it ends, and a new one
    # counts as checked out while it connects: give both a moment.
    try:
        wait_for(lambda: checked_out() <= before, timeout=5, interval=0.05)
    except AssertionError:
        pytest.fail(f"{request.node.nodeid} left {checked_out() - before} actor-pool connections checked out"
                    f" ({pool.get_stats()}); threads now:\n{stacks(threading.enumerate())}", pytrace=False)


def set_pipeline(config: dict) -> None:
    runtime.configure(app_settings={"pipeline": config})


def running_worker(broker: PostgresBroker, queues=QUEUES, threads: int = 4
                   ) -> contextlib.AbstractContextManager[dramatiq.Worker]:
    """An in-process Dramatiq worker on the pipeline's queues."""
    return in_process_worker(broker, queues, threads=threads)


class PipelineWorker(WorkerProc):
    """A real worker process (supervisor.worker.process.run) with a pipeline config."""

    def __init__(self, url: str, *, queues=QUEUES, actors=ACTOR_MODULES, threads: int = 4, lease: float = 30.0,
                 heartbeat: float = 2.0, pipeline: dict | None = None, schedules: list[dict] | None = None):
        spec = {"queues": list(queues), "actors": list(actors), "threads": threads, "lease": lease,
                "heartbeat": heartbeat, "pipeline": pipeline or {}, "schedules": schedules or []}
        super().__init__(url, extra_env={"PIPELINE_WORKER": json.dumps(spec)},
                         argv=[sys.executable, "-m", "tests.pipeline_helpers"])


def _main() -> int:
    from supervisor.config import RoleConfig, ScheduleConfig
    from supervisor.logs import configure_logging
    from supervisor.worker.process import run
    from supervisor.worker.settings import WorkerSettings

    spec = json.loads(os.environ["PIPELINE_WORKER"])
    configure_logging(os.environ.get("PIPELINE_LOG_LEVEL", "WARNING"))
    role = RoleConfig(name="pipeline-test", queues=tuple(spec["queues"]), actors=tuple(spec["actors"]),
                      threads=spec["threads"], lease=spec["lease"], heartbeat=spec["heartbeat"],
                      shutdown_timeout=10.0, poll_interval=0.2)
    settings = WorkerSettings(role=role, app_settings={"pipeline": spec["pipeline"]},
                              schedules=tuple(ScheduleConfig(**s) for s in spec["schedules"]))
    return run(settings, db.resolve(os.environ["DATABASE_URL"], pooled=False))


# --- seed data ------------------------------------------------------------------------


def make_source(conn, name: str = "shop", search_url: str = "http://127.0.0.1:9/search?q={query}", *,
                fmt: str = "auto", per_minute: float = 6000, burst: int = 50, daily_quota: int | None = None) -> int:
    return conn.execute(sources_sql.INSERT, {
        "name": name, "search_url": search_url, "format": fmt, "rate_limit_per_minute": per_minute,
        "burst": burst, "daily_quota": daily_quota,
    }).fetchone()[0]


def make_watch(conn, source_id: int, query: str, *, target_price_cents: int | None = None,
               deal_threshold: float | None = None, webhook_url: str | None = None, webhook_format: str = "auto",
               enabled: bool = True, poll_interval_seconds: int = 3600, name: str | None = None,
               re_alerts: bool | None = None) -> int:
    return conn.execute(pipeline_sql.INSERT_WATCH, {
        "name": name, "query": query, "source_id": source_id, "target_price_cents": target_price_cents,
        "deal_threshold": deal_threshold, "webhook_url": webhook_url, "webhook_format": webhook_format,
        "enabled": enabled, "poll_interval_seconds": poll_interval_seconds, "re_alerts": re_alerts,
    }).fetchone()[0]


def seed_baseline(conn, product_key: str, median_cents: float, samples: int = 20) -> None:
    conn.execute(pipeline_sql.UPSERT_BASELINE, {
        "product_key": product_key, "median": median_cents, "p25": median_cents * 0.9,
        "p75": median_cents * 1.1, "mean": median_cents, "samples": samples, "days": 30,
    })


def make_alert(conn, watch_id: int, source_id: int, *, title: str = "Corsair 32GB DDR4 3200",
               price_cents: int = 6000, external_id: str = "a1") -> int:
    """A listing and a pending alert for it, as extraction would leave them."""
    listing_id = conn.execute(
        "INSERT INTO listings (source_id, external_id, url, title, price_cents) VALUES (%s, %s, %s, %s, %s)"
        " RETURNING id", (source_id, external_id, f"http://shop.example/item/{external_id}", title, price_cents),
    ).fetchone()[0]
    return conn.execute(
        "INSERT INTO alerts (watch_id, listing_id, price_cents, reason) VALUES (%s, %s, %s, 'test deal')"
        " RETURNING id", (watch_id, listing_id, price_cents),
    ).fetchone()[0]


def job_states(conn, actor: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT status FROM jobs WHERE actor = %s ORDER BY created_at", (actor,))]


def settled(conn, queues=QUEUES) -> bool:
    """No live job left in these queues (delayed ones and those waiting on a limit included)."""
    return conn.execute(
        "SELECT count(*) = 0 FROM jobs WHERE queue = ANY(%s) AND status IN ('pending', 'retryable', 'running',"
        " 'waiting')",
        (list(queues),),
    ).fetchone()[0]


# --- the rate-limiter hammer ----------------------------------------------------------


def hammer(url: str, key: str, per_minute: float, burst: int, quota: int | None, seconds: float,
           barrier, out) -> None:
    """Take from one limiter key as fast as allowed for ``seconds`` after every
    caller is ready; report the wall time of every grant. Runs in a spawned process."""
    import psycopg

    from supervisor import ratelimit

    limit = ratelimit.Limit(per_minute=per_minute, burst=burst, daily_quota=quota)
    grants: list[float] = []
    refusals = 0
    with psycopg.connect(url, autocommit=True) as conn:
        barrier.wait(60)
        until = time.time() + seconds
        while (now := time.time()) < until:
            decision = ratelimit.take(conn, key, limit)
            if decision.granted:
                grants.append(time.time())
            else:
                refusals += 1
                time.sleep(max(0.0, min(decision.wait_seconds, until - now)))
    out.put((grants, refusals))


@pytest.fixture(name="threaded_server")
def threaded_server_fixture() -> Iterator[Any]:
    """A local HTTP server that handles requests concurrently (slow handlers do
    not hold up the others)."""
    from pytest_httpserver import HTTPServer

    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()


if __name__ == "__main__":
    sys.exit(_main())
