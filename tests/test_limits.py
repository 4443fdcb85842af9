"""Limits seen and steered (issue 22, item 6) on the real database: an operator's override
replaces a key's limits at the next claim (rate, burst, quota, concurrency; null lifts
one; clearing restores the jobs' own), take() obeys it too, and every key in use is read
as the claim sees it (waiting jobs with no bucket yet included, bounded)."""

from __future__ import annotations

import json

import psycopg
import pytest

from supervisor import limits, ratelimit
from tests.conftest import cli, scalar
from tests.test_flow_claim import QUEUE, add, claim, meta_of


def keys_taken(conn, n: int) -> list[str]:
    with conn.transaction():
        took, _ = claim(conn, n)
    return [k for k, _ in took]


def override(conn, key: str, **values) -> dict:
    return limits.set_override(conn, key, limits.parse(values), "test")


def test_an_override_lowers_a_keys_rate_and_burst_at_the_next_claim_and_clearing_restores_them(conn):
    add(conn, "shop", 30, limits={"r": 100.0, "b": 10})
    assert len(keys_taken(conn, 4)) == 4  # the jobs' own burst: 10
    override(conn, "shop", rate="1/m burst 2")
    # The bucket held 6 tokens: the override's burst caps them at 2, and its rate refills none.
    assert len(keys_taken(conn, 8)) == 2
    assert keys_taken(conn, 8) == []
    conn.execute("UPDATE rate_limiter_state SET updated_at = updated_at - interval '30 seconds'")
    assert keys_taken(conn, 8) == []  # half a token at 1/m
    conn.execute("UPDATE rate_limiter_state SET updated_at = updated_at - interval '30 seconds'")
    assert len(keys_taken(conn, 8)) == 1
    assert scalar(conn, "SELECT (burst, rate_per_second)::text FROM rate_limiter_state WHERE key = 'shop'") \
        == f"(2,{1 / 60})"
    assert limits.clear_override(conn, "shop", "test") == {"rate": 1 / 60, "burst": 2}
    conn.execute("UPDATE rate_limiter_state SET updated_at = updated_at - interval '1 second'")
    assert len(keys_taken(conn, 20)) == 10  # 100/s again, up to the jobs' burst of 10
    assert limits.clear_override(conn, "shop", "test") is None  # none left


def test_an_override_of_concurrency_raises_lifts_and_lowers_the_running_limit(conn):
    add(conn, "tenant", 10, limits={"c": 1})
    assert len(keys_taken(conn, 8)) == 1
    override(conn, "tenant", concurrency=3)
    assert len(keys_taken(conn, 8)) == 2  # 3 running now
    assert keys_taken(conn, 8) == []
    override(conn, "tenant", concurrency=None)  # lifted: no slot is taken
    assert len(keys_taken(conn, 4)) == 4
    override(conn, "tenant", concurrency="1")
    conn.execute("DELETE FROM job_queue WHERE id IN (SELECT job_id FROM job_concurrency WHERE key = 'tenant')")
    # (the 3 with slots ended: their slots are free)
    assert len(keys_taken(conn, 8)) == 1  # 1 slot; the 4 unslotted ones run on, as jobs do
    limits.clear_override(conn, "tenant", "test")
    assert len(keys_taken(conn, 8)) == 0  # the jobs' own limit of 1: its slot is taken


def test_an_override_set_before_any_job_applies_to_the_first_claim_and_a_quota_to_the_day(conn):
    override(conn, "new", burst=2, daily_quota=3)
    assert scalar(conn, "SELECT tokens FROM rate_limiter_state WHERE key = 'new'") is None  # full, whatever the burst
    add(conn, "new", 10, limits={"r": 1000.0, "b": 50})
    assert len(keys_taken(conn, 8)) == 2
    conn.execute("UPDATE rate_limiter_state SET updated_at = updated_at - interval '1 second'")
    assert len(keys_taken(conn, 8)) == 1  # the quota's third
    conn.execute("UPDATE rate_limiter_state SET updated_at = updated_at - interval '1 second'")
    with conn.transaction():
        took, meta = claim(conn, 8)
    assert took == [] and meta_of(meta)[0] > 0  # until the next UTC day
    found = limits.seen(conn).keys[0]
    assert (found["key"], found["gated_by"], found["quota_used"], found["quota"]) == ("new", "quota", 3, 3)


def test_take_obeys_an_override_too(conn):
    limit = ratelimit.Limit(per_minute=6000, burst=10)
    assert ratelimit.take(conn, "api", limit).granted
    override(conn, "api", rate="1/h burst 1")
    first, second = ratelimit.take(conn, "api", limit), ratelimit.take(conn, "api", limit)
    assert first.granted and not second.granted and second.reason == "rate" and second.wait_seconds > 3000


@pytest.mark.parametrize(("values", "message"), [
    ({"rate": "ten per minute"}, "rate 'ten per minute': not a rate: write N/s"),
    ({"rate": "0/s"}, "rate '0/s': the rate must be above 0"),
    ({"burst": 0}, "burst: expected a whole number >= 1, got 0"),
    ({"burst": None}, "burst: give a whole number >= 1 (a burst cannot be lifted)"),
    ({"concurrency": "2.5"}, "concurrency: expected a whole number >= 1 or none, got '2.5'"),
    ({"daily_quota": -1}, "daily_quota: expected a whole number >= 0 or none, got -1"),
    ({"rate": "2/s burst 3", "burst": 4}, "burst: given twice"),
    ({"speed": 3}, "unknown field(s) speed"),
    ({}, "give at least one of rate, burst, daily_quota, concurrency"),
])
def test_a_bad_value_is_one_line_naming_it(values, message):
    with pytest.raises(limits.LimitValueError) as caught:
        limits.parse(values)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_every_key_in_use_is_read_as_the_claim_sees_it_bounded(conn):
    add(conn, "a:waits", 5, limits={"r": 1.0, "b": 2})  # no bucket yet
    add(conn, "b:slots", 3, limits={"c": 1})
    add(conn, "c:later", 2, limits={"c": 2}, delay_s=600)
    ratelimit.block(conn, "d:blocked", 60)  # a bucket no job names
    conn.execute("UPDATE job_queue SET run_at = now() - interval '90 seconds' WHERE flow_key = 'a:waits'")
    seen = {k["key"]: k for k in limits.seen(conn).keys}
    assert list(seen) == ["a:waits", "b:slots", "c:later", "d:blocked"]
    a = seen["a:waits"]
    assert (a["queues"], a["waiting"], a["rate"], a["burst"], a["tokens"], a["allow"], a["gated_by"]) == \
        ([QUEUE], 5, 1.0, 2.0, 2.0, 2, None)
    assert 89 < a["wait_s"] < 120
    assert seen["c:later"]["wait_s"] is None and seen["c:later"]["waiting"] == 2  # none due yet
    assert seen["d:blocked"]["gated_by"] == "blocked" and seen["d:blocked"]["waiting"] == 0
    keys_taken(conn, 8)
    seen = {k["key"]: k for k in limits.seen(conn, upto=2).keys}
    assert (seen["a:waits"]["waiting"], seen["a:waits"]["waiting_more"], seen["a:waits"]["gated_by"]) == (2, True, "rate")
    assert 0 < seen["a:waits"]["opens_in_s"] <= 1
    assert (seen["b:slots"]["running"], seen["b:slots"]["concurrency"], seen["b:slots"]["gated_by"]) == \
        (1, 1, "concurrency")
    # A page of keys, and the next one after it.
    first = limits.seen(conn, max_keys=2)
    assert [k["key"] for k in first.keys] == ["a:waits", "b:slots"] and first.next_after == "b:slots"
    rest = limits.seen(conn, after=first.next_after, max_keys=2)
    assert [k["key"] for k in rest.keys] == ["c:later", "d:blocked"] and rest.next_after is None


def test_a_change_wakes_the_queues_whose_jobs_wait_on_the_key(conn, database_url):
    add(conn, "woken", 1, limits={"c": 1})
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN actor_supervisor_jobs")
        override(conn, "woken", concurrency=2)
        override(conn, "idle", concurrency=2)  # no job waits on it: no one is woken
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert got == [f"+{QUEUE}"]


def test_the_cli_sets_lists_and_clears_with_json_and_audits(conn, database_url):
    add(conn, "cli:key", 2, limits={"r": 5.0, "b": 1})
    done = cli("limits", "set", "cli:key", "--rate", "10/m", "--concurrency", "2", "--json", url=database_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["override"] == {"rate": 10 / 60, "concurrency": 2}
    listed = json.loads(cli("limits", "list", "--json", url=database_url).stdout)
    key = next(k for k in listed["keys"] if k["key"] == "cli:key")
    assert (key["rate"], key["concurrency"], key["waiting"], key["override"]["concurrency"]) == (10 / 60, 2, 2, 2)
    table = cli("limits", url=database_url).stdout
    assert "cli:key" in table and "10/m" in table
    bad = cli("limits", "set", "cli:key", "--rate", "fast", url=database_url)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "rate 'fast': not a rate" in bad.stderr
    cleared = cli("limits", "clear", "cli:key", "--json", url=database_url)
    assert json.loads(cleared.stdout) == {"key": "cli:key", "cleared": True,
                                          "previous": {"rate": 10 / 60, "concurrency": 2}}
    audited = conn.execute("SELECT action, target, detail->'override', client FROM audit_log ORDER BY id").fetchall()
    assert [a[:3] for a in audited] == [("limits.set", "limit cli:key", {"rate": 10 / 60, "concurrency": 2}),
                                         ("limits.clear", "limit cli:key", None)]
    assert audited[0][3].startswith("operator ")


def test_the_read_of_the_keys_is_bounded_however_many_jobs_wait(conn):
    """Each key's waiting rows are read up to ``upto`` (the page says "at least"), so 3 keys
    of 3,000 waiting jobs each read about 3 x upto rows of job_queue, not 9,000."""
    from bench.dashboard_reads import rows_read_at_scale

    for key in ("k1", "k2", "k3"):
        add(conn, key, 3_000, limits={"r": 1.0, "b": 1})
    conn.execute("ANALYZE job_queue")
    params = {"after": "", "max_keys": limits.MAX_KEYS, "upto": 100, "n": 1_000_000}
    read = rows_read_at_scale(conn, limits.sql.LIMITS, params, ("job_queue",))["job_queue"]  # as at 10 M rows
    assert read < 3 * 100 + 50, read
    seen = limits.seen(conn, upto=100).keys
    assert [(k["key"], k["waiting"], k["waiting_more"]) for k in seen] == [(k, 100, True) for k in ("k1", "k2", "k3")]
