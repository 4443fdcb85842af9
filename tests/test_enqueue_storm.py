"""Enqueue survives a killed connection (issue 23, item 9).

A producer's ``send`` and ``enqueue_many`` on the broker's own connections are written
again on a fresh connection when the server ends theirs: while a storm of
``pg_terminate_backend`` kills the producer's sessions, every message sent exists
exactly once. Inside the caller's own transaction nothing is written again: the
server rolled the transaction back, and the caller hears of it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid

import dramatiq
import psycopg
import pytest
from dramatiq.message import Message

from supervisor.broker import PostgresBroker
from supervisor.broker.bulk import COPY_MIN_ROWS
from tests.conftest import scalar

QUEUE = "storm"
pytestmark = pytest.mark.broker(pool_size=4)
STORM_SECONDS = 3.0

# Every session of the broker's pool (its application_name), none of the test's own.
TERMINATE = """
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
  FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE 'actor-supervisor %%' AND pid <> pg_backend_pid()
"""


@pytest.fixture
def actor(broker: PostgresBroker) -> dramatiq.Actor:
    def storm_noop(*args):
        pass

    return dramatiq.actor(storm_noop, broker=broker, queue_name=QUEUE)


def batch(actor: dramatiq.Actor, size: int, keyed: bool) -> list[Message]:
    """``size`` messages, every other one with a dedupe key of its own when ``keyed``."""
    return [actor.message_with_options(args=(i,), **({"dedupe_key": f"k-{uuid.uuid4()}"} if keyed and i % 2 else {}))
            for i in range(size)]


def test_every_message_sent_under_a_terminate_storm_exists_exactly_once(conn, database_url, broker, actor,
                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="supervisor.broker.producing.sending")
    stop = threading.Event()
    killed: list[int] = []
    sent: list[str] = []
    errors: list[BaseException] = []

    def storm() -> None:
        rng = random.Random(9)
        with psycopg.connect(database_url, autocommit=True) as killer:
            while not stop.wait(rng.uniform(0.03, 0.15)):
                killed.append(scalar(killer, TERMINATE))

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                kind = rng.randrange(3)
                if kind == 0:  # one statement (INSERT_MANY)
                    out = broker.enqueue_many(batch(actor, rng.randrange(1, COPY_MIN_ROWS), rng.random() < 0.5))
                elif kind == 1:  # COPY in a transaction of its own
                    out = broker.enqueue_many(batch(actor, rng.randrange(COPY_MIN_ROWS, 150), rng.random() < 0.5))
                else:  # actor.send: one INSERT
                    out = [actor.send_with_options(args=(seed,), **(
                        {"dedupe_key": f"k-{uuid.uuid4()}"} if rng.random() < 0.5 else {}))]
                sent.extend(m.message_id for m in out)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=storm), *(threading.Thread(target=produce, args=(i,)) for i in range(3))]
    for t in threads:
        t.start()
    time.sleep(STORM_SECONDS)  # the storm's length: the injected fault's duration, not a wait for an event
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, f"a producer lost its batch: {errors[0]!r}"
    retried = [r for r in caplog.records if "writing again on a fresh connection" in r.getMessage()]
    assert sum(killed) > 0 and retried, (sum(killed), len(retried))  # the storm did hit sends
    assert len(sent) == len(set(sent)) > 0
    # every message sent is a row, once; no row that was not sent
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[])", (sent,)) == len(sent)
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s", (QUEUE,)) == len(sent)
    assert scalar(conn, "SELECT count(*) - count(DISTINCT dedupe_key) FROM jobs WHERE dedupe_key IS NOT NULL") == 0


@pytest.mark.parametrize("size", [1, COPY_MIN_ROWS])
def test_a_write_in_the_callers_transaction_is_never_written_again(conn, database_url, broker, actor, size):
    """The caller's connection dies inside its transaction: the send raises, and
    nothing of that transaction, before or at the failure, is written on another."""
    caller = psycopg.connect(database_url)  # not autocommit: the first send opens its transaction
    try:
        with broker.transaction(caller):
            broker.enqueue_many(batch(actor, size, keyed=True))
            conn.execute("SELECT pg_terminate_backend(%s)", (caller.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                broker.enqueue_many(batch(actor, size, keyed=True))
    finally:
        caller.close()
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE queue = %s", (QUEUE,)) == 0
