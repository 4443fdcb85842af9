from actors import breaker
from actors.queries import sources as sources_sql
from tests.conftest import scalar, wait_for


def make_source(conn, name="shop") -> int:
    return conn.execute(sources_sql.INSERT, {
        "name": name, "search_url": "http://127.0.0.1:9/?q={query}", "format": "json",
        "rate_limit_per_minute": 60, "burst": 1, "daily_quota": None,
    }).fetchone()[0]


def test_opens_after_threshold_failures_and_recloses(conn):
    sid = make_source(conn)
    settings = breaker.BreakerSettings(threshold=3, cooldown_seconds=0.5, probe_seconds=0.5)
    for n in range(2):
        assert breaker.admit(conn, sid, settings).allowed
        assert not breaker.record_failure(conn, sid, f"HTTP 503 #{n}", settings)
    assert breaker.record_failure(conn, sid, "HTTP 503 #2", settings)

    refused = breaker.admit(conn, sid, settings)
    assert not refused.allowed and refused.reopen_at is not None
    assert 0 < refused.wait_seconds <= 0.5
    assert scalar(conn, "SELECT last_error FROM sources WHERE id = %s", (sid,)) == "HTTP 503 #2"

    # Half-open: exactly one caller gets the probe; the others are told to wait.
    probe = wait_for(lambda: breaker.admit(conn, sid, settings).probe or None, timeout=3, interval=0.05)
    assert probe
    other = breaker.admit(conn, sid, settings)
    assert not other.allowed and other.wait_seconds > 0

    breaker.record_success(conn, sid)
    assert breaker.admit(conn, sid, settings) == breaker.Admission(True)
    assert scalar(conn, "SELECT failure_streak FROM sources WHERE id = %s", (sid,)) == 0


def test_failed_probe_reopens_for_a_full_cooldown(conn):
    sid = make_source(conn)
    settings = breaker.BreakerSettings(threshold=2, cooldown_seconds=0.3, probe_seconds=5)
    breaker.record_failure(conn, sid, "timeout", settings)
    breaker.record_failure(conn, sid, "timeout", settings)
    assert wait_for(lambda: breaker.admit(conn, sid, settings).probe, timeout=3, interval=0.05)
    assert breaker.record_failure(conn, sid, "still down", settings)
    again = breaker.admit(conn, sid, settings)
    assert not again.allowed and again.wait_seconds <= 0.3


def test_a_success_resets_the_streak(conn):
    sid = make_source(conn)
    settings = breaker.BreakerSettings(threshold=3)
    breaker.record_failure(conn, sid, "x", settings)
    breaker.record_failure(conn, sid, "x", settings)
    breaker.record_success(conn, sid)
    assert not breaker.record_failure(conn, sid, "x", settings)
    assert breaker.admit(conn, sid, settings).allowed
