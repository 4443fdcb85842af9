"""The notification ledger, directly against PostgreSQL."""

from __future__ import annotations

import threading
import uuid

import pytest

from actors import ledger
from tests.conftest import scalar
from tests.pipeline_helpers import make_alert, make_source, make_watch

JOB1, JOB2 = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.fixture
def alert(conn) -> int:
    source_id = make_source(conn)
    watch_id = make_watch(conn, source_id, "q", webhook_url="http://127.0.0.1:9/hook")
    return make_alert(conn, watch_id, source_id)


def test_success_marks_the_alert_notified_and_blocks_resends(conn, alert):
    assert ledger.review(conn, alert, JOB1, 1) == ledger.Review(False, ())
    attempt = ledger.begin(conn, alert, JOB1, 1, "http://127.0.0.1:9/hook")
    assert scalar(conn, "SELECT status FROM notification_attempts WHERE id = %s", (attempt,)) == "in_flight"
    assert not scalar(conn, "SELECT notified FROM alerts WHERE id = %s", (alert,))
    ledger.finish(conn, attempt, "succeeded", http_status=204, duration_ms=12)
    assert conn.execute("SELECT notified, notified_at IS NOT NULL FROM alerts WHERE id = %s",
                        (alert,)).fetchone() == (True, True)
    assert conn.execute("SELECT status, http_status, duration_ms, finished_at IS NOT NULL FROM notification_attempts"
                        ).fetchone() == ("succeeded", 204, 12, True)
    assert ledger.review(conn, alert, JOB2, 1).delivered
    with pytest.raises(ledger.AlreadyDelivered):
        ledger.begin(conn, alert, JOB2, 1, "t")


def test_failures_are_recorded_and_leave_the_alert_pending(conn, alert):
    attempt = ledger.begin(conn, alert, JOB1, 1, "t")
    ledger.finish(conn, attempt, "failed", http_status=503, error="HTTP 503: busy", duration_ms=5)
    ledger.record_unsent(conn, alert, JOB1, 2, "t", "ConnectError: refused")
    assert conn.execute("SELECT status, http_status, error_text FROM notification_attempts ORDER BY id").fetchall() == [
        ("failed", 503, "HTTP 503: busy"), ("failed", None, "ConnectError: refused")]
    assert not scalar(conn, "SELECT notified FROM alerts")
    assert ledger.review(conn, alert, JOB1, 3) == ledger.Review(False, ())


def test_an_attempt_left_in_flight_by_a_dead_run_becomes_unknown(conn, alert):
    first = ledger.begin(conn, alert, JOB1, 1, "t")
    # The same run looking again does not orphan its own attempt...
    assert ledger.review(conn, alert, JOB1, 1).unknown == ()
    # ...but the next claim of the job (the first one died) does.
    assert ledger.review(conn, alert, JOB1, 2) == ledger.Review(False, (first,))
    assert scalar(conn, "SELECT status FROM notification_attempts WHERE id = %s", (first,)) == "unknown"
    # A late answer from the first run still lands: the real outcome replaces the guess.
    ledger.finish(conn, first, "succeeded", http_status=200)
    assert ledger.review(conn, alert, JOB1, 3).delivered


def test_one_attempt_in_flight_per_alert(conn, alert, database_url):
    import psycopg

    barrier = threading.Barrier(4)
    outcomes = []

    def race(n):
        with psycopg.connect(database_url, autocommit=True) as c:
            barrier.wait(10)
            try:
                outcomes.append(ledger.begin(c, alert, str(uuid.uuid4()), 1, "t"))
            except ledger.AttemptInFlight:
                outcomes.append("busy")

    threads = [threading.Thread(target=race, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert outcomes.count("busy") == 3
    assert scalar(conn, "SELECT count(*) FROM notification_attempts") == 1
