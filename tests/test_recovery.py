"""Fast recovery: a private PostgreSQL server restarted under running workers,
and a pool whose idle connections the server dropped all at once."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from supervisor import db
from supervisor.testsignals import ClaimsBack, ClaimsFailing
from tests.conftest import scalar, wait_for
from tests.private_server import PrivateServer
from tests.supervisor_helpers import log_producer, role, write_config


@pytest.fixture(params=["table", "log"])
def send(request: pytest.FixtureRequest, private_server: PrivateServer) -> Iterator[Callable[[psycopg.Connection, int], str]]:
    """How the test sends a `record` job: by SQL (job_queue), or by a producer that knows the
    actor and lives through the restart (a plain job goes to the job log, the default storage)."""
    if request.param == "table":
        yield lambda conn, n: str(scalar(conn, "INSERT INTO jobs (queue, actor, args) VALUES ('tests', 'record',"
                                               " jsonb_build_array(%s)) RETURNING id", (n,)))
        return
    with log_producer(private_server.url, "tests", {"record": {}}) as producer:
        def to_log(conn: psycopg.Connection, n: int) -> str:
            job = producer.actors["record"].send(n).message_id
            assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (job,)) == 1
            return job

        yield to_log


def test_claiming_resumes_within_a_second_after_postgres_restarts(private_server, workers, send):
    url = private_server.url
    procs = [workers(url, threads=2, lease=30, heartbeat=1) for _ in range(2)]
    with psycopg.connect(url, autocommit=True) as conn:
        for p in procs:
            p.wait_ready(conn)
        job = send(conn, 1)
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "succeeded", 10)
    private_server.stop()
    for p in procs:
        p.signals.wait(ClaimsFailing, timeout=30)  # the workers noticed the outage
    # The injected fault's duration, not a wait for an event: the database stays away 3 s,
    # by when a reconnect backoff of 1 s, 2 s, 4 s... would already wait past the 1 s bound
    # below. (A worker signals only the first failure, and once it claims again: no event to await.)
    time.sleep(3.0)
    private_server.start()
    with psycopg.connect(url, autocommit=True) as conn:
        job = send(conn, 2)
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "succeeded", 30,
                 interval=0.05, message="a job sent after the restart to run")
        delay = scalar(conn, "SELECT extract(epoch FROM started_at - created_at) FROM jobs WHERE id = %s", (job,))
    for p in procs:
        assert p.proc.poll() is None
    assert delay < 1.0, f"claimed {delay:.2f}s after PostgreSQL was back"
    for p in procs:
        p.signals.wait(ClaimsBack, timeout=2)  # every worker claims again
    assert not any("Restarting consumer" in p.stderr() for p in procs)


def test_a_ready_process_killed_is_replaced_at_once(tmp_path, conn, database_url, supervisor):
    # A long crash backoff, to tell a replacement made at once from one that waited it out.
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=1)},
                        restart_backoff="10s", restart_backoff_max="10s")
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    for _ in range(2):  # again: the replacement, once ready, is replaced at once too
        [victim] = s.pids("alpha")
        wait_for(lambda: s.roles()["alpha"]["processes"][0]["uptime"] > 3.0, 15, message="the child to settle")
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda v=victim: (p := s.pids("alpha")) and v not in p, 5, interval=0.02,
                 message="a replacement")
        assert time.monotonic() - killed < 1.5
        s.wait_state({"alpha": 1})
    assert s.roles()["alpha"]["state"] == "running"


def test_a_pool_whose_idle_connections_all_died_serves_a_new_one_at_once(conn, database_url, monkeypatch):
    """A restart or a failover kills every idle connection of a pool at once. The
    first caller must not be handed the dead ones one after another with psycopg_pool's
    backoff between them (1, 2, 4, 8, 16 s): that was a PoolTimeout after 30 s."""
    monkeypatch.setattr(db, "PROBE_IDLE_SECONDS", 0.0)  # as after a quiet spell: every hand-out probes
    pool = db.make_pool(database_url, min_size=0, max_size=8, name="dead-idle", reconnect_timeout=30)
    try:
        with contextlib.ExitStack() as held:
            backends = [held.enter_context(pool.connection()).info.backend_pid for _ in range(8)]
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (backends,))
        wait_for(lambda: not scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (backends,)),
                 10, message="the pool's sessions to end")
        started = time.monotonic()
        # Handed out one by one, the sixth dead connection would come 15 s after the first.
        with pool.connection(timeout=15) as fresh:
            assert fresh.info.backend_pid not in backends and fresh.execute("SELECT 1").fetchone() == (1,)
        assert time.monotonic() - started < 5
    finally:
        pool.close()
