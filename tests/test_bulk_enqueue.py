"""enqueue_many's COPY path against the real database: the rows it writes are the
rows INSERT_MANY and a single enqueue write, dedupe keys are honoured, the
caller's transaction decides, delays and non-JSON encoders work."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from types import SimpleNamespace

import dramatiq
import psycopg
import pytest
from dramatiq.encoder import JSONEncoder, PickleEncoder
from dramatiq.message import Message

from supervisor import defaults
from supervisor.broker import PostgresBroker, sql
from supervisor.broker.bulk import COPY_MIN_ROWS
from supervisor.broker.bulk import enqueue_many as bulk_enqueue
from supervisor.broker.message import decode_claimed
from tests.conftest import scalar

QUEUE = "bulk"
N = COPY_MIN_ROWS  # the smallest batch enqueue_many sends with COPY

# Every column but the id, as one value per row.
ROW = "SELECT to_jsonb(j) - 'id' FROM jobs j WHERE id = %s"


@pytest.fixture
def actors(broker: PostgresBroker) -> SimpleNamespace:
    def plain(*args, **kwargs):
        pass

    def limited(*args):
        pass

    return SimpleNamespace(
        plain=dramatiq.actor(plain, broker=broker, queue_name=QUEUE),
        limited=dramatiq.actor(limited, broker=broker, queue_name=QUEUE, max_retries=2, concurrency_key="shop"),
    )


def enqueue(broker: PostgresBroker, messages: list[Message], *, copy: bool | None, conn=None,
            delay: int = 0) -> list[Message]:
    """bulk.enqueue_many with the path chosen (None: by size, as the broker does)."""
    with broker.connections.connection(conn) as c:
        return bulk_enqueue(c, messages, actors=broker.actors, retries=broker._retries(), delay=delay, copy=copy)


def varied(actors: SimpleNamespace, n: int = N) -> list[Message]:
    """Messages with every field a row takes, and text that COPY has to escape."""
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(actors.plain.message())
        elif kind == 1:
            out.append(actors.plain.message_with_options(
                args=(i, "tab\there, newline\nthere, back\\slash, quote\" and ünïcødé ✓", [1.5, None, True]),
                kwargs={"nested": {"list": [i, {"deep": "\\N"}]}, "empty": ""}, custom={"x": [1]}))
        elif kind == 2:
            out.append(actors.limited.message_with_options(args=(i,), priority=7, max_retries=5,
                                                           concurrency_key=f"store-{i % 3}"))
        elif kind == 3:
            out.append(actors.limited.message_with_options(args=(i,), max_attempts=4, max_lease_losses=2,
                                                           max_age=3_600_000))
        else:
            out.append(Message(queue_name="by-name", actor_name="elsewhere", args=(i,), kwargs={}, options={},
                               message_timestamp=1_234_567_890_000 + i))
    return out


def fresh_ids(messages: list[Message]) -> list[Message]:
    return [dataclasses.replace(m, message_id=str(uuid.uuid4())) for m in messages]


def received(conn, broker: PostgresBroker) -> dict[str, object]:
    """Each row of the queue as the message a worker's claim makes of it."""
    rows = conn.execute(f"SELECT {sql._CLAIMED} FROM jobs j WHERE j.queue = %s", (QUEUE,)).fetchall()
    messages, unreadable = decode_claimed(rows, broker.actors)
    assert unreadable == []
    return {m.message_id: m for m in messages}


def test_copy_writes_the_rows_insert_many_and_enqueue_write(conn, broker, actors, database_url):
    by_copy = varied(actors)
    by_insert, one_by_one = fresh_ids(by_copy), fresh_ids(by_copy)
    with psycopg.connect(database_url) as tx:  # one transaction: one now() for all three
        assert enqueue(broker, by_copy, copy=True, conn=tx) == by_copy
        assert enqueue(broker, by_insert, copy=False, conn=tx) == by_insert
        for m in one_by_one:
            broker.enqueue(m, conn=tx)
        rows = [[tx.execute(ROW, (m.message_id,)).fetchone()[0] for m in batch]
                for batch in (by_copy, by_insert, one_by_one)]
        logged = {r[0] for r in tx.execute("SELECT id::text FROM job_log WHERE id = ANY(%s)",
                                            ([m.message_id for m in one_by_one],))}
        tx.commit()
    # A plain job sent alone goes to the log (a batch through
    # bulk.py to job_queue), and so does one whose key has a concurrency limit alone (053);
    # a log row states its lease-loss budget when sent (a release by any process spends it)
    # where job_queue's claim fills it in, and a keyed one is pending until its claim gates
    # it where job_queue's waits for its key: otherwise the rows are the same.
    keyed = {m.message_id for m in one_by_one if m.actor_name == "limited"}
    # (an actor the producer does not know too, since 055: its worker fills in its budget)
    assert logged == {m.message_id for m in one_by_one}
    for m, row in zip(one_by_one, rows[2], strict=True):
        if m.message_id in logged:
            assert row["max_lease_losses"] == m.options.get("max_lease_losses", defaults.MAX_LEASE_LOSSES)
            row["max_lease_losses"] = None
            if m.message_id in keyed:
                assert row["status"] == "pending"
                row["status"] = "waiting"
    assert rows[0] == rows[1] == rows[2]
    first = rows[0]
    assert first[0]["max_attempts"] == 21 and first[2]["max_attempts"] == 6 and first[3]["max_attempts"] == 4
    assert first[4]["max_attempts"] is None  # an actor this producer does not know: its worker decides
    assert first[2]["priority"] == 7 and first[2]["concurrency_key"] == "store-2"
    assert first[3]["concurrency_key"] == "shop" and first[1]["args"][1].startswith("tab\there")
    # and the worker gets exactly the message that was sent
    got = received(conn, broker)
    for sent in by_copy:
        if sent.actor_name != "elsewhere":
            assert got[sent.message_id] == sent
            assert got[sent.message_id].message_timestamp == sent.message_timestamp
    # a job with a concurrency key waits for its key (flow control) in job_queue, or is
    # pending in the log (its claim gates it: 053); the others are pending
    assert scalar(conn, "SELECT count(*) FROM jobs j WHERE status = 'pending' AND flow_key IS NULL"
                        " OR status = 'waiting' AND flow_key = concurrency_key"
                        " OR status = 'pending' AND flow_key = concurrency_key"
                        "    AND EXISTS (SELECT 1 FROM job_log l WHERE l.id = j.id)") == 3 * N


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "insert_many"])
def test_dedupe_keys_against_live_jobs_and_within_the_batch(conn, broker, actors, copy):
    live = actors.plain.send_with_options(args=("live",), dedupe_key="live")
    done = actors.plain.send_with_options(args=("done",), dedupe_key="done")
    conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id = %s", (done.message_id,))
    keyed = [
        actors.plain.message_with_options(args=(1,), dedupe_key="live"),
        actors.plain.message_with_options(args=(2,), dedupe_key="new"),
        actors.plain.message_with_options(args=(3,), dedupe_key="done"),  # finished: its key is free
        actors.plain.message_with_options(args=(4,), dedupe_key="new"),
        actors.plain.message_with_options(args=(5,), dedupe_key="live"),
        actors.plain.message_with_options(args=(6,), dedupe_key="new"),
    ]
    batch = keyed + [actors.plain.message() for _ in range(N)]
    out = enqueue(broker, batch, copy=copy)
    assert [m.message_id for m in out[:6]] == [live.message_id, batch[1].message_id, batch[2].message_id,
                                               batch[1].message_id, live.message_id, batch[1].message_id]
    assert out[6:] == batch[6:]
    assert [dataclasses.replace(m, message_id="") for m in out] == [dataclasses.replace(m, message_id="") for m in batch]
    keys = conn.execute("SELECT dedupe_key, args FROM jobs WHERE dedupe_key IS NOT NULL AND status = 'pending'"
                        " ORDER BY dedupe_key").fetchall()
    assert keys == [("done", [3]), ("live", ["live"]), ("new", [2])]  # the batch's first "new" won
    assert scalar(conn, "SELECT count(*) FROM jobs") == 2 + 2 + N
    # the same batch again: every key is live now, every id is taken
    again = enqueue(broker, batch, copy=copy)
    assert [m.message_id for m in again] == [m.message_id for m in out]
    assert scalar(conn, "SELECT count(*) FROM jobs") == 2 + 2 + N


def test_a_batch_already_written_is_absorbed_inside_the_callers_transaction(conn, broker, actors, database_url):
    """COPY meets the ids already there: its savepoint is rolled back, INSERT_MANY
    skips them, and the caller's transaction goes on."""
    batch = [actors.plain.message() for _ in range(N)]
    broker.enqueue_many(batch)
    extra = [actors.plain.message() for _ in range(N)]
    with psycopg.connect(database_url) as tx:
        with broker.transaction(tx):
            assert broker.enqueue_many(batch + extra) == batch + extra
            actors.plain.send(1)
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM jobs") == 2 * N + 1


def test_the_callers_transaction_decides(conn, broker, actors, database_url):
    batch = [actors.plain.message() for _ in range(N)]
    with psycopg.connect(database_url) as tx:  # not autocommit, no transaction begun yet
        with broker.transaction(tx):
            broker.enqueue_many(batch)
        assert scalar(tx, "SELECT count(*) FROM jobs") == N  # written, in the caller's transaction
        assert scalar(conn, "SELECT count(*) FROM jobs") == 0  # not visible outside it
        tx.rollback()
    assert scalar(conn, "SELECT count(*) FROM jobs") == 0
    with psycopg.connect(database_url, autocommit=True) as c, pytest.raises(RuntimeError), c.transaction():
        broker.enqueue_many(batch, conn=c)
        raise RuntimeError("the caller's block fails")
    assert scalar(conn, "SELECT count(*) FROM jobs") == 0
    with psycopg.connect(database_url) as tx:
        broker.enqueue_many(batch, conn=tx)
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM jobs") == N


def test_a_delayed_batch_is_due_at_now_plus_the_delay(conn, broker, actors, database_url):
    batch = [actors.plain.message(i) for i in range(N)]
    with psycopg.connect(database_url) as tx:
        broker.enqueue_many(batch, delay=60_000, conn=tx)
        assert scalar(tx, "SELECT count(*) FROM jobs WHERE run_at = now() + interval '60 s' AND created_at = now()") == N
        tx.commit()
    assert broker.claim(QUEUE, 10) == []
    # past the year 9999 (Python's datetime): INSERT_MANY computes run_at in SQL
    far = [actors.plain.message(i) for i in range(N)]
    broker.enqueue_many(far, delay=10**15)
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE extract(year FROM run_at) > 30000") == N


def test_copy_wakes_consumers_like_an_insert(conn, broker, actors, database_url):
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN actor_supervisor_jobs")
        broker.enqueue_many([actors.plain.message() for _ in range(N)])
        broker.enqueue_many([actors.plain.message() for _ in range(N)], delay=60_000)
        got = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    assert got == [QUEUE, "@" + QUEUE]  # due now: the queue; due later: its timer


def test_a_non_json_encoder_puts_the_message_in_the_payload(conn, broker, actors):
    dramatiq.set_encoder(PickleEncoder())
    try:
        day = datetime.date(2026, 11, 22)
        batch = [actors.plain.message_with_options(args=(day, {i, -i}), kwargs={"when": datetime.time(i % 24)},
                                                   custom=b"\\x00\t\n") for i in range(N)]
        assert broker.enqueue_many(batch) == batch
        got = received(conn, broker)
    finally:
        dramatiq.set_encoder(JSONEncoder())
    for sent in batch:
        assert got[sent.message_id] == sent and type(got[sent.message_id].args[0]) is datetime.date
    rows = conn.execute("SELECT DISTINCT payload IS NOT NULL, args, kwargs, options FROM jobs").fetchall()
    assert rows == [(True, [], {}, {})]


LOG_ROW = ("SELECT to_jsonb(l) - 'id' - 'seq' - 'tx' - 'created_at' - 'day' FROM job_log l WHERE id = %s")


def test_a_log_batch_by_copy_writes_the_rows_one_send_and_a_small_batch_write(conn, actors, database_url):
    """A plain batch of COPY_MIN_ROWS or more streams into the log with COPY (its text
    escaped), a smaller one goes in as LOG_INSERT's arrays, one message as LOG_INSERT_ONE:
    the same rows either way, and a message sent again while its job is live is not written
    twice."""
    broker = PostgresBroker(database_url)
    try:
        plain = dramatiq.actor(actors.plain.fn, broker=broker, queue_name=QUEUE, actor_name="plain_log")
        by_copy = [plain.message_with_options(args=(i, "tab\there, newline\nthere, back\\slash \\N ✓"),
                                              kwargs={"k": [i, {"deep": "\\."}]}, max_lease_losses=i % 3 or None)
                   for i in range(N)]
        small, one_by_one = fresh_ids(by_copy)[:N - 1], fresh_ids(by_copy)
        assert broker.enqueue_many(by_copy) == by_copy
        assert broker.enqueue_many(small) == small
        for m in one_by_one:
            broker.enqueue(m)
        rows = [[scalar(conn, LOG_ROW, (m.message_id,)) for m in batch] for batch in (by_copy, small, one_by_one)]
        assert rows[0][:N - 1] == rows[1] and rows[0] == rows[2]
        assert rows[0][1]["args"][1].startswith("tab\there") and rows[0][1]["max_lease_losses"] == 1
        assert rows[0][0]["max_lease_losses"] == defaults.MAX_LEASE_LOSSES
        # sent again, with new ones: only the new ones are written
        extra = [plain.message() for _ in range(N)]
        assert broker.enqueue_many(by_copy + extra) == by_copy + extra
        assert scalar(conn, "SELECT count(*) FROM job_log") == 3 * N - 1 + N
        assert scalar(conn, "SELECT count(DISTINCT id) FROM job_log") == 3 * N - 1 + N
    finally:
        broker.close()


def test_a_log_batch_written_again_skips_every_id_the_first_write_appended(conn, database_url):
    """A batch written again on a fresh connection (sending.py) appends only what the first
    write did not, even a job that has since run and ended (LOG_SENT_IDS)."""
    from supervisor.broker import logstore

    def row(i: int) -> tuple:
        return (str(uuid.uuid4()), QUEUE, "noop", f"[{i}]", "{}", "{}", None, 0, None, 3, None)

    first = [row(i) for i in range(N)]
    with psycopg.connect(database_url) as tx:
        logstore.append(tx, first, again=False)
        tx.commit()
    # one of them ran and ended: live no more, but written all the same
    seq, day = conn.execute("SELECT seq, day FROM job_log WHERE id = %s", (first[0][0],)).fetchone()
    conn.execute("INSERT INTO job_done (seq, day, id, attempt, status, queue, actor, created_at)"
                 " VALUES (%s, %s, %s, 1, 'succeeded', %s, 'noop', now())", (seq, day, first[0][0], QUEUE))
    more = [row(i) for i in range(N, N + 3)]
    with psycopg.connect(database_url) as tx:
        logstore.append(tx, first + more, again=True)
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM job_log") == N + 3
    with psycopg.connect(database_url) as tx:  # the first try's check lets an ended job's id in again
        logstore.append(tx, first[:1], again=False)
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (first[0][0],)) == 2


@pytest.mark.parametrize("form", ["canonical", "upper", "braced"])
def test_a_log_batch_writes_a_live_id_and_an_id_repeated_in_it_once(conn, actors, database_url, form):
    """A log batch's check finds a live id whatever text form a message id has (a COPY's:
    the binary uuid[] of canonical ids, or the text array of any other), an id repeated
    within the batch is written once (its first message), in its own transaction or the
    caller's, by COPY or LOG_INSERT, and a COPY batch's rows are claimed in the order sent."""
    def shaped(job_id: str) -> str:
        return {"canonical": job_id, "upper": job_id.upper(), "braced": "{" + job_id + "}"}[form]

    broker = PostgresBroker(database_url)
    try:
        plain = dramatiq.actor(actors.plain.fn, broker=broker, queue_name=QUEUE, actor_name="plain_log")
        live = broker.enqueue(plain.message())
        batch = [dataclasses.replace(plain.message_with_options(args=(i,)), message_id=shaped(str(uuid.uuid4())))
                 for i in range(N)]
        again = [dataclasses.replace(live, message_id=shaped(live.message_id)), batch[3],
                 dataclasses.replace(batch[5], args=(-1,))]
        assert broker.enqueue_many(batch + again) == batch + again
        assert scalar(conn, "SELECT count(*) FROM job_log") == 1 + N
        assert scalar(conn, "SELECT count(DISTINCT id) FROM job_log") == 1 + N
        assert scalar(conn, "SELECT args FROM job_log WHERE id = %s", (batch[5].message_id,)) == [5]
        with psycopg.connect(database_url) as tx:  # in the caller's transaction: the same
            with broker.transaction(tx):
                assert broker.enqueue_many(again + batch[:N // 2]) == again + batch[:N // 2]
            tx.commit()
        assert scalar(conn, "SELECT count(*) FROM job_log") == 1 + N
        ordered = [r[0] for r in conn.execute("SELECT args->>0 FROM job_log WHERE id <> %s ORDER BY seq",
                                              (live.message_id,))]
        assert ordered == [str(i) for i in range(N)]  # first in, first out
        small = [plain.message_with_options(args=(i,)) for i in range(3)]  # LOG_INSERT's batch: the same
        small = [small[0], dataclasses.replace(small[0], message_id=shaped(small[0].message_id)), small[1],
                 again[0], small[2]]
        assert broker.enqueue_many(small) == small
        assert scalar(conn, "SELECT count(*) FROM job_log") == 1 + N + 3
    finally:
        broker.close()
