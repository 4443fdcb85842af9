"""Jobs whose key carries a rate limit or a daily quota live in the log (migration 054): the
claim's gate reserves each row's start from its key's bucket (a token now, else the time its
token falls due, a quota's next UTC day, a block's end), and a row reserved for later waits
in job_timers, 'waiting', holding its reservation, until its claim promotes it. The limits
hold across two worker processes, no such job gets a job_queue row, the Limits read counts
the reserved jobs, an override, a block, a cancel and a flush apply, and under a pinned
horizon the claim reads no more after many rate-limited jobs than after few."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from supervisor import admin, limits, ratelimit
from supervisor.broker.sql import flow, joblog, slots, timers
from tests.conftest import plan_buffers, scalar, wait_for
from tests.supervisor_helpers import log_producer

QUEUE = "flow"  # tests/flow_actors.py's, which the workers run
CLAIM_OWNER = "rates-host:1:aaaaaa"


def log_rows(n: int, key: str, limits_: dict[str, Any]) -> dict[str, Any]:
    """slots.LOG_INSERT_KEYED's parameters for n no-op messages of one key and its limits."""
    return {"id": [str(uuid.uuid4()) for _ in range(n)], "queue": [QUEUE] * n, "actor": ["noop"] * n,
            "args": ["[]"] * n, "kwargs": ["{}"] * n, "options": ["{}"] * n, "payload": [None] * n,
            "priority": [0] * n, "max_attempts": [None] * n, "max_lease_losses": [None] * n,
            "message_timestamp": [None] * n, "flow_key": [key] * n, "flow": [json.dumps(limits_)] * n}


def claim_params(n: int) -> dict[str, Any]:
    return {"queue": QUEUE, "n": n, "owner": CLAIM_OWNER, "lease_s": 30.0, "relaxed": False,
            "tfloor": None, "tlimit": 1000}


def claim(conn, n: int) -> list[tuple]:
    return [r for r in conn.execute(timers.LOG_CLAIM_DUE, claim_params(n)).fetchall() if r[0] is not None]


def reserved(conn, key: str) -> list[tuple[float, bool]]:
    """(seconds from now, holds its reservation) of each of the key's waiting timers, in order."""
    return [(round(r[0], 1), r[1]) for r in conn.execute(
        "SELECT extract(epoch FROM run_at - now())::float8, flow_paced FROM job_timers"
        " WHERE flow_key = %s AND status = 'waiting' ORDER BY run_at", (key,))]


def test_a_claim_runs_the_burst_and_reserves_the_rest_one_token_apart(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(5, "shop:r", {"r": 1.0, "b": 2}))
    assert len(claim(conn, 10)) == 2  # the burst runs now
    starts = [r[0] for r in conn.execute("SELECT run_at FROM job_timers WHERE flow_key = 'shop:r' ORDER BY run_at")]
    assert [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)] == [1.0, 1.0]  # a token apart
    assert 0.8 < reserved(conn, "shop:r")[0][0] <= 1.0 and all(held for _, held in reserved(conn, "shop:r"))
    # the bucket holds the debt of the starts reserved ahead
    assert scalar(conn, "SELECT round(tokens::numeric, 3) FROM rate_limiter_state WHERE key = 'shop:r'") == -3
    assert conn.execute("SELECT DISTINCT from_status, to_status, who FROM job_events").fetchall() == [
        ("pending", "waiting", "claim")]
    # each reserved job's log attempt ended 'requeued' (not counted): it is live in job_timers only
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE status = 'requeued'") == 3
    assert conn.execute("SELECT status, count(*) FROM jobs WHERE flow_key = 'shop:r' GROUP BY 1 ORDER BY 1"
                        ).fetchall() == [("running", 2), ("waiting", 3)]
    # a new job of the key is reserved after them, never before
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(1, "shop:r", {"r": 1.0, "b": 2}))
    assert claim(conn, 10) == []
    starts = [r[0] for r in conn.execute("SELECT run_at FROM job_timers WHERE flow_key = 'shop:r' ORDER BY run_at")]
    assert (starts[-1] - starts[-2]).total_seconds() == 1.0
    # promoted at its time, a reserved job runs without taking a token again
    conn.execute("UPDATE job_timers SET run_at = now() - interval '1 s' WHERE flow_key = 'shop:r'"
                 " AND run_at < now() + interval '1.5 s'")
    conn.execute("UPDATE rate_limiter_state SET start_tat = start_tat - interval '1 s' WHERE key = 'shop:r'")
    granted = scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'shop:r'")
    assert len(claim(conn, 10)) == 0  # promoted by this claim, taken by the next
    assert len(claim(conn, 10)) == 1
    assert scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'shop:r'") == granted
    # (one due before its time, as a test can make it: the key's pace of starts holds it back)
    conn.execute("UPDATE job_timers SET run_at = now() - interval '1 s' WHERE flow_key = 'shop:r'"
                 " AND run_at < now() + interval '1.5 s'")
    claim(conn, 10)
    assert claim(conn, 10) == []
    assert len(reserved(conn, "shop:r")) == 3
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0


def test_reserved_starts_promoted_late_and_together_are_spaced_again(conn) -> None:
    """A busy machine promotes reserved rows late, several due at once: the claim lets
    through what the burst allows and spaces the rest a token apart (the key's pace of
    starts, start_tat), holding their reservations, so no window sees more starts than
    burst + rate x W."""
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(6, "shop:late", {"r": 1.0, "b": 2}))
    assert len(claim(conn, 10)) == 2
    conn.execute("UPDATE job_timers SET run_at = now() WHERE flow_key = 'shop:late'")  # all four due, late
    granted = scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'shop:late'")
    claim(conn, 10)  # promotes them
    assert claim(conn, 10) == []  # the burst went to the first two: each of the four waits again
    assert all(held for _, held in reserved(conn, "shop:late"))
    starts = [r[0] for r in conn.execute("SELECT run_at FROM job_timers WHERE flow_key = 'shop:late' ORDER BY run_at")]
    assert [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)] == [1.0, 1.0, 1.0]
    # no token taken again (granted counts the tokens taken: the six first claimed)
    assert scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'shop:late'") == granted == 6
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE '%%came together, spaced%%'") == 4


def test_a_daily_quota_reserves_the_next_utc_day(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(3, "quota:q", {"q": 2}))
    assert len(claim(conn, 10)) == 2
    (run_at,) = conn.execute("SELECT run_at FROM job_timers WHERE flow_key = 'quota:q'").fetchone()
    today = datetime.now(UTC).date()
    assert run_at == datetime(today.year, today.month, today.day, tzinfo=UTC) + timedelta(days=1)
    assert "daily quota of key quota:q" in scalar(conn, "SELECT reason FROM job_events WHERE to_status = 'waiting'")
    # the next day's count goes on from there: a second job reserved for it too, a third after it
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(2, "quota:q", {"q": 2}))
    assert claim(conn, 10) == []
    days = [r[0] for r in conn.execute("SELECT run_at FROM job_timers WHERE flow_key = 'quota:q' ORDER BY run_at")]
    assert days == [run_at, run_at, run_at + timedelta(days=1)]


def test_a_block_makes_the_keys_jobs_wait_for_its_end_even_reserved_ones(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(2, "shop:b", {"r": 10.0, "b": 1}))
    assert len(claim(conn, 10)) == 1
    assert len(reserved(conn, "shop:b")) == 1
    ratelimit.block(conn, "shop:b", 60)  # upstream said 429 (as BLOCK_JOB_KEY does)
    # the reserved job comes due during the block: it waits again, for the block's end, and
    # gives its reservation up (it takes a new one then)
    conn.execute("UPDATE job_timers SET run_at = now() WHERE flow_key = 'shop:b'")
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(1, "shop:b", {"r": 10.0, "b": 1}))
    assert claim(conn, 10) == []
    assert claim(conn, 10) == []  # (the promoted row, claimed by the claim after its promotion)
    until = scalar(conn, "SELECT blocked_until FROM rate_limiter_state WHERE key = 'shop:b'")
    assert conn.execute("SELECT run_at = %s, flow_paced FROM job_timers WHERE flow_key = 'shop:b'",
                        (until,)).fetchall() == [(True, False), (True, False)]
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE '%%blocked (RateLimited)%%'") == 2


def test_a_lowered_rate_applies_to_the_reservations_after_it(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(2, "shop:o", {"r": 1.0, "b": 1}))
    assert len(claim(conn, 10)) == 1
    assert [held for _, held in reserved(conn, "shop:o")] == [True]  # 1 s on
    limits.set_override(conn, "shop:o", limits.parse({"rate": "6/m"}), "test")
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(2, "shop:o", {"r": 1.0, "b": 1}))
    assert claim(conn, 10) == []
    # (the debt of the one reserved at the old rate repaid at the new one: 20 s from the
    # first start, then 10 s apart)
    starts = [r[0] for r in conn.execute("SELECT run_at FROM job_timers WHERE flow_key = 'shop:o' ORDER BY run_at")]
    gaps = [round((b - a).total_seconds(), 1) for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps == [19.0, 10.0], gaps
    # an override that lifts the rate: the next job runs now
    limits.set_override(conn, "shop:o", limits.parse({"rate": "none"}), "test")
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(1, "shop:o", {"r": 1.0, "b": 1}))
    assert len(claim(conn, 10)) == 1


def test_a_rate_and_a_concurrency_limit_both_hold_token_first(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(3, "both", {"r": 100.0, "b": 3, "c": 1}))
    assert len(claim(conn, 10)) == 1  # three tokens, one slot: two parked holding their token
    assert scalar(conn, slots.LOG_PARKED, {"queue": QUEUE}) == 2
    assert scalar(conn, "SELECT round(tokens::numeric) FROM rate_limiter_state WHERE key = 'both'") == 0


def test_the_limits_read_counts_the_reserved_jobs_as_waiting(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(4, "shop:seen", {"r": 0.5, "b": 1}))
    assert len(claim(conn, 10)) == 1
    (seen,) = [k for k in limits.seen(conn).keys if k["key"] == "shop:seen"]
    assert (seen["queues"], seen["waiting"], seen["rate"], seen["tokens"], seen["allow"], seen["gated_by"]) == \
        ([QUEUE], 3, 0.5, 0.0, 0, "rate")
    assert 7.5 < seen["opens_in_s"] <= 8.0  # the last reserved start's token, and the next one's
    (bounded,) = [k for k in limits.seen(conn, upto=2).keys if k["key"] == "shop:seen"]
    assert (bounded["waiting"], bounded["waiting_more"]) == (2, True)


def test_a_reserved_job_cancels_and_a_flush_clears_them(conn) -> None:
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(3, "shop:c", {"r": 1.0, "b": 1}))
    assert len(claim(conn, 10)) == 1
    waiting = conn.execute("SELECT id::text FROM job_timers WHERE flow_key = 'shop:c' ORDER BY run_at").fetchall()
    assert admin.cancel_job(conn, waiting[0][0])
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (waiting[0][0],)) == "cancelled"
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s ORDER BY id",
                        (waiting[0][0],)).fetchall() == [("pending", "waiting"), ("waiting", "cancelled")]
    conn.execute(timers.TIMER_FLUSH, {"queue": QUEUE})
    conn.execute(joblog.LOG_FLUSH, {"queue": QUEUE})
    assert conn.execute("SELECT status FROM jobs_live").fetchall() == [("running",)]  # the one claimed


def test_rate_limited_jobs_run_from_the_log_across_two_workers_within_the_limit(conn, database_url,
                                                                                   workers) -> None:
    procs = [workers(queues=QUEUE, actors="tests.flow_actors", threads=2, extra_args=("--poll-interval", "60"),
                     extra_env={"SUPERVISOR_NODE_NAME": f"node-{i}"}) for i in (1, 2)]
    for p in procs:
        p.wait_ready(conn)
    jobs = 12
    with log_producer(database_url, QUEUE, {"paced": {"max_retries": 0, "rate_limit": "4/s burst 2"}}) as p:
        p.enqueue_many([p.actors["paced"].message(n) for n in range(jobs)])
        assert scalar(conn, "SELECT count(*) FROM job_queue") == 0  # appended to the log
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'paced' AND status = 'succeeded'")
             == jobs, 30, message="the paced jobs to succeed")
    at = [r[0] for r in conn.execute("SELECT claimed_at FROM jobs WHERE actor = 'paced' ORDER BY claimed_at")]
    rate, burst = 4.0, 2
    carry = min(0.5, rate * flow.CARRY_SECONDS)
    for i in range(len(at)):
        for j in range(i, len(at)):
            window = (at[j] - at[i]).total_seconds() + 0.005
            assert j - i + 1 <= burst + carry + rate * window, (i, j, window)
    span = (at[-1] - at[0]).total_seconds()
    assert (jobs - burst) / rate - 0.01 <= span <= (jobs - burst) / rate + 2.0, span  # used, no poll between
    # never a job_queue row: each ran from the log (some promoted from their reserved timer)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    assert scalar(conn, "SELECT count(*) FROM job_history") == 0
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE actor = 'paced' AND status = 'succeeded'") == jobs
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE 'rate of key paced%%'") >= jobs - burst - 1


def test_under_a_pinned_horizon_the_claim_reads_no_more_after_many_rate_limited_jobs(conn, database_url) -> None:
    """A stream of rate-limited jobs (20 keys, 1 start in 1,000 s each): each round appends 5
    jobs a key and claims; nearly all are reserved into job_timers. Under a pin the claim
    reads its window and one bucket per key, never a key's backlog: its reads stay flat as
    the reserved jobs pile up (5,000 by round 50)."""
    keys = [f"r{i}" for i in range(20)]
    reads: dict[int, int] = {}
    with psycopg.connect(database_url) as pin:
        pin.execute("SELECT txid_current()")  # vacuum and pruning remove nothing from here on
        for rnd in range(1, 51):
            for k in keys:
                conn.execute(slots.LOG_INSERT_KEYED, log_rows(5, k, {"r": 0.001, "b": 1}))
            if rnd in (10, 50):
                reads[rnd] = plan_buffers(conn, timers.LOG_CLAIM_DUE, claim_params(100))
            taken = claim(conn, 100)
            assert len(taken) == (len(keys) if rnd == 1 else 0)  # the first of each key, then none
    assert scalar(conn, "SELECT count(*) FROM job_timers WHERE status = 'waiting'") == 50 * 100 - len(keys)
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    print("claim buffers under the pin, round 10 and 50:", reads)
    assert reads[50] <= reads[10] * 1.5 + 20, reads


def test_a_weighted_key_with_a_rate_takes_its_turn_then_its_reserved_start(conn) -> None:
    # A key with a fairness weight (056) and a rate (054): the claim parks its rows for their
    # turn, the turn takes them, and the gate then runs the burst and reserves the rest a
    # token apart, as for a rate alone; promoted at its time, a reserved row takes its turn
    # again and runs without taking a token again. Nothing goes to job_queue.
    limits_ = {"w": 2, "r": 1.0, "b": 2}
    conn.execute(slots.LOG_INSERT_KEYED, log_rows(5, "tenant:wr", limits_))
    assert len(claim(conn, 10) or claim(conn, 10)) == 2
    assert [held for _, held in reserved(conn, "tenant:wr")] == [True, True, True]
    assert scalar(conn, "SELECT count(*) FROM job_queue") == 0
    granted = scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'tenant:wr'")
    conn.execute("UPDATE job_timers SET run_at = now() - interval '1 s' WHERE flow_key = 'tenant:wr'"
                 " AND run_at < now() + interval '1.5 s'")
    conn.execute("UPDATE rate_limiter_state SET start_tat = start_tat - interval '1 s' WHERE key = 'tenant:wr'")
    taken: list[tuple] = []
    for _ in range(4):  # promoted by one claim, parked for its turn and taken by the next ones
        taken += claim(conn, 10)
    assert len(taken) == 1
    assert scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'tenant:wr'") == granted
