"""Scraping: parsing, dedupe keys, persistence, retries, breaker deferral, and each
source's limits as the runtime's flow control (a scrape waits in the database)."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import date

import pytest
from werkzeug import Response

from actors import dedupe, parsing
from supervisor import limits
from tests.conftest import scalar, wait_for
from tests.pipeline_helpers import (
    make_source,
    make_watch,
    running_worker,
)

ITEMS = [
    {"id": "A1", "title": "Corsair Vengeance 32GB (2x16GB) DDR4 3200MHz", "price": "$89.99",
     "url": "/item/A1?ref=search", "condition": "New"},
    {"id": "A2", "title": "G.Skill Ripjaws 32GB DDR4-3200 kit", "price": 94.5, "url": "/item/A2"},
    {"id": "A3", "title": "Kingston Fury 32GB DDR4 3200", "price": {"value": 99, "currency": "USD"},
     "type": "sold"},
]

HTML_PAGE = """<html><body><ul>
<li class="listing" data-listing-id="H1"><a href="/p/H1"><span class="title">EVGA RTX 3080 Ti FTW3</span></a>
  <span class="price">$1,049.00</span><p class="condition">Used</p></li>
<li class="listing" data-listing-id="H2"><a href="https://shop.example/p/H2">
  <h3 class="title">ASUS TUF  RTX 3080  <b>OC</b></h3></a><div class="price">US $899.50</div></li>
</ul></body></html>"""


# --- parsing and dedupe keys (no database) ------------------------------------------


def test_json_listings_in_any_common_shape():
    for body in (ITEMS, {"items": ITEMS}, {"results": ITEMS}):
        got = parsing.parse(json.dumps(body), content_type="application/json", base_url="http://shop.example/s")
        assert [(x.external_id, x.price_cents, x.price_type) for x in got] == [
            ("A1", 8999, "ask"), ("A2", 9450, "ask"), ("A3", 9900, "sold")]
    assert got[0].url == "http://shop.example/item/A1?ref=search"
    assert got[0].condition == "New"


def test_html_listing_layout():
    got = parsing.parse(HTML_PAGE, content_type="text/html; charset=utf-8", base_url="http://shop.example/s")
    assert [(x.external_id, x.title, x.price_cents, x.url) for x in got] == [
        ("H1", "EVGA RTX 3080 Ti FTW3", 104900, "http://shop.example/p/H1"),
        ("H2", "ASUS TUF RTX 3080 OC", 89950, "https://shop.example/p/H2"),
    ]
    assert got[0].condition == "Used"
    assert parsing.parse('<div class="no-results">Nothing found</div>', content_type="text/html") == []


@pytest.mark.parametrize("body, ctype, fragment", [
    ("{not json", "application/json", "not valid JSON"),
    ('{"error": "nope"}', "application/json", "no list of listings"),
    ('[{"title": "no price"}]', "application/json", "none of 1 listings could be read"),
    ("<html><body><p>Please solve this captcha</p></body></html>", "text/html", "layout may have changed"),
])
def test_unreadable_pages_are_parse_errors(body, ctype, fragment):
    with pytest.raises(parsing.ParseError, match=fragment):
        parsing.parse(body, content_type=ctype)


@pytest.mark.parametrize("text, cents", [
    ("$1,299.99", 129999), ("12", 1200), ("EUR 5,5", 550), ("1 299,00 €", 129900), (12.5, 1250), (0.1, 10),
])
def test_prices_to_cents(text, cents):
    assert parsing.price_to_cents(text) == cents


def test_dedupe_keys():
    day = date(2026, 3, 1)
    assert dedupe.dedupe_key(external_id="123", url="x", title="t", price_cents=1, day=day,
                             price_type="ask") == "ext_123"
    key = dedupe.dedupe_key(external_id=None, url="HTTPS://Shop.Example/item/9/?utm=1#top",
                            title="  Corsair   32GB\tDDR4 ", price_cents=8999, day=day, price_type="ask")
    material = "https://shop.example/item/9|corsair 32gb ddr4|8999|2026-03-01|ask"
    assert key == "hash_" + hashlib.sha256(material.encode()).hexdigest()[:16]
    # Same offer, cosmetic differences: same key. Another day, price or type: another key.
    same = dedupe.dedupe_key(external_id=None, url="https://shop.example/item/9?x=2", title="corsair 32gb ddr4",
                             price_cents=8999, day=day, price_type="ask")
    assert same == key
    for change in ({"price_cents": 8998}, {"day": date(2026, 3, 2)}, {"price_type": "sold"}):
        args = {"external_id": None, "url": "https://shop.example/item/9", "title": "corsair 32gb ddr4",
                "price_cents": 8999, "day": day, "price_type": "ask", **change}
        assert dedupe.dedupe_key(**args) != key


def test_match_strength():
    assert dedupe.match_strength("ddr4 32gb", "Corsair 32GB DDR4 3200") == 1.0
    assert dedupe.match_strength("ddr4 32gb", "Corsair 32 GB DDR4") == 1.0
    assert dedupe.match_strength("ddr4 32gb 3600", "Corsair 16GB DDR4 3200") == pytest.approx(1 / 3, abs=1e-3)


# --- the actor against a local marketplace ------------------------------------------------


@pytest.fixture
def shop(conn, httpserver):
    """A JSON source and a watch on it; tests set what the search page answers."""
    url = httpserver.url_for("/search") + "?q={query}"
    source_id = make_source(conn, "shop", url)
    watch_id = make_watch(conn, source_id, "ddr4 32gb")
    return source_id, watch_id


def wait_job(conn, job_id, *states, timeout=20):
    wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,)) in states, timeout,
             message=f"job {job_id} in {states}")
    return scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,))


def test_scrape_stores_listings_points_and_chains_extractions(conn, pipeline_broker, pipeline_config, httpserver,
                                                             shop):
    from actors.scraping import send_scrape

    source_id, watch_id = shop
    seen_agents = []

    def page(request):
        seen_agents.append(request.headers.get("User-Agent"))
        return Response(json.dumps({"items": ITEMS}), content_type="application/json")

    httpserver.expect_request("/search", query_string={"q": "ddr4 32gb"}).respond_with_handler(page)
    pipeline_config["http"] = {"user_agent": "price-test/1.0"}
    with running_worker(pipeline_broker, queues=["scraping"]):
        first = send_scrape(watch_id)
        assert wait_job(conn, first.message_id, "succeeded", "failed") == "succeeded"
        assert scalar(conn, "SELECT count(*) FROM listings") == 3
        assert scalar(conn, "SELECT count(*) FROM price_points") == 3
        assert scalar(conn, "SELECT array_agg(dedupe_key ORDER BY dedupe_key) FROM price_points") == [
            "ext_A1", "ext_A2", "ext_A3"]
        assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'extract_listing' AND status = 'pending'") == 3
        assert scalar(conn, "SELECT last_polled_at IS NOT NULL FROM watches WHERE id = %s", (watch_id,))
        assert seen_agents == ["price-test/1.0"]

        # Re-scraping the same page adds no price points, no listings, no extraction jobs.
        second = send_scrape(watch_id)
        assert wait_job(conn, second.message_id, "succeeded", "failed") == "succeeded"
    assert scalar(conn, "SELECT count(*) FROM listings") == 3
    assert scalar(conn, "SELECT count(*) FROM price_points") == 3
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'extract_listing'") == 3


def test_rescraping_listings_without_ids_adds_nothing(conn, pipeline_broker, pipeline_config, httpserver, shop):
    from actors.scraping import run_scrape

    _, watch_id = shop
    anonymous = [{k: v for k, v in item.items() if k != "id"} for item in ITEMS]
    httpserver.expect_request("/search").respond_with_json(anonymous)
    first = run_scrape(watch_id)
    again = run_scrape(watch_id)
    assert (first["new_price_points"], again["new_price_points"]) == (3, 0)
    keys = [r[0] for r in conn.execute("SELECT dedupe_key FROM price_points")]
    assert len(keys) == 3 and all(k.startswith("hash_") and len(k) == 21 for k in keys)


def test_a_stronger_match_replaces_a_weaker_price_point(conn, pipeline_broker, shop):
    from actors.queries import pipeline as sql

    source_id, watch_id = shop
    row = {"watch_id": watch_id, "source_id": source_id, "listing_id": None, "dedupe_key": "ext_Z",
           "price_cents": 100, "currency": "USD", "price_type": "ask", "observed_on": date.today()}
    assert conn.execute(sql.UPSERT_PRICE_POINT, {**row, "match_strength": 0.5}).fetchone()[1] is True
    assert conn.execute(sql.UPSERT_PRICE_POINT, {**row, "match_strength": 0.4, "price_cents": 1}).fetchone() is None
    replaced = conn.execute(sql.UPSERT_PRICE_POINT, {**row, "match_strength": 0.9, "price_cents": 90}).fetchone()
    assert replaced is not None and replaced[1] is False
    assert conn.execute("SELECT count(*), max(price_cents), max(match_strength) FROM price_points").fetchone() == (
        1, 90, pytest.approx(0.9))


def test_html_source(conn, pipeline_broker, httpserver):
    from actors.scraping import run_scrape

    source_id = make_source(conn, "html-shop", httpserver.url_for("/s") + "?q={query}", fmt="html")
    watch_id = make_watch(conn, source_id, "rtx 3080")
    httpserver.expect_request("/s").respond_with_data(HTML_PAGE, content_type="text/html")
    assert run_scrape(watch_id)["new_price_points"] == 2
    assert sorted(r[0] for r in conn.execute("SELECT external_id FROM listings")) == ["H1", "H2"]


@pytest.mark.parametrize("status, body, fragment", [
    (404, "gone", "HTTP 404"),
    (200, "<html><body>maintenance</body></html>", "layout may have changed"),
])
def test_permanent_errors_fail_at_once_with_a_clear_error(conn, pipeline_broker, httpserver, shop, status, body,
                                                          fragment):
    from actors.scraping import send_scrape

    _, watch_id = shop
    httpserver.expect_request("/search").respond_with_data(body, status=status, content_type="text/html")
    with running_worker(pipeline_broker, queues=["scraping"]):
        msg = send_scrape(watch_id)
        assert wait_job(conn, msg.message_id, "failed", "succeeded", "retryable") == "failed"
    attempts, error = conn.execute("SELECT attempts, last_error FROM jobs WHERE id = %s",
                                   (msg.message_id,)).fetchone()
    assert attempts == 1 and "PermanentScrapeError" in error and fragment in error
    assert scalar(conn, "SELECT failure_streak FROM sources") == 0  # the source itself is fine


def went_back(conn, job_id, timeout=20) -> str:
    """The reason of the job's first return from running to waiting (a retry, RateLimited):
    a job with limits waits for its key again rather than going 'retryable'."""
    row = wait_for(lambda: conn.execute("SELECT reason FROM job_events WHERE job_id = %s AND from_status = 'running'"
                                        " AND to_status = 'waiting' ORDER BY at LIMIT 1", (job_id,)).fetchone(),
                   timeout, message=f"job {job_id} back to waiting")
    return row[0]


def test_server_errors_and_timeouts_retry_with_backoff(conn, pipeline_broker, pipeline_config, httpserver, shop):
    from actors.scraping import send_scrape

    _, watch_id = shop
    pipeline_config["http"] = {"timeout": 0.3}

    answer = threading.Event()

    def slow(request):
        # Answers only after the client gave up, and before the test ends: a handler
        # still running would log its request into the next test's server log.
        answer.wait(30)
        return Response("[]", content_type="application/json")

    httpserver.expect_request("/search").respond_with_data("busy", status=503)
    with running_worker(pipeline_broker, queues=["scraping"]):
        msg = send_scrape(watch_id)
        went_back(conn, msg.message_id)
        httpserver.clear()
        httpserver.expect_request("/search").respond_with_handler(slow)
        timed_out = send_scrape(watch_id, dedupe_key="t")
        went_back(conn, timed_out.message_id)
        answer.set()
        wait_for(lambda: httpserver.log, timeout=10, message="the slow handler to answer")
    status, attempts, delay, error = conn.execute(
        "SELECT status, attempts, extract(epoch FROM run_at - now()), last_error FROM jobs WHERE id = %s",
        (msg.message_id,)).fetchone()
    # a retry spends an attempt, and waits for its backoff, then for its source's token
    assert (status, attempts) == ("waiting", 1) and 2 < delay <= 5 and "HTTP 503" in error  # first backoff: 5 s
    assert "ReadTimeout" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (timed_out.message_id,))
    assert scalar(conn, "SELECT failure_streak FROM sources") == 2


def test_a_429_blocks_the_source_fleet_wide_and_the_job_spends_no_retry(conn, pipeline_broker, httpserver, shop):
    """Upstream says slow down: the source's key is blocked for its Retry-After, the job
    waits for it (its attempt given back), another source's scrapes go on meanwhile, and
    the job runs again once the block ends."""
    from actors.scraping import send_scrape

    source_id, watch_id = shop
    other_watch = make_watch(conn, make_source(conn, "other", httpserver.url_for("/other") + "?q={query}"), "ssd")
    told = []

    def page(request):  # the first request hears "slow down", the rest get the page
        if not told:
            told.append(request)
            return Response("slow down", status=429, headers={"Retry-After": "2"})
        return Response(json.dumps(ITEMS), content_type="application/json")

    httpserver.expect_request("/search").respond_with_handler(page)
    httpserver.expect_request("/other").respond_with_json([])
    with running_worker(pipeline_broker, queues=["scraping"], threads=1):
        msg = send_scrape(watch_id)
        reason = went_back(conn, msg.message_id)
        status, attempts, retries = conn.execute(
            "SELECT status, attempts, options->'retries' FROM jobs WHERE id = %s", (msg.message_id,)).fetchone()
        blocked = scalar(conn, "SELECT extract(epoch FROM blocked_until - now()) FROM rate_limiter_state"
                               " WHERE key = %s", (f"source:{source_id}",))
        assert "rate limited upstream" in reason and (status, attempts, retries) == ("waiting", 0, None) and 1 < blocked <= 2
        other = send_scrape(other_watch)  # another source: not held up by the block
        assert wait_job(conn, other.message_id, "succeeded", "failed") == "succeeded"
        assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (msg.message_id,)) == "waiting"
        assert wait_job(conn, msg.message_id, "succeeded", "failed") == "succeeded"
    attempts, started, blocked_until = conn.execute(
        "SELECT j.attempts, j.claimed_at, s.blocked_until FROM jobs j, rate_limiter_state s"
        " WHERE j.id = %s AND s.key = %s", (msg.message_id, f"source:{source_id}")).fetchone()
    assert attempts == 1 and started >= blocked_until  # one attempt counted: the block spent none
    assert scalar(conn, "SELECT count(*) FROM listings WHERE source_id = %s", (source_id,)) == 3


def test_breaker_opens_defers_and_recloses(conn, pipeline_broker, pipeline_config, httpserver, shop):
    """Two failures open the breaker; the retry that follows is deferred (a fresh
    delayed job, no attempt spent) until the cooldown ends; then it probes, the
    source answers, and the breaker closes."""
    from actors.scraping import send_scrape

    source_id, watch_id = shop
    # A cooldown longer than the gap between two attempts: the third finds the source paused
    # (a retry of a job with limits waits for its key again, and may start up to 2 s late;
    # on a loaded 2-core run it started 4 s late, after a 3 s cooldown had ended).
    pipeline_config["breaker"] = {"threshold": 2, "cooldown": 8}
    state = {"up": False}

    def page(request):
        if not state["up"]:
            return Response("down", status=502)
        return Response(json.dumps(ITEMS), content_type="application/json")

    httpserver.expect_request("/search").respond_with_handler(page)
    with running_worker(pipeline_broker, queues=["scraping"]):
        msg = send_scrape(watch_id, min_backoff=200, max_backoff=200)
        wait_for(lambda: scalar(conn, "SELECT paused_until > now() FROM sources WHERE id = %s", (source_id,)),
                 timeout=15, message="breaker to open")
        # The third attempt found the source paused: it ended and left a deferred copy,
        # which keeps the source's limits.
        # the pause read with the copy: once the copy is due it probes, and a slow machine
        # may let it fail and pause the source again before a later read
        deferred = wait_for(lambda: conn.execute(
            "SELECT j.id, j.run_at, j.attempts, j.flow_key, s.paused_until FROM jobs j, sources s"
            " WHERE j.options ? 'deferred_because' AND s.id = %s", (source_id,)).fetchone(),
            timeout=10)
        assert wait_job(conn, msg.message_id, "succeeded", "failed") == "succeeded"
        assert scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (msg.message_id,)) == 3
        assert deferred[1] >= deferred[4] and deferred[2] == 0 and deferred[3] == f"source:{source_id}"
        state["up"] = True
        assert wait_job(conn, deferred[0], "succeeded", "failed", timeout=15) == "succeeded"
    assert conn.execute("SELECT failure_streak, paused_until FROM sources").fetchone() == (0, None)
    assert scalar(conn, "SELECT count(*) FROM listings") == 3


def test_a_scrape_over_its_sources_rate_waits_in_the_database_holding_no_thread(
        conn, pipeline_broker, pipeline_config, httpserver):
    """A source at 20 a minute (one token every 3 s), one worker thread: the second scrape
    of the source waits as a 'waiting' row, never claimed, while another source's scrape
    takes the one thread; it starts when the source's next token is due."""
    from actors.scraping import send_scrape

    source_id = make_source(conn, "slow-shop", httpserver.url_for("/search") + "?q={query}", per_minute=20, burst=1)
    first_watch, second_watch = (make_watch(conn, source_id, f"ddr4 {n}") for n in range(2))
    fast_watch = make_watch(conn, make_source(conn, "fast-shop", httpserver.url_for("/fast") + "?q={query}"), "ssd")
    httpserver.expect_request("/search").respond_with_json([])
    httpserver.expect_request("/fast").respond_with_json([])
    with running_worker(pipeline_broker, queues=["scraping"], threads=1):
        first, second = send_scrape(first_watch), send_scrape(second_watch)
        assert wait_job(conn, first.message_id, "succeeded", "failed") == "succeeded"
        fast = send_scrape(fast_watch)
        assert wait_job(conn, fast.message_id, "succeeded", "failed") == "succeeded"
        # the thread ran the other source's scrape: the waiting one held nothing
        assert conn.execute("SELECT status, attempts, claimed_at, lease_owner, flow_key FROM jobs WHERE id = %s",
                            (second.message_id,)).fetchone() == ("waiting", 0, None, None, f"source:{source_id}")
        assert wait_job(conn, second.message_id, "succeeded", "failed") == "succeeded"
    starts = [scalar(conn, "SELECT claimed_at FROM jobs WHERE id = %s", (m.message_id,)) for m in (first, second)]
    assert (starts[1] - starts[0]).total_seconds() >= 2.9  # the next token: 3 s after the first
    assert len(httpserver.log) == 3
    assert scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = %s", (f"source:{source_id}",)) == 2


def test_a_sources_daily_quota_holds(conn, pipeline_broker, httpserver):
    from actors.scraping import send_scrape

    source_id = make_source(conn, "quota-shop", httpserver.url_for("/search") + "?q={query}", daily_quota=2)
    watches = [make_watch(conn, source_id, f"ddr4 {n}") for n in range(3)]
    fast_watch = make_watch(conn, make_source(conn, "fast-shop", httpserver.url_for("/fast") + "?q={query}"), "ssd")
    httpserver.expect_request("/search").respond_with_json([])
    httpserver.expect_request("/fast").respond_with_json([])
    with running_worker(pipeline_broker, queues=["scraping"], threads=2):
        sent = [send_scrape(w) for w in watches]
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'scrape_watch'"
                                      " AND status = 'succeeded'") == 2, timeout=20, message="two scrapes")
        later = send_scrape(fast_watch)  # claimed after them: the claims went on past the third
        assert wait_job(conn, later.message_id, "succeeded", "failed") == "succeeded"
        states = sorted(scalar(conn, "SELECT status FROM jobs WHERE id = %s", (m.message_id,)) for m in sent)
    assert states == ["succeeded", "succeeded", "waiting"]
    (seen,) = [k for k in limits.seen(conn).keys if k["key"] == f"source:{source_id}"]
    assert (seen["quota_used"], seen["quota"]) == (2, 2)  # today's (the log reserves the third for tomorrow: 054)
    assert sum(1 for request, _ in httpserver.log if request.path == "/search") == 2


def test_the_bucket_the_in_job_limiter_left_holds_for_the_scrapes(conn, pipeline_broker, httpserver):
    """One table of buckets: what supervisor.ratelimit took from a source's row (the
    tracker's limiter before flow control, or any caller now) the claim finds there."""
    from actors.scraping import limiter_key, send_scrape
    from supervisor import ratelimit

    source_id = make_source(conn, "shop", httpserver.url_for("/search") + "?q={query}", per_minute=30, burst=1,
                            daily_quota=2)
    watches = [make_watch(conn, source_id, f"ddr4 {n}") for n in range(2)]
    httpserver.expect_request("/search").respond_with_json([])
    limit = ratelimit.Limit(per_minute=30, burst=1, daily_quota=2)
    assert ratelimit.take(conn, limiter_key(source_id), limit).granted  # the bucket is empty now
    taken_at = scalar(conn, "SELECT updated_at FROM rate_limiter_state WHERE key = %s", (limiter_key(source_id),))
    with running_worker(pipeline_broker, queues=["scraping"]):
        first, second = (send_scrape(w) for w in watches)
        assert wait_job(conn, first.message_id, "succeeded", "failed") == "succeeded"
        claimed_at = scalar(conn, "SELECT claimed_at FROM jobs WHERE id = %s", (first.message_id,))
        # the quota: one used by the take, one by the scrape; the second waits for tomorrow
        fast = send_scrape(make_watch(conn, make_source(conn, "fast", httpserver.url_for("/search") + "?q={query}"),
                                      "ssd"))
        assert wait_job(conn, fast.message_id, "succeeded", "failed") == "succeeded"
        assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (second.message_id,)) == "waiting"
    assert (claimed_at - taken_at).total_seconds() >= 1.9  # the next token of 30/min: 2 s after the take
    (seen,) = [k for k in limits.seen(conn).keys if k["key"] == limiter_key(source_id)]
    # (the second's start is reserved for tomorrow, a grant made now: 054)
    assert (seen["quota_used"], seen["granted_total"]) == (2, 3)


def test_a_scrape_sent_without_its_sources_limits_is_sent_again_with_them(conn, pipeline_broker, httpserver, shop):
    from actors.scraping import scrape_watch

    source_id, watch_id = shop
    httpserver.expect_request("/search").respond_with_json(ITEMS)
    with running_worker(pipeline_broker, queues=["scraping"]):
        bare = scrape_watch.send(watch_id)
        assert wait_job(conn, bare.message_id, "succeeded", "failed") == "succeeded"
        again = wait_for(lambda: conn.execute("SELECT id FROM jobs WHERE options ? 'deferred_because'").fetchone(),
                         timeout=10)[0]
        assert wait_job(conn, again, "succeeded", "failed") == "succeeded"
    assert conn.execute("SELECT flow_key, options->>'deferred_because' FROM jobs WHERE id = %s", (again,)).fetchone() \
        == (f"source:{source_id}", "sent again with source shop's limits")
    assert scalar(conn, "SELECT flow_key FROM jobs WHERE id = %s", (bare.message_id,)) is None
    assert len(httpserver.log) == 1 and scalar(conn, "SELECT count(*) FROM listings") == 3


def test_a_sources_new_rate_applies_to_scrapes_sent_after_it(conn, pipeline_broker):
    from actors.scraping import send_scrape

    source_id = make_source(conn, per_minute=30, burst=2, daily_quota=100)
    watches = [make_watch(conn, source_id, q) for q in ("a", "b")]
    before = send_scrape(watches[0])
    conn.execute("UPDATE sources SET rate_limit_per_minute = 6, burst = 1, daily_quota = NULL WHERE id = %s",
                 (source_id,))
    after = send_scrape(watches[1])
    flows = {m.message_id: conn.execute("SELECT flow_key, flow FROM jobs WHERE id = %s", (m.message_id,)).fetchone()
             for m in (before, after)}
    assert flows[before.message_id] == (f"source:{source_id}", {"r": 0.5, "b": 2, "q": 100})
    assert flows[after.message_id] == (f"source:{source_id}", {"r": 0.1, "b": 1})
    conn.execute("UPDATE sources SET daily_quota = 0 WHERE id = %s", (source_id,))
    assert send_scrape(watches[1]) is None  # a quota of 0: nothing to send


def test_poll_due_watches_enqueues_each_due_watch_once(conn, pipeline_broker):
    from actors import cache
    from actors.scraping import enqueue_due_watches

    source_id = make_source(conn)
    paused = make_source(conn, "paused")
    conn.execute("UPDATE sources SET paused_until = now() + interval '1 hour' WHERE id = %s", (paused,))
    closed = make_source(conn, "closed", daily_quota=0)
    due = make_watch(conn, source_id, "a")
    fresh = make_watch(conn, source_id, "b")
    conn.execute("UPDATE watches SET last_polled_at = now() WHERE id = %s", (fresh,))
    stale = make_watch(conn, source_id, "c", poll_interval_seconds=60)
    conn.execute("UPDATE watches SET last_polled_at = now() - interval '2 minutes' WHERE id = %s", (stale,))
    make_watch(conn, source_id, "d", enabled=False)
    make_watch(conn, paused, "e")
    make_watch(conn, closed, "f")
    cached = make_watch(conn, source_id, "g")
    cache.put(conn, source_id, "g", cache.Page("http://shop.example/s?q=g", "[]", "application/json"))
    assert enqueue_due_watches() == 3
    # still due: the waiting scrapes are left out, the cached one's live job absorbs it
    assert enqueue_due_watches() == 1
    rows = conn.execute("SELECT args->>0, dedupe_key, status, flow_key, flow FROM jobs WHERE actor = 'scrape_watch'"
                        " ORDER BY 1").fetchall()
    # make_source: 6000/min, burst 50 (pending in the log until claimed: 054)
    limited = ("pending", f"source:{source_id}", {"r": 100.0, "b": 50})
    assert sorted(rows) == sorted([(str(due), f"scrape:{due}", *limited), (str(stale), f"scrape:{stale}", *limited),
                                   (str(cached), f"scrape:{cached}", "pending", None, None)])


# --- price history and reappearing listings -------------------------------------------


def _one_day_passes(conn) -> None:
    """Time moves on by a day: what was observed so far was observed a day earlier."""
    conn.execute("UPDATE price_points SET observed_on = observed_on - 1, observed_at = observed_at - interval '1 day'")


def test_a_listing_seen_on_three_days_at_three_prices_gives_three_points_and_moves_the_forecast(
        conn, pipeline_broker, pipeline_config, httpserver, shop):
    from actors.forecasting import run_forecast
    from actors.scraping import run_scrape

    _, watch_id = shop
    pipeline_config["forecasting"] = {"min_days": 3, "horizon_days": 3}
    pipeline_config["cache"] = {"enabled": False}  # each scrape reads the page anew
    for day, price in enumerate([100.0, 90.0, 80.0]):
        if day:
            _one_day_passes(conn)
        httpserver.clear()
        httpserver.expect_request("/search").respond_with_json([{"id": "P1", "title": "Corsair 32GB DDR4 3200",
                                                                 "price": price}])
        run_scrape(watch_id)
    # The same price again the same day is no new observation; a new price that day replaces it.
    run_scrape(watch_id)
    points = conn.execute("SELECT observed_on, price_cents FROM price_points ORDER BY observed_on").fetchall()
    assert [p[1] for p in points] == [10_000, 9_000, 8_000]
    assert len({p[0] for p in points}) == 3
    conn.execute("UPDATE listings SET product_key = 'ram:ddr4:32gb:3200'")
    result = run_forecast("ram:ddr4:32gb:3200")
    assert result["days"] == 3, result
    y_hat = scalar(conn, "SELECT y_hat FROM predictions_daily ORDER BY date LIMIT 1")
    assert y_hat < 8_500  # the falling prices reached the forecast: it is below all but the last


def test_a_price_change_within_a_day_keeps_the_days_last_price(conn, pipeline_broker, shop):
    from actors.queries import pipeline as sql

    source_id, watch_id = shop
    row = {"watch_id": watch_id, "source_id": source_id, "listing_id": None, "dedupe_key": "ext_Q",
           "price_cents": 100, "currency": "USD", "price_type": "ask", "observed_on": date.today(),
           "match_strength": 0.5}
    assert conn.execute(sql.UPSERT_PRICE_POINT, row).fetchone()[1] is True
    assert conn.execute(sql.UPSERT_PRICE_POINT, row).fetchone() is None  # nothing changed
    assert conn.execute(sql.UPSERT_PRICE_POINT, {**row, "price_cents": 95}).fetchone()[1] is False
    assert conn.execute("SELECT count(*), max(price_cents) FROM price_points").fetchone() == (1, 95)


def test_a_deal_that_disappears_and_reappears_is_judged_again_and_alerts_again(
        conn, pipeline_broker, pipeline_config, httpserver, shop):
    from actors.extraction import run_extraction
    from actors.scraping import run_scrape
    from tests.pipeline_helpers import seed_baseline

    _, watch_id = shop
    pipeline_config["cache"] = {"enabled": False}  # each scrape reads the page anew
    seed_baseline(conn, "ram:ddr4:32gb:3200", 10_000)
    deal = {"id": "D1", "title": "Corsair 32GB DDR4 3200", "price": 70.0}
    other = {"id": "O1", "title": "Kingston 32GB DDR4 3200", "price": 99.0}

    def scrape(items) -> None:
        httpserver.clear()
        httpserver.expect_request("/search").respond_with_json(items)
        run_scrape(watch_id)

    def extractions() -> int:
        return scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'extract_listing'"
                            " AND args->>0 = (SELECT id::text FROM listings WHERE external_id = 'D1')")

    def extract_deal():
        lid = scalar(conn, "SELECT id FROM listings WHERE external_id = 'D1'")
        conn.execute("DELETE FROM jobs WHERE actor = 'extract_listing'")  # done, as a worker would
        return run_extraction(lid, watch_id)["alert_id"]

    scrape([deal, other])
    assert extractions() == 1 and extract_deal() is not None
    conn.execute("UPDATE alerts SET notified = true, notified_at = now()")
    scrape([deal, other])  # still up, same price: nothing to judge, no second alert
    assert extractions() == 0
    scrape([other])  # gone
    scrape([deal, other])  # back
    assert extractions() == 1
    assert extract_deal() is not None
    assert scalar(conn, "SELECT count(*) FROM alerts") == 2


def test_a_notified_listing_alerts_again_only_below_its_notified_price_or_back_after_an_absence(
        conn, pipeline_broker, pipeline_config, httpserver):
    """Re-alerts off (the default): an auction's rising bid under the target alerts once, not
    on every poll that sees a new bid; a price under the one notified, or the listing coming
    back after a poll that did not find it, alerts again."""
    from actors.extraction import run_extraction
    from actors.scraping import run_scrape

    source_id = make_source(conn, "auctions", httpserver.url_for("/search") + "?q={query}")
    watch_id = make_watch(conn, source_id, "ddr4 32gb", target_price_cents=8_000)
    pipeline_config["cache"] = {"enabled": False}  # each scrape reads the page anew

    def poll(bid: float | None) -> list[int | None]:
        """One scrape that finds the auction at ``bid`` (None: not at all), then the
        extractions it chained, as a worker would run them: the alerts they created."""
        httpserver.clear()
        httpserver.expect_request("/search").respond_with_json(
            [] if bid is None else [{"id": "B1", "title": "Corsair 32GB DDR4 3200", "price": bid, "type": "auction"}])
        run_scrape(watch_id)
        chained = conn.execute("SELECT (args->>0)::bigint, (args->>1)::bigint FROM jobs"
                               " WHERE actor = 'extract_listing'").fetchall()
        conn.execute("DELETE FROM jobs WHERE actor = 'extract_listing'")
        return [run_extraction(listing_id, watch)["alert_id"] for listing_id, watch in chained]

    def notified() -> None:
        conn.execute("UPDATE alerts SET notified = true, notified_at = now() WHERE NOT notified")

    first = poll(50.0)
    assert len(first) == 1 and first[0] is not None
    notified()
    assert poll(55.0) == [None]  # a higher bid, still under the target: no news
    assert poll(60.0) == [None]
    assert poll(52.0) == [None]  # lower than the last poll, not than the notified 50
    assert poll(45.0)[0] is not None  # under the notified price
    notified()
    assert poll(None) == []  # gone
    assert poll(45.0)[0] is not None  # back after an absence
    assert scalar(conn, "SELECT count(*) FROM alerts") == 3


# --- a failing watch -----------------------------------------------------------------


def _watch(conn, watch_id) -> dict:
    row = conn.execute("SELECT last_polled_at IS NOT NULL, last_error, failures,"
                       " extract(epoch FROM next_poll_at - last_polled_at) FROM watches WHERE id = %s",
                       (watch_id,)).fetchone()
    return {"polled": row[0], "error": row[1], "failures": row[2], "backoff_s": row[3]}


def _time_passes(conn, watch_id, seconds: float) -> None:
    """The watch's last attempt (and its next try) happened ``seconds`` earlier."""
    conn.execute("UPDATE watches SET last_polled_at = last_polled_at - %s * interval '1 second',"
                 " next_poll_at = next_poll_at - %s * interval '1 second' WHERE id = %s", (seconds, seconds, watch_id))


def test_a_failing_watch_records_each_attempt_and_backs_off_from_its_interval_to_a_day(
        conn, pipeline_broker, pipeline_config, httpserver, shop, database_url):
    """A 404 (or a page that cannot be parsed) is still a poll: the watch shows when and
    why, and is tried again after its interval, then twice that, up to a day, instead of
    on every poll_due_watches tick; a good page clears it."""
    from actors.scraping import enqueue_due_watches, send_scrape
    from tests.conftest import cli

    _, watch_id = shop  # polled every hour
    pipeline_config["cache"] = {"enabled": False}
    httpserver.expect_request("/search").respond_with_data("gone", status=404)
    def newest_scrape() -> str:
        return scalar(conn, "SELECT id::text FROM jobs WHERE actor = 'scrape_watch' ORDER BY created_at DESC LIMIT 1")

    with running_worker(pipeline_broker, queues=["scraping"]):
        job = send_scrape(watch_id).message_id
        for failures, backoff in ((1, 3600), (2, 7200), (3, 14400)):
            assert wait_job(conn, job, "failed", "succeeded") == "failed"
            state = _watch(conn, watch_id)
            assert state["polled"] and "HTTP 404" in state["error"], state
            assert (state["failures"], state["backoff_s"]) == (failures, backoff)
            assert enqueue_due_watches() == 0  # not again on the next tick
            _time_passes(conn, watch_id, backoff - 60)
            assert enqueue_due_watches() == 0  # nor before its backoff has passed
            _time_passes(conn, watch_id, 60)
            assert enqueue_due_watches() == 1  # due: the worker runs it (the next failure)
            job = newest_scrape()
        assert wait_job(conn, job, "failed", "succeeded") == "failed"
        assert _watch(conn, watch_id)["failures"] == 4
        conn.execute("UPDATE watches SET failures = 10 WHERE id = %s", (watch_id,))
        msg = send_scrape(watch_id)
        assert wait_job(conn, msg.message_id, "failed", "succeeded") == "failed"
        assert _watch(conn, watch_id)["backoff_s"] == 86400  # doubling stops at a day

        listed = cli("watches", "list", url=database_url)
        assert listed.returncode == 0 and "HTTP 404" in listed.stdout, listed.stderr
        shown = json.loads(cli("watches", "list", "--json", url=database_url).stdout)[0]
        assert "HTTP 404" in shown["last_error"] and shown["next_poll_at"] and shown["failures"] == 11

        # A page that cannot be parsed fails the same way; a good one clears the failure.
        httpserver.clear()
        httpserver.expect_request("/search").respond_with_data("<html><p>captcha</p></html>", content_type="text/html")
        msg = send_scrape(watch_id)
        assert wait_job(conn, msg.message_id, "failed", "succeeded") == "failed"
        assert "layout may have changed" in _watch(conn, watch_id)["error"]
        httpserver.clear()
        httpserver.expect_request("/search").respond_with_json(ITEMS)
        msg = send_scrape(watch_id)
        assert wait_job(conn, msg.message_id, "failed", "succeeded") == "succeeded"
    # not failing: no next try of its own, due again after its interval
    assert _watch(conn, watch_id) == {"polled": True, "error": None, "failures": 0, "backoff_s": None}
    assert enqueue_due_watches() == 0


def test_a_scrapes_retries_count_once_toward_its_watchs_backoff(conn, pipeline_broker, pipeline_config,
                                                               httpserver, shop):
    """A 503 is retried by the job (its own backoff); its attempts are one failed poll."""
    from actors.scraping import send_scrape

    _, watch_id = shop
    pipeline_config["cache"] = {"enabled": False}
    httpserver.expect_request("/search").respond_with_data("busy", status=503)
    with running_worker(pipeline_broker, queues=["scraping"]):
        msg = send_scrape(watch_id)
        wait_for(lambda: scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (msg.message_id,)) >= 2
                 and scalar(conn, "SELECT status FROM jobs WHERE id = %s", (msg.message_id,)) != "running",
                 timeout=30, message="the scrape's second attempt")
    state = _watch(conn, watch_id)
    assert "HTTP 503" in state["error"] and (state["failures"], state["backoff_s"]) == (1, 3600), state
