"""PostgresBroker state transitions, in one process against the real database."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from datetime import timedelta

import dramatiq
import pytest
from dramatiq.broker import Broker
from dramatiq.message import Message

from supervisor.broker import PostgresBroker
from supervisor.broker.middleware import Retries, backoff_ms
from supervisor.broker.signals import Signals
from tests.conftest import in_process_worker, scalar, wait_for


def test_the_broker_is_composed_with_signals_its_one_base_besides_dramatiqs():
    """Its parts are attributes, each given what it needs (ARCHITECTURE.md, "The broker's
    parts"); Signals stays a base: the middleware property and the emit_* Dramatiq calls."""
    assert PostgresBroker.__mro__ == (PostgresBroker, Signals, Broker, object)


@pytest.fixture(scope="session")
def broker(database_url: str) -> Iterator[PostgresBroker]:
    """The broker tests.sample_actors bind to: Dramatiq's global broker when they are first
    imported (once per process), so it lives as long as the session. Later tests may make
    another broker the global one: these tests name this one."""
    b = PostgresBroker(database_url, lease_seconds=30, poll_interval=0.2, pool_size=12)
    dramatiq.set_broker(b)
    importlib.import_module("tests.sample_actors")  # its actors bind to the global broker at import

    yield b
    b.close()


@pytest.fixture
def actors(broker):
    import tests.sample_actors as a

    return a


@pytest.fixture
def worker(broker, conn) -> Iterator[dramatiq.Worker]:
    with in_process_worker(broker, ["tests"]) as w:
        yield w


def status(conn, job_id) -> str:
    return scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,))


def wait_status(conn, job_id, wanted: str, timeout: float = 20) -> None:
    wait_for(lambda: status(conn, job_id) == wanted, timeout, message=f"job {job_id} to be {wanted}")


def test_send_writes_a_pending_row(conn, actors):
    msg = actors.record.send(5)
    row = conn.execute(
        "SELECT status, queue, actor, args, max_attempts, run_at <= now() FROM jobs WHERE id = %s",
        (msg.message_id,),
    ).fetchone()
    assert row == ("pending", "tests", "record", [5], 4, True)  # max_retries=3 -> 4 attempts


def test_success_marks_succeeded_once(conn, actors, worker):
    msg = actors.record.send(1)
    wait_status(conn, msg.message_id, "succeeded")
    row = conn.execute(
        "SELECT attempts, started_at IS NOT NULL, finished_at >= started_at FROM jobs WHERE id = %s",
        (msg.message_id,),
    ).fetchone()
    assert row == (1, True, True)
    assert scalar(conn, "SELECT count(*) FROM test_results WHERE job_id = %s", (msg.message_id,)) == 1


def test_plain_sql_insert_is_runnable(conn, actors, worker):
    job_id = scalar(conn, "INSERT INTO jobs (queue, actor, args) VALUES ('tests', 'record', '[9]') RETURNING id")
    wait_status(conn, job_id, "succeeded")
    assert scalar(conn, "SELECT n FROM test_results WHERE job_id = %s", (job_id,)) == 9


def test_retry_goes_through_retryable_with_backoff(conn, actors, worker):
    msg = actors.flaky.send(2)  # fails twice, succeeds on the third attempt
    wait_status(conn, msg.message_id, "succeeded")
    assert scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (msg.message_id,)) == 3
    events = conn.execute(
        "SELECT from_status, to_status, reason FROM job_events WHERE job_id = %s ORDER BY id", (msg.message_id,)
    ).fetchall()
    assert [(e[0], e[1]) for e in events] == [("running", "retryable"), ("running", "retryable")]
    # base 100 ms, doubling: 100 then 200
    assert "retry in 100 ms" in events[0][2] and "retry in 200 ms" in events[1][2]


def test_durations_are_each_attempts_run_time_and_the_wait_is_reported_apart(conn, actors, broker):
    """Four 0.3 s jobs claimed at once by one thread: each waits in the prefetch buffer
    for the ones before it. Its duration is its own 0.3 s, not the time since its claim
    (0.3, 0.6, 0.9, 1.2 s), and the wait shows as the start wait, in the capacity plan."""
    from supervisor import admin

    sent = [actors.nap.send(i, 0.3) for i in range(4)]
    with in_process_worker(broker, ["tests"], threads=1, prefetch=4):
        for m in sent:
            wait_status(conn, m.message_id, "succeeded")
    rows = conn.execute(
        "SELECT extract(epoch FROM finished_at - started_at)::float8,"
        "       extract(epoch FROM started_at - greatest(created_at, run_at))::float8,"
        "       claimed_at < started_at"
        "  FROM jobs WHERE id = ANY(%s::uuid[]) ORDER BY started_at", ([m.message_id for m in sent],)).fetchall()
    assert all(0.29 < ran < 0.55 for ran, _, _ in rows), rows  # (claimed at once: 0.3, 0.6, 0.9, 1.2 s)
    assert all(claimed_first for _, _, claimed_first in rows), rows
    waits = [wait for _, wait, _ in rows]
    assert waits[-1] > 0.85 and waits == sorted(waits), rows  # the last waited for three runs
    [cap] = [q for q in admin.queue_capacity(conn) if q["queue"] == "tests"]
    assert 0.29 < cap["avg_duration_s"] < 0.55, cap
    assert cap["wait_p50_s"] <= cap["wait_p95_s"] <= cap["wait_p99_s"] and cap["wait_p99_s"] > 0.8, cap


def test_a_retried_jobs_duration_is_its_last_attempt_not_the_backoff(conn, actors, worker):
    msg = actors.flaky.send_with_options(args=(1,), min_backoff=800)  # fails once, retried 0.8 s later
    wait_status(conn, msg.message_id, "succeeded")
    ran, waited, attempts = conn.execute(
        "SELECT extract(epoch FROM finished_at - started_at)::float8,"
        "       extract(epoch FROM started_at - run_at)::float8, attempts FROM jobs WHERE id = %s",
        (msg.message_id,)).fetchone()
    assert attempts == 2 and ran < 0.4 and -0.01 < waited < 0.5, (ran, waited)


def test_retry_run_at_is_in_the_future(conn, actors, broker):
    msg = actors.flaky.send_with_options(args=(5,), min_backoff=60_000)
    [claimed] = broker.claim("tests", 1)
    claimed.stuff_exception(RuntimeError("boom"))
    retries = next(m for m in broker.middleware if isinstance(m, Retries))
    retries.after_process_message(broker, claimed, exception=RuntimeError("boom"))
    broker.ack(claimed)  # what Dramatiq does next: must not clobber the retry
    broker.flush_acks(5)
    row = conn.execute(
        "SELECT status, extract(epoch FROM run_at - now()) FROM jobs WHERE id = %s", (msg.message_id,)
    ).fetchone()
    assert row[0] == "retryable"
    assert 55 < row[1] <= 60


def test_backoff_is_exponential_and_capped():
    assert [backoff_ms(n, 1000, 10**9) for n in (1, 2, 3, 4)] == [1000, 2000, 4000, 8000]
    day = 24 * 3600 * 1000
    assert backoff_ms(40, 15_000, day) == day


def test_exhausted_retries_fail_with_traceback(conn, actors, worker):
    msg = actors.flaky.send(10)  # max_retries=2: three attempts, all fail
    wait_status(conn, msg.message_id, "failed")
    attempts, error, finished = conn.execute(
        "SELECT attempts, last_error, finished_at IS NOT NULL FROM jobs WHERE id = %s", (msg.message_id,)
    ).fetchone()
    assert attempts == 3 and finished
    assert "Traceback" in error and "planned failure 3 of 10" in error
    last = conn.execute(
        "SELECT to_status FROM job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1", (msg.message_id,)
    ).fetchone()[0]
    assert last == "failed"


def test_unknown_actor_fails_the_job_not_the_worker(conn, actors, worker):
    bad = scalar(conn, "INSERT INTO jobs (queue, actor) VALUES ('tests', 'no_such_actor') RETURNING id")
    wait_status(conn, bad, "failed")
    error = scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (bad,))
    assert "no_such_actor" in error and "is declared in this worker" in error
    good = actors.record.send(1)
    wait_status(conn, good.message_id, "succeeded")


def test_time_limit_fails_the_job(conn, actors, worker):
    msg = actors.slow.send(10)  # time_limit=300 ms
    wait_status(conn, msg.message_id, "failed", timeout=15)
    assert "TimeLimitExceeded" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (msg.message_id,))


def test_age_limit_skips_an_old_message(conn, actors, broker, worker):
    # Sent an hour old, as Dramatiq stamps it (pausing the claims, sending, then ageing the
    # row raced a claim already under way: the job ran before it was aged, 1 run in 8)
    fresh = actors.record.message_with_options(args=(1,), max_age=60_000)
    msg = broker.enqueue(fresh.copy(message_timestamp=fresh.message_timestamp - 3600 * 1000))
    assert scalar(conn, "SELECT message_timestamp FROM jobs WHERE id = %s", (msg.message_id,)) \
        == fresh.message_timestamp - 3600 * 1000
    wait_status(conn, msg.message_id, "failed")
    assert "SkipMessage" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (msg.message_id,))
    assert scalar(conn, "SELECT count(*) FROM test_results") == 0
    # It never ran: no start, so no duration to count in the queue's averages.
    assert scalar(conn, "SELECT started_at FROM jobs WHERE id = %s", (msg.message_id,)) is None


def test_on_success_callback_runs(conn, actors, worker):
    msg = actors.record.send_with_options(args=(3,), on_success=actors.on_done)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM test_results WHERE tag = 'callback'") == 1)
    assert str(scalar(conn, "SELECT job_id FROM test_results WHERE tag = 'callback'")) == msg.message_id


def test_current_message_is_the_job(conn, actors, worker):
    msg = actors.record.send(4)
    wait_status(conn, msg.message_id, "succeeded")
    assert str(scalar(conn, "SELECT job_id FROM test_results")) == msg.message_id


def test_dedupe_key_returns_the_live_job(conn, actors, broker):
    first = actors.record.send_with_options(args=(1,), dedupe_key="watch:1")
    second = actors.record.send_with_options(args=(2,), dedupe_key="watch:1")
    assert second.message_id == first.message_id
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE dedupe_key = 'watch:1'") == 1
    bulk = broker.enqueue_many(
        [actors.record.message_with_options(args=(i,), dedupe_key="watch:1") for i in range(3)]
        + [actors.record.message_with_options(args=(9,), dedupe_key="watch:2")]
    )
    assert [m.message_id for m in bulk[:3]] == [first.message_id] * 3
    assert scalar(conn, "SELECT count(*) FROM jobs") == 2
    # once the job is finished, the key is free again
    conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id = %s", (first.message_id,))
    third = actors.record.send_with_options(args=(3,), dedupe_key="watch:1")
    assert third.message_id != first.message_id


def test_priority_then_run_at_order(conn, actors, broker):
    low = actors.record.send_with_options(args=(1,), priority=0)
    high = actors.record.send_with_options(args=(2,), priority=10)
    later = actors.record.send_with_options(args=(3,), priority=10)
    delayed = actors.record.send_with_options(args=(4,), priority=99, delay=60_000)
    claimed = broker.claim("tests", 10)
    assert [m.message_id for m in claimed] == [high.message_id, later.message_id, low.message_id]
    assert status(conn, delayed.message_id) == "pending"
    broker.requeue(claimed)


def test_bulk_enqueue_is_one_statement(conn, actors, broker):
    messages = [actors.noop.message() for _ in range(5000)]
    broker.enqueue_many(messages)
    # Every row carries the transaction (xmin) and the command within it (cmin) that
    # wrote it: one of each means one statement in one transaction. (A count of
    # commits in pg_stat_database also counts other sessions' and lags behind.)
    writers = conn.execute(
        "SELECT count(*), count(DISTINCT xmin::text), count(DISTINCT cmin::text) FROM "
        + "job_log"
    ).fetchone()
    assert writers == (5000, 1, 1)


def test_enqueue_in_callers_transaction(conn, actors, broker, database_url):
    import psycopg

    with psycopg.connect(database_url) as tx:  # not autocommit: one transaction
        with broker.transaction(tx):
            rolled_back = actors.record.send(1)
        tx.rollback()
        with broker.transaction(tx):
            committed = actors.record.send(2)
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (rolled_back.message_id,)) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (committed.message_id,)) == 1


def test_unknown_actor_name_can_be_enqueued_by_name(conn, broker):
    msg = broker.enqueue(Message(queue_name="elsewhere", actor_name="remote", args=(), kwargs={}, options={}))
    assert conn.execute("SELECT queue, actor, max_attempts FROM jobs WHERE id = %s",
                        (msg.message_id,)).fetchone() == ("elsewhere", "remote", None)  # the claiming worker's actor decides


def test_conditional_ack_after_reclaim_changes_nothing(conn, actors, broker, database_url):
    a = PostgresBroker(database_url, lease_seconds=1, owner="host-a:1:aaaaaa", pool_size=2)
    b = PostgresBroker(database_url, lease_seconds=30, owner="host-b:2:bbbbbb", pool_size=2)
    try:
        for x in (a, b):
            x.declare_queue("tests")
            x.actors.update(broker.actors)
        msg = actors.record.send(1)
        [mine] = a.claim("tests", 1)
        conn.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                     (msg.message_id,))
        reaped = b.leases.reap_expired()
        assert reaped == [(msg.message_id, "pending", "host-a:1:aaaaaa")]
        reason = scalar(conn, "SELECT reason FROM job_events WHERE job_id = %s", (msg.message_id,))
        assert "prior owner host-a:1:aaaaaa" in reason and "lease loss 1 of 3" in reason
        [theirs] = b.claim("tests", 1)
        assert theirs.attempts == 2
        a.ack(mine)  # late ack from the old owner: fenced out
        a.flush_acks(5)
        assert status(conn, msg.message_id) == "running"
        b.ack(theirs)
        b.flush_acks(5)
        assert status(conn, msg.message_id) == "succeeded"
    finally:
        a.close()
        b.close()


def test_lost_leases_spend_the_poison_pill_budget_not_max_retries(conn, actors, broker):
    msg = actors.record.send_with_options(args=(1,), max_retries=0, max_lease_losses=2)
    for attempt in (1, 2):
        [claimed] = broker.claim("tests", 1)
        assert (claimed.attempts, claimed.deliveries) == (attempt, 1)
        broker.leases.let_go(claimed.message_id)
        released = broker.leases.release_owner(broker.owner, why="process died")
        assert released[0][1] == ("pending" if attempt == 1 else "failed")
    assert status(conn, msg.message_id) == "failed"
    error = scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (msg.message_id,))
    assert "poison pill: lease lost 2 times" in error and "max_lease_losses=2" in error


def test_requeue_returns_prefetched_rows_uncounted(conn, actors, broker):
    sent = [actors.record.send(i).message_id for i in range(3)]
    claimed = broker.claim("tests", 3)
    assert len(claimed) == 3
    assert broker.requeue(claimed) == 3
    rows = conn.execute("SELECT status, attempts, lease_owner FROM jobs WHERE id = ANY(%s)", (sent,)).fetchall()
    assert rows == [("pending", 0, None)] * 3


def test_heartbeat_renews_only_own_leases(conn, actors, broker, database_url):
    other = PostgresBroker(database_url, lease_seconds=5, owner="other:1:cccccc", pool_size=1)
    try:
        other.declare_queue("tests")
        other.actors.update(broker.actors)
        actors.record.send(1)
        actors.record.send(2)
        [mine] = broker.claim("tests", 1)
        [theirs] = other.claim("tests", 1)
        # both leases at their end, in the log's lease rows
        conn.execute("UPDATE job_lease SET expires_at = now()")
        assert broker.leases.heartbeat() == 1
        expiry = dict(conn.execute("SELECT id::text, lease_expires_at > now() + interval '20 s' FROM jobs"
                                   " WHERE status = 'running'").fetchall())
        assert expiry == {mine.message_id: True, theirs.message_id: False}
        broker.requeue([mine])
        other.requeue([theirs])
    finally:
        other.close()


def test_concurrency_key_claims_never_overlap(conn, actors, broker, database_url):
    """Many claimers racing over jobs that share a few keys: at most one running
    per key at every moment, no errors, no deadlocks."""
    broker.enqueue_many(
        [actors.hold.message_with_options(args=(f"k{i % 3}", 0), concurrency_key=f"k{i % 3}") for i in range(60)]
        + [actors.noop.message() for _ in range(20)]
    )
    claimers = [PostgresBroker(database_url, owner=f"c:{i}:000000", pool_size=1) for i in range(6)]
    errors: list[BaseException] = []
    violations: list[int] = []
    done = threading.Event()

    def claimer(b: PostgresBroker) -> None:
        b.declare_queue("tests")
        b.actors.update(broker.actors)
        try:
            while not done.is_set():
                got = b.claim("tests", 4)
                with b.pool.connection() as c:
                    worst = c.execute(
                        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobs"
                        " WHERE status = 'running' AND concurrency_key IS NOT NULL GROUP BY concurrency_key) s"
                    ).fetchone()[0]
                if worst > 1:
                    violations.append(worst)
                for m in got:
                    b.ack(m)
                b.flush_acks(5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(b,)) for b in claimers]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 80, 60)
    finally:
        done.set()
        for t in threads:
            t.join(10)
        for b in claimers:
            b.close()
    assert errors == [] and violations == []
    assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0


def test_concurrency_key_serialises_real_runs(conn, actors, worker, broker):
    broker.enqueue_many(
        [actors.hold.message_with_options(args=("store-1", 0.05), concurrency_key="store-1") for _ in range(8)]
    )
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 8, 30)
    spans = conn.execute("SELECT started, finished FROM test_results ORDER BY started").fetchall()
    assert len(spans) == 8
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end - timedelta(milliseconds=5)


def test_retention_prunes_old_finished_rows_only(conn, broker):
    from supervisor.config import Retention
    from supervisor.registry import Registration
    from supervisor.worker.upkeep import Upkeep, UpkeepSettings

    conn.execute(
        "INSERT INTO jobs (actor, status, finished_at) SELECT 'x', s, now() - interval '8 days'"
        " FROM unnest(ARRAY['succeeded', 'failed', 'cancelled']) AS s"
    )
    conn.execute("INSERT INTO jobs (actor, status, finished_at) VALUES ('x', 'succeeded', now())")
    conn.execute("INSERT INTO jobs (actor, status, created_at) VALUES ('x', 'pending', now() - interval '30 days')")
    registration = Registration(broker.pool, broker.owner, role="t", queues=["tests"])
    upkeep = Upkeep(broker, registration, settings=UpkeepSettings(), state=lambda: "running")
    counts = upkeep.prune()
    assert (counts["succeeded"], counts["failed"], counts["cancelled"]) == (1, 0, 1)  # failed: kept 30 days
    upkeep = Upkeep(broker, registration, settings=UpkeepSettings(retention=Retention(failed=86400)),
                    state=lambda: "running")
    assert upkeep.prune()["failed"] == 1
    assert sorted(r[0] for r in conn.execute("SELECT status FROM jobs")) == ["pending", "succeeded"]


def test_actor_level_job_options_and_flush_join(conn, broker):
    @dramatiq.actor(queue_name="keyed", actor_name="keyed_noop", concurrency_key="one-at-a-time", max_attempts=2)
    def keyed_noop() -> None:
        pass

    msg = keyed_noop.send()
    row = conn.execute("SELECT concurrency_key, max_attempts FROM jobs WHERE id = %s", (msg.message_id,)).fetchone()
    assert row == ("one-at-a-time", 2)
    with pytest.raises(dramatiq.errors.QueueJoinTimeout):
        broker.join("keyed", timeout=100)
    broker.flush("keyed")
    broker.join("keyed", timeout=1000)  # nothing live any more
    # (on storage "log" the job lives in the log, 053: flushed, its attempt ends 'cancelled')
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE queue = 'keyed' AND status <> 'cancelled'") == 0


def test_signals_follow_every_change_to_the_middleware_list(database_url):
    # Each signal's hooks are computed once and kept on the list: every way of
    # changing the list must make the next signal see the change.
    from dramatiq.middleware import Middleware

    seen: list[str] = []

    class Recorder(Middleware):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def before_ack(self, broker, message) -> None:
            seen.append(self.tag)

    def emitted() -> list[str]:
        seen.clear()
        b.emit_before("ack", None)
        return list(seen)

    b = PostgresBroker(database_url)
    try:
        assert emitted() == []  # the hooks of "before_ack" are now computed, without a recorder
        b.add_middleware(Recorder("added"))
        b.middleware.append(Recorder("appended"))
        assert emitted() == ["added", "appended"]
        del b.middleware[-1]
        b.middleware += [Recorder("plus")]
        b.middleware.insert(0, Recorder("first"))
        assert emitted() == ["first", "added", "plus"]
        b.middleware = [m for m in b.middleware if not isinstance(m, Recorder)]
        assert emitted() == []
    finally:
        b.close()


def test_every_priority_of_the_int_range_runs(conn, actors, database_url):
    """Both ends of jobs.priority's int range are claimed, in priority order; and a row any SQL client writes into job_queue at the lowest
    priority is claimed too (the claim's level probe once stopped above it: pending forever)."""
    from supervisor.cli.jobs import INT4_MAX, INT4_MIN

    b = PostgresBroker(database_url, pool_size=2)
    b.declare_actor(actors.record)
    try:
        sent = [b.enqueue(actors.record.message_with_options(args=(p,), priority=p)).message_id
                for p in (INT4_MIN, 0, INT4_MAX)]
        by_hand = scalar(conn, "INSERT INTO job_queue (queue, actor, args, priority) VALUES ('tests', 'record', '[1]', %s)"
                               " RETURNING id::text", (INT4_MIN,))
        claims = []
        while len(claims) < 6 and (claimed := b.claim("tests", 10)):
            claims.append([m.message_id for m in claimed])
        # the sent jobs come in one claim, highest first; the hand-written row in the
        # next one (the log's claim first)
        assert [i for c in claims for i in c] == [*reversed(sent), by_hand]
        assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 4
    finally:
        b.close()
