"""The tracker's commands against a real database: sources, watches, alerts,
tracker state / reextract, and their errors. In process (click's runner) for
speed; one run goes through a real `supervisor` process to prove the wiring."""

from __future__ import annotations

import json

from click.testing import CliRunner

from supervisor.cli.main import main
from tests.conftest import cli, scalar
from tests.pipeline_helpers import make_alert

SEARCH = "http://127.0.0.1:9/search?q={query}"


def invoke(*args: str, url: str):
    """In process (click's runner), for speed; `cli` runs a real process."""
    result = CliRunner().invoke(main, ["--database-url", url, *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def ok(*args: str, url: str):
    code, out, err = invoke(*args, url=url)
    assert code == 0, f"{args}: {code}\n{out}\n{err}"
    return json.loads(out) if "--json" in args else out


def fails(*args: str, url: str, code: int = 2) -> str:
    got, out, err = invoke(*args, url=url)
    assert got == code, f"{args}: {got}\n{out}\n{err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_real_supervisor_process_lists_watches(conn, database_url):
    ok("sources", "add", "shop", "--search-url", SEARCH, url=database_url)
    ok("watches", "add", "--source", "shop", "--query", "ddr4", url=database_url)
    result = cli("watches", "list", "--json", url=database_url)
    assert result.returncode == 0, result.stderr
    assert [(w["query"], w["source"], w["last_polled_at"]) for w in json.loads(result.stdout)] == [
        ("ddr4", "shop", None)]
    bad = cli("watches", "add", "--source", "nope", "--query", "x", url=database_url)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: unknown source 'nope'")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_sources_and_watches_from_the_cli(conn, database_url):
    url = database_url
    added = ok("sources", "add", "shop", "--search-url", SEARCH, "--format", "json", "--rate-per-minute", "30",
               "--burst", "3", "--daily-quota", "500", "--json", url=url)
    assert added["name"] == "shop" and added["id"] == scalar(conn, "SELECT id FROM sources WHERE name = 'shop'")
    conn.execute("UPDATE sources SET failure_streak = 2, last_error = 'HTTP 503' WHERE name = 'shop'")
    (row,) = ok("sources", "list", "--json", url=url)
    assert (row["failure_streak"], row["last_error"], row["rate_per_minute"], row["burst"], row["daily_quota"]) == (
        2, "HTTP 503", 30.0, 3, 500)
    assert "HTTP 503" in ok("sources", "list", url=url)

    watch = ok("watches", "add", "--source", "shop", "--query", "ddr4 32gb", "--target-price", "12.50",
               "--webhook", "https://discord.com/api/webhooks/123/tok3N-x9", "--every", "30m", "--json", url=url)
    ok("watches", "add", "--source", "shop", "--query", "rtx 3080", "--deal-threshold", "0.2", "--name", "gpu",
       url=url)
    conn.execute("UPDATE watches SET last_polled_at = now() WHERE query = 'rtx 3080'")
    source_id = scalar(conn, "SELECT id FROM sources")
    make_alert(conn, watch["id"], source_id)
    listed = ok("watches", "list", "--json", url=url)
    assert [{k: w[k] for k in ("id", "query", "source", "enabled", "pending_alerts")} for w in listed] == [
        {"id": watch["id"], "query": "ddr4 32gb", "source": "shop", "enabled": True, "pending_alerts": 1},
        {"id": watch["id"] + 1, "query": "rtx 3080", "source": "shop", "enabled": True, "pending_alerts": 0}]
    assert listed[0]["last_polled_at"] is None and listed[1]["last_polled_at"] is not None
    assert "never" in ok("watches", "list", url=url).splitlines()[1]
    shown = ok("watches", "show", "gpu", "--json", url=url)
    assert shown["deal_threshold"] == 0.2 and shown["every_seconds"] == 3600
    first = ok("watches", "show", str(watch["id"]), "--json", url=url)
    assert first["target_price"] == "12.50" and first["every_seconds"] == 1800
    assert "tok3N" not in json.dumps(first) and first["webhook_url"].endswith("/***/***")

    ok("watches", "disable", "gpu", url=url)
    assert scalar(conn, "SELECT enabled FROM watches WHERE name = 'gpu'") is False
    ok("watches", "enable", "gpu", url=url)
    ok("sources", "disable", "shop", url=url)
    assert ok("sources", "show", "shop", "--json", url=url)["enabled"] is False
    alerts = ok("alerts", "list", "--json", url=url)
    assert [(a["watch_id"], a["delivery"], a["attempts"]) for a in alerts] == [(watch["id"], "pending", 0)]

    fails("sources", "remove", "shop", url=url)
    ok("watches", "remove", "gpu", url=url)
    ok("sources", "remove", "shop", "--force", url=url)
    assert scalar(conn, "SELECT count(*) FROM watches") == 0 and scalar(conn, "SELECT count(*) FROM sources") == 0


def test_every_bad_input_is_one_line_naming_it(conn, database_url):
    url = database_url
    assert "{query}" in fails("sources", "add", "shop", "--search-url", "http://x.example/search", url=url)
    assert "--search-url" in fails("sources", "add", "shop", "--search-url", "ftp://x/{query}", url=url)
    assert "--rate-per-minute" in fails("sources", "add", "shop", "--search-url", SEARCH, "--rate-per-minute",
                                        "-1", url=url)
    ok("sources", "add", "shop", "--search-url", SEARCH, url=url)
    assert "exists already" in fails("sources", "add", "shop", "--search-url", SEARCH, url=url)
    unknown = fails("watches", "add", "--source", "nope", "--query", "x", url=url)
    assert "unknown source 'nope'" in unknown and "shop" in unknown
    assert "--target-price '-3'" in fails("watches", "add", "--source", "shop", "--query", "x", "--target-price",
                                          "-3", url=url)
    assert "exclude each other" in fails("watches", "add", "--source", "shop", "--query", "x", "--target-price",
                                         "5", "--deal-threshold", "0.2", url=url)
    assert "--webhook" in fails("watches", "add", "--source", "shop", "--query", "x", "--webhook", "nope", url=url)
    assert "--every" in fails("watches", "add", "--source", "shop", "--query", "x", "--every", "0s", url=url)
    assert "unknown watch '42'" in fails("watches", "show", "42", url=url)
    assert "--watch" in fails("tracker", "reextract", url=url)
    assert scalar(conn, "SELECT count(*) FROM watches") == 0


def test_tracker_state_and_reextract(conn, database_url):
    url = database_url
    ok("sources", "add", "shop", "--search-url", SEARCH, url=url)
    w1 = ok("watches", "add", "--source", "shop", "--query", "a", "--json", url=url)["id"]
    w2 = ok("watches", "add", "--source", "shop", "--query", "b", "--json", url=url)["id"]
    source_id = scalar(conn, "SELECT id FROM sources")
    make_alert(conn, w1, source_id, external_id="x1")
    make_alert(conn, w2, source_id, external_id="x2")
    for lid, wid in conn.execute("SELECT listing_id, watch_id FROM alerts").fetchall():
        conn.execute("INSERT INTO price_points (watch_id, source_id, listing_id, dedupe_key, price_cents, currency,"
                     " price_type, observed_on) VALUES (%s, %s, %s, %s, 1, 'USD', 'ask', current_date)",
                     (wid, source_id, lid, f"k{lid}"))
    state = ok("tracker", "state", "--json", url=url)
    assert {k: state[k] for k in ("watches_total", "watches_enabled", "listings_total", "listings_unextracted",
                                  "alerts_pending", "extraction_queue_depth")} == {
        "watches_total": 2, "watches_enabled": 2, "listings_total": 2, "listings_unextracted": 2,
        "alerts_pending": 2, "extraction_queue_depth": 0}

    assert ok("tracker", "reextract", "--watch", str(w1), "--json", url=url)["enqueued"] == 1
    assert ok("tracker", "reextract", "--all", "--json", url=url)["enqueued"] == 2  # one already live: same job
    rows = conn.execute("SELECT actor, priority, args FROM jobs ORDER BY created_at").fetchall()
    assert {(a, p) for a, p, _ in rows} == {("extract_listing", 1)} and len(rows) == 2
    assert sorted(r[2][1] for r in rows) == [w1, w2]
    assert ok("tracker", "state", "--json", url=url)["extraction_queue_depth"] == 2


def test_re_alerts_per_watch_from_the_cli(conn, database_url):
    ok("sources", "add", "shop", "--search-url", SEARCH, url=database_url)
    wid = ok("watches", "add", "--source", "shop", "--query", "ddr4", "--name", "ram", "--re-alerts", "--json",
             url=database_url)["id"]
    assert scalar(conn, "SELECT re_alerts FROM watches WHERE id = %s", (wid,)) is True
    assert ok("watches", "set", "ram", "--no-re-alerts", "--json", url=database_url) == {
        "watch": wid, "re_alerts": False}
    assert ok("watches", "show", "ram", "--json", url=database_url)["re_alerts"] is False
    assert "re-alerts the config's default" in ok("watches", "set", "ram", "--re-alerts-default", url=database_url)
    assert scalar(conn, "SELECT re_alerts FROM watches WHERE id = %s", (wid,)) is None
    assert "give one of --re-alerts" in fails("watches", "set", "ram", url=database_url)
    assert "unknown watch 'nope'" in fails("watches", "set", "nope", "--re-alerts", url=database_url)


def test_incomplete_extractions_counted_and_reextracted_enqueued_or_now(conn, database_url, tmp_path):
    from actors import catalog

    url = database_url
    ok("sources", "add", "shop", "--search-url", SEARCH, url=url)
    wid = ok("watches", "add", "--source", "shop", "--query", "ram", "--json", url=url)["id"]
    source_id = scalar(conn, "SELECT id FROM sources")
    # Extracted before: one complete, two whose key came out short (no key; a RAM kit keyed by its words).
    for ext, key, attrs in (("ok", "ram:ddr4:32gb:3200", '{"component": "ram"}'), ("nokey", None, "{}"),
                            ("short", "item:corsair:vengeance:ram", '{"component": "ram"}')):
        lid = conn.execute(
            "INSERT INTO listings (source_id, external_id, title, price_cents, product_key, attributes, extracted_at)"
            " VALUES (%s, %s, 'Corsair Vengeance 32GB DDR4 3200', 9000, %s, %s, now()) RETURNING id",
            (source_id, ext, key, attrs)).fetchone()[0]
        conn.execute("INSERT INTO price_points (watch_id, source_id, listing_id, dedupe_key, price_cents, currency,"
                     " price_type, observed_on) VALUES (%s, %s, %s, %s, 9000, 'USD', 'ask', current_date)",
                     (wid, source_id, lid, f"ext_{ext}"))
    assert ok("tracker", "state", "--json", url=url)["listings_incomplete_extraction"] == 2

    # The scheduled path: enqueued at priority 1.
    sent = ok("tracker", "reextract", "--incomplete", "--json", url=url)
    assert (sent["enqueued"], sent["priority"]) == (2, 1)
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'extract_listing' AND priority = 1") == 2
    conn.execute("DELETE FROM jobs")

    # The synchronous path, in a real process: extracted here, nothing enqueued.
    done = cli("tracker", "reextract", "--incomplete", "--now", "--json", url=url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"listings": 2, "deals": 0, "errors": 0, "watch_id": None}
    assert ok("tracker", "state", "--json", url=url)["listings_incomplete_extraction"] == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'extract_listing'") == 0
    assert "--watch" in fails("tracker", "reextract", "--watch", str(wid), "--all", url=url)

    # A baseline is warm at the config's scoring.min_samples, as the extraction judges.
    conn.execute("DELETE FROM price_baselines")  # the extraction built one inline; one of 3 samples instead
    conn.execute("INSERT INTO price_baselines (product_key, median_cents, p25_cents, p75_cents, mean_cents,"
                 " sample_count, window_days) VALUES ('ram:ddr4:32gb:3200', 9000, 9000, 9000, 9000, 3, 30)")
    assert ok("tracker", "state", "--json", url=url)["baselines_warm"] == 0  # the default, 5
    catalog.sync(conn, {"scoring": {"min_samples": 2}})
    state = ok("tracker", "state", "--json", url=url)
    assert (state["baselines_warm"], state["baselines_cold"]) == (1, 0)


# The periodic work the reference's scheduler ran (refactor-plan-price-tracker.md: ingestion,
# baseline_refresh, re_extraction; forecast-worker.md: the daily forecast): actor -> the queue
# its role serves.
SEED_SCHEDULES = {"poll_due_watches": "scraping", "refresh_baselines": "extraction",
                  "reextract_incomplete": "extraction", "forecast_daily": "forecasting"}


def test_every_shipped_config_passes_check_and_schedules_the_seeds_work(database_url):
    from supervisor import config
    from tests.conftest import ROOT

    shipped = sorted((ROOT / "config").glob("*.yaml"))
    assert {p.name for p in shipped} >= {"supervisor.yaml", "production.example.yaml"}
    for path in shipped:
        checked = cli("check", "--json", config=path, url=database_url)
        assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], (path.name, checked.stdout, checked.stderr)
        loaded = config.parse(path.read_text(), path.name, env={"DATABASE_URL": database_url})
        scheduled = {s.actor: s.queue for s in loaded.schedules}
        assert {a: scheduled.get(a) for a in SEED_SCHEDULES} == SEED_SCHEDULES, path.name
        served = {q for r in loaded.roles for q in r.queues}
        assert set(SEED_SCHEDULES.values()) <= served, path.name
