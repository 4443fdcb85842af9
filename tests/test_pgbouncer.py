"""Through a real PgBouncer in transaction pooling mode: every statement works
(no session state, no server-side prepared statements), wake-ups arrive over the
direct `listen_url`, and reload and SIGKILL behave as without it."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from dramatiq import Message
from psycopg.conninfo import make_conninfo

from supervisor import apps, db
from supervisor.broker import PostgresBroker
from supervisor.migrate import load_migrations, migrate
from tests.conftest import cli, scalar, wait_for
from tests.pgbouncer import PgBouncer
from tests.supervisor_helpers import (
    JobStream,
    assert_exactly_once,
    enqueue,
    log_producer,
    role,
    wait_all_succeeded,
    write_config,
)


@pytest.fixture
def bouncer(database_url: str) -> Iterator[PgBouncer]:
    b = PgBouncer(database_url)
    try:
        yield b
    finally:
        b.stop()


def _clients(bouncer: PgBouncer) -> int:
    """Client connections PgBouncer holds for our test database (its admin console)."""
    dbname = psycopg.conninfo.conninfo_to_dict(bouncer.url)["dbname"]
    return sum(1 for url in _admin(bouncer, "SHOW CLIENTS") if url == dbname)


def _admin(bouncer: PgBouncer, command: str) -> list[str]:
    admin = psycopg.conninfo.make_conninfo(bouncer.url, dbname="pgbouncer")
    # The admin console speaks the simple query protocol only: a client-side-binding cursor.
    with psycopg.connect(admin, autocommit=True, cursor_factory=psycopg.ClientCursor) as c:
        cur = c.execute(command)
        names = [d.name for d in cur.description or []]
        return [row[names.index("database")] for row in cur.fetchall()]


def test_pgbouncer_is_detected_and_a_direct_server_is_not(bouncer, database_url):
    assert db.detect_pooled(bouncer.url) is True
    assert db.detect_pooled(database_url) is False
    chosen = db.resolve(bouncer.url, listen_url=database_url)
    assert chosen.pooled and chosen.listen_url == database_url and db.is_pooled(bouncer.url)
    # Pooled without a direct URL: nowhere to LISTEN, consumers poll.
    assert db.resolve(bouncer.url).listen_url == ""


def test_four_processes_drain_exactly_once_then_reload_and_sigkill(tmp_path, conn, database_url, bouncer,
                                                                    supervisor):
    path = write_config(tmp_path / "s.yaml", bouncer.url, {"alpha": role(processes=4, threads=4)},
                        database={"listen_url": database_url})
    s = supervisor(path)
    s.wait_state({"alpha": 4})
    assert "(pooled)" in s.log()  # detected: no prepared statements from here on
    enqueue(conn, 5000)
    assert_exactly_once(conn, 5000)
    assert _clients(bouncer) >= 4  # the workers' connections go through PgBouncer

    # One LISTEN connection for the host (the master's relay), on the direct URL.
    listeners = conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE query LIKE 'LISTEN actor_supervisor%%'"
        " AND application_name LIKE %s", (f"%:{s.pid}",)).fetchall()
    assert len(listeners) == 1, listeners
    # Wake-ups arrive by NOTIFY: a job sent to idle workers starts well within the
    # 1 s poll a worker falls back to without them.
    conn.execute("TRUNCATE job_queue, job_history, test_results CASCADE")
    for n in range(5):
        enqueue(conn, 1)
        wait_all_succeeded(conn, n + 1, timeout=10)
    slowest = scalar(conn, "SELECT max(extract(epoch FROM started_at - created_at)) FROM jobs")
    assert slowest < 0.5, slowest

    # Reload through PgBouncer: 4 -> 3 processes, in place.
    write_config(path, bouncer.url, {"alpha": role(processes=3, threads=4)}, database={"listen_url": database_url})
    cli("reload", config=path)
    s.wait_state({"alpha": 3})

    # SIGKILL a worker holding jobs under a stream: nothing lost.
    conn.execute("TRUNCATE job_queue, job_history, test_results CASCADE")
    stream = JobStream(database_url, per_second=100, sleep_s=0.2)
    stream.start()
    victim = wait_for(lambda: next((p for p in s.roles()["alpha"]["processes"] if p["in_flight"] > 0), None),
                      10, message="a worker holding jobs")
    os.kill(victim["pid"], signal.SIGKILL)
    s.wait_state({"alpha": 3}, timeout=20)
    sent = stream.stop()
    wait_all_succeeded(conn, sent, timeout=60)
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results") == sent
    released = scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE %s", (f"%prior owner {victim['owner']}%",))
    assert released >= 1

    # The same through the log (the default storage's path for a plain job): a producer
    # that knows the actor sends through PgBouncer; a worker holding some is SIGKILLed.
    with log_producer(bouncer.url, "tests", {"record": {"max_retries": 2}}, pool_size=2) as producer:
        record = producer.actors["record"]
        ids = [m.message_id for m in producer.enqueue_many([record.message(n=i, sleep_s=0.5) for i in range(120)])]
        assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = ANY(%s::uuid[])", (ids,)) == len(ids)
        # the victim: a process the database says runs one of them now (its 0.5 s outlasts the kill)
        owner = wait_for(lambda: scalar(conn, "SELECT max(lease_owner) FROM jobs WHERE id = ANY(%s::uuid[])"
                                              " AND status = 'running'", (ids,)), 10, message="a worker running log jobs")
        pid = int(owner.split(":")[1])  # host:pid:tag
        assert pid in s.pids("alpha")
        os.kill(pid, signal.SIGKILL)
        s.wait_state({"alpha": 3}, timeout=20)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'",
                                (ids,)) == len(ids), 60, message="every log job to succeed")
        assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)) == len(ids)
        assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results WHERE job_id = ANY(%s::uuid[])",
                      (ids,)) == len(ids)
        assert scalar(conn, "SELECT count(*) FROM job_events WHERE job_id = ANY(%s::uuid[]) AND reason LIKE %s",
                      (ids, f"%prior owner {owner}%")) >= 1  # the killed worker's log jobs went back
    # No statement failed on session state a pooled connection lacks (a prepared
    # statement of another session, a setting, a LISTEN).
    assert "does not exist" not in s.log() and "Traceback" not in s.log()


def test_two_concurrent_migrations_through_pgbouncer_apply_each_version_once(bouncer, database_url):
    name = f"as_pgb_{secrets.token_hex(3)}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        pooled = make_conninfo(bouncer.url, dbname=name)
        db.mark_pooled(pooled)
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda _: migrate(pooled, apps.installed()), range(2)))
        expected = {m.version for m in load_migrations(apps.installed())}
        assert sorted(m.version for run in runs for m in run) == sorted(expected)  # each applied by one run
        with psycopg.connect(make_conninfo(database_url, dbname=name), autocommit=True) as c:
            versions = [r[0] for r in c.execute("SELECT version FROM schema_migrations")]
        assert sorted(versions) == sorted(expected)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_producers_send_and_bulk_copy_through_pgbouncer(bouncer, conn):
    db.mark_pooled(bouncer.url)
    broker = PostgresBroker(bouncer.url, pool_size=2)
    try:
        def message(i: int, key: str | None = None) -> Message:
            options = {"dedupe_key": key} if key else {}
            return Message(queue_name="tests", actor_name="nap", args=(i,), kwargs={}, options=options)

        for _ in range(8):  # past psycopg's prepare threshold (5): no prepared statement is used
            broker.enqueue(message(0))
        sent = broker.enqueue_many([message(i, key=f"k{i % 50}") for i in range(200)])  # COPY, keys deduped
        assert len({m.message_id for m in sent}) == 50
        assert scalar(conn, "SELECT count(*) FROM jobs") == 8 + 50
    finally:
        broker.close()


def test_a_log_batch_by_copy_through_pgbouncer(bouncer, conn):
    """The log's COPY batch through transaction pooling: its pipelined live-id check (a
    binary uuid[]) and the COPY, each a transaction of its own or both in the caller's,
    write each id once, a live one not again."""
    db.mark_pooled(bouncer.url)
    with log_producer(bouncer.url, "tests", {"nap": {}}, pool_size=2) as producer:
        nap = producer.actors["nap"]
        batch = [nap.message(i) for i in range(200)]
        assert producer.enqueue_many(batch + batch[:3]) == batch + batch[:3]
        more = [nap.message(i) for i in range(40)]
        with psycopg.connect(bouncer.url, prepare_threshold=None) as tx:
            with producer.transaction(tx):
                producer.enqueue_many(more + batch[-5:])
            tx.commit()
        assert scalar(conn, "SELECT count(*) FROM job_log") == 240
        assert scalar(conn, "SELECT count(DISTINCT id) FROM job_log") == 240


def test_llm_fleet_slots_through_pgbouncer_are_never_stranded(bouncer, conn):
    """Many short slot holds from several threads over a small PgBouncer pool: a slot
    is held exactly while its block runs, and none outlives it on a server connection."""
    from actors.llm import LlmUnavailable, fleet_slot
    from actors.queries import slots

    db.mark_pooled(bouncer.url)
    pool = db.make_pool(bouncer.url, min_size=1, max_size=6, name="llm-test")
    key = "llm:bounced"
    try:
        with fleet_slot(pool, key, 1, wait=1.0):
            assert scalar(conn, slots.HELD, {"key": key}) == 1
            with pytest.raises(LlmUnavailable, match="all 1 fleet-wide slots busy"), \
                    fleet_slot(pool, key, 1, wait=0.1):
                pass
        assert scalar(conn, slots.HELD, {"key": key}) == 0

        def cycles(_: int) -> int:
            for _ in range(40):
                with fleet_slot(pool, key, 2, wait=30.0):
                    held = scalar(conn, slots.HELD, {"key": key})
                    assert 1 <= held <= 2, held
            return 40

        with ThreadPoolExecutor(6) as ex:
            assert sum(ex.map(cycles, range(6))) == 240
        assert scalar(conn, slots.HELD, {"key": key}) == 0
    finally:
        pool.close()


def test_a_pooled_role_with_no_listen_polls_at_its_poll_interval(tmp_path, conn, bouncer, supervisor):
    """Nowhere to LISTEN: idle workers find new work by polling, every `poll_interval`
    of their role (1 s by default), here 0.1 s."""
    path = write_config(tmp_path / "s.yaml", bouncer.url, {"alpha": role(processes=1, threads=2,
                                                                          poll_interval="100ms")})
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    for n in range(10):
        enqueue(conn, 1)
        wait_all_succeeded(conn, n + 1, timeout=10)
    waits = [r[0] for r in conn.execute("SELECT extract(epoch FROM started_at - created_at)::float8 FROM jobs")]
    # A 1 s poll leaves a job waiting 0.5 s on average: ten of them all under 0.7 s
    # would be a 3 % chance; at 0.1 s each waits at most ~0.1 s plus the claim.
    assert max(waits) < 0.7, waits
