"""Extraction: rule-based attributes, the LLM path against a fake OpenAI-compatible
server, deal scoring, alerts and re-alerts."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from werkzeug import Response

from actors import extract_rules
from tests.conftest import scalar, wait_for
from tests.pipeline_helpers import (
    make_source,
    make_watch,
    running_worker,
    seed_baseline,
)
from tests.run_notes import most_at_once


@pytest.mark.parametrize("title, key, attrs", [
    ("Corsair Vengeance LPX 32GB (2x16GB) DDR4 3200MHz C16", "ram:ddr4:32gb:3200",
     {"brand": "corsair", "capacity_gb": 32.0, "modules": 2, "memory_type": "ddr4", "speed_mts": 3200}),
    ("Crucial 16GB DDR4-3200 SODIMM Laptop RAM used", "ram:ddr4:16gb:3200:sodimm",
     {"brand": "crucial", "condition": "used", "form_factor": "sodimm"}),
    ("Lot of 4 Samsung 8GB PC4-21300 ECC RDIMM server memory", "ram:ddr4:8gb:2666:rdimm",
     {"quantity": 4, "speed_mts": 2666}),
    ("Samsung 970 EVO Plus 1TB NVMe M.2 SSD - new sealed", "ssd:nvme:1tb",
     {"brand": "samsung", "condition": "new", "capacity_gb": 1000.0, "interface": "nvme"}),
    ('WD Red 4TB 3.5" NAS Hard Drive 5400 RPM refurbished', "hdd:4tb:5400",
     {"brand": "western digital", "condition": "refurbished", "rpm": 5400}),
    ("EVGA GeForce RTX 3080 Ti FTW3 12GB graphics card for parts", "gpu:rtx3080ti",
     {"condition": "for parts", "component": "gpu"}),
    ("Intel Core i7-12700K Desktop Processor", "cpu:i7-12700k", {"brand": "intel"}),
    ("Vintage brass desk lamp", "item:-:vintage:brass:desk:lamp", {}),
])
def test_rules(title, key, attrs):
    got = extract_rules.extract(title)
    assert got.product_key == key
    assert attrs.items() <= got.attributes.items()


def test_quantity_sets_the_unit_price_and_kits_count_total_capacity():
    lot = extract_rules.extract("Pack of 2 Kingston 8GB DDR3 1600")
    assert lot.quantity == 2 and lot.product_key == "ram:ddr3:8gb:1600"
    kit = extract_rules.extract("Kingston 2 x 8GB DDR3 1600")
    assert kit.quantity == 1 and kit.product_key == "ram:ddr3:16gb:1600"


@pytest.mark.parametrize("title, key", [
    ("Kingston FURY Beast 16GB DDR4 desktop RAM", "ram:ddr4:16gb:?"),
    ("Crucial 8GB DDR4 SODIMM laptop memory", "ram:ddr4:8gb:?:sodimm"),
    ("WD Blue SN570 1TB M.2 SSD", "ssd:?:1tb"),
    ('Samsung 870 EVO 2TB 2.5" SATA SSD', "ssd:sata:2tb"),
])
def test_an_unknown_attribute_stays_unknown_in_the_key(title, key):
    """A RAM speed or a drive interface the title does not give is "?" in the key: a default
    (once `sata`) priced NVMe drives against SATA ones, and kits of any speed together."""
    assert extract_rules.extract(title).product_key == key


@pytest.mark.parametrize("key, attrs, incomplete", [
    ("ram:ddr4:16gb:3200", {"speed_mts": 3200}, False),
    ("ram:ddr4:16gb:3200:sodimm", {"speed_mts": 3200}, False),
    ("ssd:sata:2tb", {"interface": "sata"}, False),
    ("ssd:nvme:1tb", {"interface": "nvme"}, False),
    ("hdd:4tb:5400", {"rpm": 5400}, False),
    ("ram:ddr4:16gb:?", {}, True),
    ("ram:ddr?:16gb:3200", {"speed_mts": 3200}, True),
    ("ssd:?:1tb", {}, True),
    # keys written before unknown was "?": RAM with no speed, a drive whose sata was the default
    ("ram:ddr4:16gb", {}, True),
    ("ram:ddr4:8gb:sodimm", {"form_factor": "sodimm"}, True),
    ("ssd:sata:1tb", {"form_factor": "m.2"}, True),
])
def test_a_key_with_an_unknown_part_counts_as_incomplete(conn, key, attrs, incomplete):
    assert scalar(conn, "SELECT listing_extraction_incomplete(%s, %s::jsonb, now())",
                  (key, json.dumps({"component": key.split(":")[0], **attrs}))) is incomplete


# --- the actor -----------------------------------------------------------------------------


def listing(conn, source_id, title, price_cents, ext, price_type="ask") -> int:
    return conn.execute(
        "INSERT INTO listings (source_id, external_id, title, price_cents, price_type) VALUES (%s, %s, %s, %s, %s)"
        " RETURNING id", (source_id, ext, title, price_cents, price_type)).fetchone()[0]


@pytest.fixture
def setup(conn, pipeline_broker, pipeline_config):
    source_id = make_source(conn)
    watch_id = make_watch(conn, source_id, "ddr4 32gb", webhook_url="http://127.0.0.1:9/hook")
    return source_id, watch_id


def test_a_deal_against_the_baseline_creates_one_alert_and_chains_its_notification(conn, setup):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    seed_baseline(conn, "ram:ddr4:32gb:3200", 10_000)
    cheap = listing(conn, source_id, "Corsair 32GB (2x16GB) DDR4 3200", 7_000, "c")
    normal = listing(conn, source_id, "G.Skill 32GB DDR4 3200 kit", 9_500, "n")
    result = run_extraction(cheap, watch_id)
    assert result["deal"] and "30% under the median $100.00 of 20 listings" in result["reason"]
    assert not run_extraction(normal, watch_id)["deal"]
    assert run_extraction(cheap, watch_id)["alert_id"] is None  # still pending: no second alert
    alert_id, score = conn.execute("SELECT id, score FROM alerts").fetchone()
    assert score == pytest.approx(0.3)
    assert conn.execute("SELECT product_key, unit_price_cents, extractor FROM listings WHERE id = %s",
                        (cheap,)).fetchone() == ("ram:ddr4:32gb:3200", 7000, "rules")
    assert conn.execute("SELECT actor, queue, dedupe_key FROM jobs").fetchall() == [
        ("deliver_alert", "notification", f"notify:{alert_id}")]


def test_target_price_lot_unit_price_and_sold_listings(conn, setup):
    from actors.extraction import run_extraction

    source_id, _ = setup
    watch = make_watch(conn, source_id, "ddr4 8gb", target_price_cents=3_000)
    lot = listing(conn, source_id, "Lot of 4 Samsung 8GB DDR4 2666", 10_000, "lot")  # $25 each
    sold = listing(conn, source_id, "Samsung 8GB DDR4 2666", 1_000, "sold", price_type="sold")
    dear = listing(conn, source_id, "Samsung 8GB DDR4 2666", 4_000, "dear")
    assert "at or under the target $30.00" in run_extraction(lot, watch)["reason"]
    assert run_extraction(sold, watch)["reason"] == "already sold"
    assert not run_extraction(dear, watch)["deal"]
    assert scalar(conn, "SELECT count(*) FROM alerts") == 1
    # No webhook on this watch: the alert waits, nothing to notify.
    assert scalar(conn, "SELECT count(*) FROM jobs") == 0


def test_a_cold_baseline_is_built_inline_and_judges_once_warm(conn, setup, pipeline_config):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    pipeline_config["scoring"] = {"min_samples": 4}
    ids = [listing(conn, source_id, f"Corsair 32GB DDR4 3200 #{n}", 10_000 + n * 100, f"l{n}") for n in range(4)]
    results = [run_extraction(i, watch_id) for i in ids]
    assert "no warm baseline yet (1 of 4" in results[0]["reason"]
    deal = listing(conn, source_id, "Corsair 32GB DDR4 3200 clearance", 7_000, "deal")
    assert run_extraction(deal, watch_id)["deal"]
    # Warm and fresh now: judged against it without recomputing on every listing.
    assert conn.execute("SELECT sample_count, median_cents FROM price_baselines").fetchone() == (4, 10_150)


def test_re_alerts_off_block_only_while_pending_and_on_wait_for_the_cooldown(conn, setup, pipeline_config):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    seed_baseline(conn, "ram:ddr4:32gb:3200", 10_000)
    cheap = listing(conn, source_id, "Corsair 32GB DDR4 3200", 7_000, "c")
    assert run_extraction(cheap, watch_id)["alert_id"] is not None
    assert run_extraction(cheap, watch_id)["alert_id"] is None  # off: blocked while the first is pending
    conn.execute("UPDATE alerts SET notified = true, notified_at = now()")
    assert run_extraction(cheap, watch_id)["alert_id"] is None  # off: notified, and neither cheaper nor back
    conn.execute("UPDATE listings SET price_cents = 6900 WHERE id = %s", (cheap,))
    assert run_extraction(cheap, watch_id)["alert_id"] is not None  # off: under the price notified
    conn.execute("UPDATE alerts SET notified = true, notified_at = now()")

    pipeline_config["alerts"] = {"re_alerts_enabled": True, "re_alerts_cooldown": "1h"}
    assert run_extraction(cheap, watch_id)["alert_id"] is None  # on: within the cooldown
    conn.execute("UPDATE alerts SET notified_at = now() - interval '2 hours'")
    assert run_extraction(cheap, watch_id)["alert_id"] is not None
    assert scalar(conn, "SELECT count(*) FROM alerts") == 3


def test_re_alerts_per_watch_override_the_config(conn, setup, pipeline_config):
    from actors import catalog
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    seed_baseline(conn, "ram:ddr4:32gb:3200", 10_000)
    cheap = listing(conn, source_id, "Corsair 32GB DDR4 3200", 7_000, "c")
    catalog.set_watch_re_alerts(conn, str(watch_id), True)  # opted in, the config's default is off
    assert run_extraction(cheap, watch_id)["alert_id"] is not None
    conn.execute("UPDATE alerts SET notified = true, notified_at = now()")
    assert run_extraction(cheap, watch_id)["alert_id"] is None  # the 24 h default cooldown applies
    pipeline_config["alerts"] = {"re_alerts_enabled": True, "re_alerts_cooldown": "1h"}
    catalog.set_watch_re_alerts(conn, str(watch_id), False)  # opted out, the config's default is on
    conn.execute("UPDATE alerts SET notified_at = now() - interval '2 hours'")  # past the config's cooldown
    assert run_extraction(cheap, watch_id)["alert_id"] is None  # off: neither cheaper nor back
    conn.execute("UPDATE listings SET price_cents = 6900 WHERE id = %s", (cheap,))
    assert run_extraction(cheap, watch_id)["alert_id"] is not None
    assert catalog.get_watch(conn, str(watch_id))["re_alerts"] is False


def test_refresh_baselines(conn, setup):
    from actors.extraction import refresh_all_baselines, run_extraction

    source_id, watch_id = setup
    for n, price in enumerate([8_000, 9_000, 10_000, 11_000, 30_000]):
        run_extraction(listing(conn, source_id, f"Kingston 16GB DDR4 2666 #{n}", price, f"k{n}"), watch_id)
    conn.execute("DELETE FROM price_baselines")
    assert refresh_all_baselines() == 1
    row = conn.execute("SELECT product_key, median_cents, p25_cents, p75_cents, sample_count FROM price_baselines"
                       ).fetchone()
    assert row == ("ram:ddr4:16gb:2666", 10_000, 9_000, 11_000, 5)


# --- the LLM path against a fake OpenAI-compatible server ---------------------------------


def fake_llm(server, answer: dict, *, delay: float = 0.0, status: int = 200):
    seen = {"requests": [], "now": 0, "peak": 0}
    lock = threading.Lock()

    def handler(request):
        with lock:
            seen["now"] += 1
            seen["peak"] = max(seen["peak"], seen["now"])
            seen["requests"].append((request.headers.get("Authorization"), request.get_json()))
        try:
            time.sleep(delay)
            body = {"choices": [{"message": {"role": "assistant", "content": json.dumps(answer)}}]}
            return Response(json.dumps(body), status=status, content_type="application/json")
        finally:
            with lock:
                seen["now"] -= 1

    server.expect_request("/v1/chat/completions", method="POST").respond_with_handler(handler)
    return seen


def test_llm_extraction(conn, setup, pipeline_config, threaded_server, monkeypatch):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    monkeypatch.setenv("FAKE_LLM_KEY", "sk-test")
    seen = fake_llm(threaded_server, {"component": "RAM", "brand": "Corsair", "capacity_gb": 64,
                                      "memory_type": "ddr5", "speed_mts": "6000", "condition": "new"})
    pipeline_config["extraction"] = {"llm": {"base_url": threaded_server.url_for("/v1"), "model": "fake-1",
                                             "api_key_env": "FAKE_LLM_KEY"}}
    lid = listing(conn, source_id, "CORSAIR Dominator 64GB kit, blazing fast", 20_000, "x")
    result = run_extraction(lid, watch_id)
    assert result["extractor"] == "llm:fake-1" and result["product_key"] == "ram:ddr5:64gb:6000"
    auth, body = seen["requests"][0]
    assert auth == "Bearer sk-test" and body["model"] == "fake-1"
    assert "CORSAIR Dominator" in body["messages"][1]["content"]
    attrs = scalar(conn, "SELECT attributes FROM listings WHERE id = %s", (lid,))
    assert attrs["brand"] == "corsair" and attrs["condition"] == "new"
    # Re-extracting a listing this model already read does not ask it again.
    run_extraction(lid, watch_id)
    assert len(seen["requests"]) == 1


def test_llm_failure_falls_back_to_the_rules(conn, setup, pipeline_config, threaded_server):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    fake_llm(threaded_server, {}, status=503)
    pipeline_config["extraction"] = {"llm": {"base_url": threaded_server.url_for("/v1"), "model": "fake-1"}}
    result = run_extraction(listing(conn, source_id, "Corsair 32GB DDR4 3200", 9_000, "y"), watch_id)
    assert result["extractor"] == "rules (llm unavailable)" and result["product_key"] == "ram:ddr4:32gb:3200"


def test_llm_concurrency_and_rate_are_bounded(conn, setup, pipeline_config, threaded_server):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    seen = fake_llm(threaded_server, {"component": "ssd", "capacity_gb": 1000, "interface": "nvme"}, delay=0.3)
    pipeline_config["extraction"] = {"llm": {"base_url": threaded_server.url_for("/v1"), "model": "fake-2",
                                             "concurrency": 2, "rate_per_minute": 6000}}
    ids = [listing(conn, source_id, f"Samsung 1TB NVMe #{n}", 5_000, f"s{n}") for n in range(6)]
    threads = [threading.Thread(target=run_extraction, args=(i, watch_id)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen["requests"]) == 6 and seen["peak"] == 2
    assert scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'llm:fake-2'") == 6


def test_llm_extraction_jobs_wait_for_the_models_limits_in_the_database(conn, setup, pipeline_broker,
                                                                        pipeline_config, threaded_server):
    """Extraction jobs carry the model's limits (llm.limits): the claim runs at most its
    concurrency at once, four threads notwithstanding, and takes each job's token."""
    from actors import tracker

    source_id, _ = setup
    seen = fake_llm(threaded_server, {"component": "ssd", "capacity_gb": 1000, "interface": "nvme"}, delay=0.3)
    pipeline_config["extraction"] = {"llm": {"base_url": threaded_server.url_for("/v1"), "model": "fake-3",
                                             "concurrency": 2, "rate_per_minute": 6000}}
    for n in range(6):
        listing(conn, source_id, f"Samsung 1TB NVMe #{n}", 5_000, f"s{n}")
    assert tracker.reextract(pipeline_broker) == 6
    # (appended to the log with their key, pending until a claim gives each its start and
    # slot: 054)
    assert conn.execute("SELECT status, flow_key, flow FROM jobs WHERE actor = 'extract_listing'").fetchall() == [
        ("pending", "llm:fake-3", {"r": 100.0, "b": 2, "c": 2})] * 6
    with running_worker(pipeline_broker, queues=["extraction"], threads=4):
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'extract_listing'"
                                      " AND status = 'succeeded'") == 6, timeout=30, message="six extractions")
    # While each ran in its thread (started_at, finished_at: the server's clock less the
    # worker's measured offsets, hence a millisecond's margin), never more than two.
    margin = timedelta(milliseconds=2)
    spans = [(a + margin, b - margin) for a, b in conn.execute(
        "SELECT started_at, finished_at FROM jobs WHERE actor = 'extract_listing'").fetchall()]
    assert most_at_once(spans) == 2  # the claim's limit: two running, the other threads idle
    assert len(seen["requests"]) == 6 and seen["peak"] == 2
    assert scalar(conn, "SELECT count(*) FROM listings WHERE extractor = 'llm:fake-3'") == 6
    assert scalar(conn, "SELECT granted_total FROM rate_limiter_state WHERE key = 'llm:fake-3'") == 6


def test_a_429_from_the_model_blocks_its_key_and_the_job_spends_no_retry(conn, setup, pipeline_broker,
                                                                         pipeline_config, threaded_server):
    from actors.extraction import extract_listing

    source_id, watch_id = setup
    told = []

    def handler(request):  # the first request hears "slow down", the rest an answer
        if not told:
            told.append(request)
            return Response("slow down", status=429, headers={"Retry-After": "1"})
        body = {"choices": [{"message": {"role": "assistant", "content": json.dumps({"component": "ssd"})}}]}
        return Response(json.dumps(body), content_type="application/json")

    threaded_server.expect_request("/v1/chat/completions", method="POST").respond_with_handler(handler)
    pipeline_config["extraction"] = {"llm": {"base_url": threaded_server.url_for("/v1"), "model": "fake-4"}}
    lid = listing(conn, source_id, "Samsung 1TB NVMe", 5_000, "n")
    with running_worker(pipeline_broker, queues=["extraction"]):
        bare = extract_listing.send(lid, watch_id)  # no limits: its first run sends it again with them
        copy = wait_for(lambda: conn.execute("SELECT id FROM jobs WHERE options ? 'deferred_because'").fetchone(),
                        timeout=10)[0]
        went_back = wait_for(lambda: conn.execute(
            "SELECT reason FROM job_events WHERE job_id = %s AND to_status = 'waiting'", (copy,)).fetchone(), 10)
        blocked = scalar(conn, "SELECT blocked_until > now() FROM rate_limiter_state WHERE key = 'llm:fake-4'")
        assert "rate limited upstream" in went_back[0] and blocked
        wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (copy,)) == "succeeded", 15)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (bare.message_id,)) == "succeeded"
    assert conn.execute("SELECT flow_key, attempts FROM jobs WHERE id = %s", (copy,)).fetchone() == ("llm:fake-4", 1)
    assert scalar(conn, "SELECT extractor FROM listings WHERE id = %s", (lid,)) == "llm:fake-4"
    assert len(told) == 1


def test_a_reextraction_never_alerts_a_listing_notified_before(conn, setup, pipeline_config):
    from actors.extraction import run_extraction

    source_id, watch_id = setup
    seed_baseline(conn, "ram:ddr4:32gb:3200", 10_000)
    cheap = listing(conn, source_id, "Corsair 32GB DDR4 3200", 7_000, "c")
    fresh = listing(conn, source_id, "Kingston 32GB DDR4 3200", 7_000, "k")
    assert run_extraction(cheap, watch_id)["alert_id"] is not None
    conn.execute("UPDATE alerts SET notified = true, notified_at = now()")
    assert run_extraction(cheap, watch_id, reextract=True)["alert_id"] is None  # read again: no news
    assert run_extraction(fresh, watch_id, reextract=True)["alert_id"] is not None  # a deal found on re-reading
