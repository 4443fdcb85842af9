"""A job with a dedupe key and a concurrency key (a web app's "one sync per account at a
time, once per request") lives in the log with both (migrations 052 and 053): its send takes
the dedupe key in job_keys, its claim a slot of its concurrency key; a duplicate while it is
live returns it; the limit holds across two worker processes; nothing goes to job_queue."""

from __future__ import annotations

import pytest

from tests.conftest import scalar
from tests.test_log_concurrency import ended, fleet, most_at_once, producer, runs, settled


@pytest.mark.parametrize("batch", [1, 8, 40], ids=["single", "small batch", "copy"])
def test_jobs_with_both_keys_live_in_the_log_and_keep_both_promises(conn, database_url, workers, batch) -> None:
    jobs = [(f"acct-{n % 2}", n, f"once:{n}") for n in range(40)]
    with producer(database_url) as p:
        actor = p.actors["one_at_a_time"]
        messages = [actor.message_with_options(kwargs={"account": a, "n": n, "sleep_s": 0.01}, dedupe_key=k)
                    for a, n, k in jobs]
        sent = []
        for i in range(0, len(messages), batch):
            part = messages[i:i + batch]
            sent += [p.enqueue(part[0])] if batch == 1 else p.enqueue_many(part)
        assert [m.message_id for m in sent] == [m.message_id for m in messages]
        # a duplicate of a live job's key returns that job and writes nothing
        again = p.enqueue(actor.message_with_options(kwargs={"account": "acct-0", "n": 99}, dedupe_key="once:0"))
        assert again.message_id == messages[0].message_id
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE dedupe_key IS NOT NULL AND flow_key IS NOT NULL") == 40
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE dedupe_key LIKE 'once:%%' AND concurrency_key LIKE 'acct:%%'"
                        " AND status = 'pending'") == 40
    fleet(workers, conn)
    ended(conn, 40)
    for account in ("acct-0", "acct-1"):
        spans = runs(conn, account)
        assert sorted(n for n, _, _ in spans) == [n for a, n, _ in jobs if a == account]  # each once
        assert most_at_once([(s, e) for _, s, e in spans]) == 1
    settled(conn)
    # a parked job's wait is written as every move is: parked by a claim, handed a slot
    moves = conn.execute("SELECT job_id, array_agg(from_status || ' > ' || to_status ORDER BY id) FROM job_events"
                         " WHERE 'waiting' IN (from_status, to_status) GROUP BY 1").fetchall()
    assert moves and all(m == ["pending > waiting", "waiting > pending"] for _, m in moves), moves
    assert scalar(conn, "SELECT reason FROM job_events WHERE to_status = 'waiting' LIMIT 1").startswith(
        "concurrency key acct:acct-")
    # the keys are free once their jobs ended: the same key sends a new job
    with producer(database_url) as p:
        actor = p.actors["one_at_a_time"]
        fresh = p.enqueue(actor.message_with_options(kwargs={"account": "acct-0", "n": 100}, dedupe_key="once:0"))
    assert fresh.message_id != messages[0].message_id
    ended(conn, 41)


def test_a_delayed_keyed_job_waits_in_job_timers_and_is_gated_once_due(conn, database_url, workers) -> None:
    # Sent with a delay, a concurrency-keyed job (with or without a dedupe key) waits in
    # job_timers with its key and limits, never in job_queue; the claim that promotes it
    # gates it as any keyed row of the log: one of the key at a time.
    with producer(database_url) as p:
        actor = p.actors["one_at_a_time"]
        for n in range(3):
            p.enqueue(actor.message_with_options(kwargs={"account": "acct-d", "n": n, "sleep_s": 0.1}), delay=300)
        p.enqueue_many([actor.message_with_options(kwargs={"account": "acct-d", "n": 3 + n, "sleep_s": 0.1},
                                                   dedupe_key=f"later:{n}") for n in range(2)], delay=300)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT count(*) FROM job_timers WHERE flow_key = 'acct:acct-d'") == 5
    assert scalar(conn, "SELECT count(*) FROM job_timers WHERE dedupe_key LIKE 'later:%%'") == 2
    fleet(workers, conn)
    ended(conn, 5)
    spans = runs(conn, "acct-d")
    assert sorted(n for n, _, _ in spans) == [0, 1, 2, 3, 4]
    assert most_at_once([(s, e) for _, s, e in spans]) == 1
    settled(conn)
