"""The tracker's scoring per the plan (time factor, composite, re-score by id
cursor), the shared page cache, and system_state."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from actors import parsing, scoring
from tests.conftest import scalar, wait_for
from tests.pipeline_helpers import (
    make_source,
    make_watch,
    running_worker,
    seed_baseline,
)

NOW = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("kind, ends_in, seen_ago, expected", [
    ("auction", timedelta(hours=2), timedelta(days=3), 100),   # ending within 4 h, however old
    ("fixed", None, timedelta(hours=1), 80),                   # first seen within 24 h
    ("auction", timedelta(days=2), timedelta(hours=5), 80),    # an auction far from its end is just new
    ("fixed", None, timedelta(days=3), 30),                    # an old fixed-price listing
])
def test_time_scores(kind, ends_in, seen_ago, expected):
    assert scoring.time_score(listing_type=kind, auction_ends_at=NOW + ends_in if ends_in else None,
                              first_seen_at=NOW - seen_ago, now=NOW) == expected


def test_the_composite_weights_value_95_and_time_5():
    assert scoring.composite_score(0.5, 100) == 100.0
    assert scoring.composite_score(0.25, 30) == pytest.approx(0.95 * 50 + 0.05 * 30)
    assert scoring.composite_score(-0.2, 80) == pytest.approx(4.0)
    assert scoring.composite_score(None, 100) > scoring.composite_score(None, 30)


def test_listing_type_and_auction_end_are_parsed():
    page = [{"id": "1", "title": "RTX 3080", "price": 500, "listing_type": "auction", "price_type": "ask",
             "auction_ends_at": "2030-05-01T14:00:00Z"},
            {"id": "2", "title": "RTX 3080", "price": 600}]
    auction, fixed = parsing.parse(json.dumps(page))
    assert (auction.listing_type, auction.auction_ends_at, auction.price_type) == (
        "auction", datetime(2030, 5, 1, 14, tzinfo=UTC), "ask")
    assert (fixed.listing_type, fixed.auction_ends_at) == ("fixed", None)


def _listing(conn, source_id, ext, *, kind="fixed", ends=None, seen_ago=timedelta(0), price=9_000) -> int:
    return conn.execute(
        "INSERT INTO listings (source_id, external_id, title, price_cents, listing_type, auction_ends_at,"
        " first_seen_at) VALUES (%s, %s, 'Corsair 32GB DDR4 3200', %s, %s, %s, now() - %s) RETURNING id",
        (source_id, ext, price, kind, ends, seen_ago)).fetchone()[0]


def test_extraction_records_time_and_composite_scores(conn, pipeline_broker, pipeline_config):
    from actors.extraction import run_extraction

    source_id = make_source(conn)
    watch_id = make_watch(conn, source_id, "ddr4 32gb")
    seed_baseline(conn, "ram:ddr4:32gb:3200", 10_000)
    soon = _listing(conn, source_id, "a", kind="auction", ends=datetime.now(UTC) + timedelta(hours=2),
                    seen_ago=timedelta(days=3))
    new = _listing(conn, source_id, "n")
    old = _listing(conn, source_id, "o", seen_ago=timedelta(days=3))
    for lid in (soon, new, old):
        run_extraction(lid, watch_id)
    rows = dict((r[0], r[1:]) for r in conn.execute("SELECT id, time_score, score, composite_score FROM listings"))
    assert [rows[i][0] for i in (soon, new, old)] == [100, 80, 30]
    assert all(r[1] == pytest.approx(0.1) for r in rows.values())
    assert rows[soon][2] > rows[new][2] > rows[old][2]
    assert rows[soon][2] == pytest.approx(scoring.composite_score(0.1, 100), abs=0.01)


def test_refresh_baselines_rescores_every_listing_by_cursor_over_pages(conn, pipeline_broker, pipeline_config):
    from actors import extraction

    pipeline_config["scoring"] = {"min_samples": 5}
    source_id = make_source(conn)
    ids = [_listing(conn, source_id, f"l{n}", price=10_000 + 100 * n, seen_ago=timedelta(days=2)) for n in range(5)]
    conn.execute("UPDATE listings SET product_key = 'ram:ddr4:32gb:3200', unit_price_cents = price_cents,"
                 " extracted_at = now()")
    seed_baseline(conn, "ram:ddr4:32gb:3200", 12_000, samples=2)  # cold: scored against nothing
    assert extraction.rescore_all(batch=2) == 5
    assert scalar(conn, "SELECT count(*) FROM listings WHERE score IS NULL AND time_score = 30") == 5

    conn.execute("UPDATE listings SET last_seen_at = now()")
    assert extraction.refresh_all_baselines() == 1  # 5 samples now: warm
    assert list(extraction.rescore_pages(2)) == [(0, 2), (ids[1], 2), (ids[3], 1)]  # three pages by id cursor
    median = scalar(conn, "SELECT median_cents FROM price_baselines")
    scores = dict(conn.execute("SELECT id, score FROM listings").fetchall())
    assert all(scores[i] == pytest.approx((median - (10_000 + 100 * n)) / median, abs=1e-5)
               for n, i in enumerate(ids))
    result = extraction.refresh_baselines.fn()
    assert (result["baselines"], result["rescored"], result["rows_affected"]) == (1, 5, 6)


def test_the_page_cache_serves_a_second_scrape_without_a_request_or_a_token(conn, pipeline_broker,
                                                                              pipeline_config, httpserver):
    """A scrape sent while its page is cached carries no limits: it takes no token at its
    claim and makes no request. An expired page: the next scrape carries the source's
    limits again and takes one."""
    from actors import cache
    from actors.scraping import run_scrape, send_scrape

    source_id = make_source(conn, "shop", httpserver.url_for("/search") + "?q={query}")
    watch_id = make_watch(conn, source_id, "ddr4 32gb")
    httpserver.expect_request("/search").respond_with_json(
        [{"id": "A1", "title": "Corsair 32GB DDR4 3200", "price": 89.99}])

    def granted():
        return scalar(conn, "SELECT coalesce(max(granted_total), 0) FROM rate_limiter_state WHERE key = %s",
                      (f"source:{source_id}",))

    def scrape() -> tuple:
        sent = send_scrape(watch_id)
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (sent.message_id,)) == "succeeded",
                 timeout=20, message="the scrape")
        return sent.message_id, scalar(conn, "SELECT flow_key FROM jobs WHERE id = %s", (sent.message_id,))

    with running_worker(pipeline_broker, queues=["scraping"]):
        assert scrape()[1] == f"source:{source_id}"
        assert len(httpserver.log) == 1 and granted() == 1
        assert scrape()[1] is None  # sent while cached: no limits
        assert len(httpserver.log) == 1 and granted() == 1  # no request, no token
        assert scalar(conn, "SELECT count(*) FROM page_cache WHERE source_id = %s AND query = 'ddr4 32gb'"
                            " AND page = 1 AND expires_at > now() + interval '59 minutes'", (source_id,)) == 1

        conn.execute("UPDATE page_cache SET expires_at = now() - interval '1 second'")
        assert scrape()[1] == f"source:{source_id}"
        assert len(httpserver.log) == 2 and granted() == 2
    conn.execute("UPDATE page_cache SET expires_at = now() - interval '1 second'")
    assert cache.prune() == 1 and scalar(conn, "SELECT count(*) FROM page_cache") == 0

    pipeline_config["cache"] = {"enabled": False}
    run_scrape(watch_id)
    run_scrape(watch_id)
    assert len(httpserver.log) == 4 and scalar(conn, "SELECT count(*) FROM page_cache") == 0


def test_system_state_in_one_query(conn, pipeline_broker):
    from actors.tracker import system_state

    source_id = make_source(conn)
    make_watch(conn, source_id, "a")
    make_watch(conn, source_id, "b", enabled=False)
    _listing(conn, source_id, "x")
    conn.execute("UPDATE listings SET product_key = 'k:1', extracted_at = now(), score = 0.1")
    _listing(conn, source_id, "y")
    seed_baseline(conn, "k:2", 100, samples=2)
    state = system_state(conn)
    assert {k: state[k] for k in ("watches_total", "watches_enabled", "listings_total", "listings_unextracted",
                                  "listings_unscored", "alerts_pending", "baselines_warm", "baselines_cold",
                                  "product_keys_no_baseline")} == {
        "watches_total": 2, "watches_enabled": 1, "listings_total": 2, "listings_unextracted": 1,
        "listings_unscored": 1, "alerts_pending": 0, "baselines_warm": 0, "baselines_cold": 1,
        "product_keys_no_baseline": 1}
