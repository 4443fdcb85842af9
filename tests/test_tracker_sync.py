"""pipeline.sources and pipeline.watches: validated at config load, synced by name
when a real supervisor starts and on reload, pruned only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from supervisor.config import ConfigError, load
from tests.conftest import scalar, wait_for
from tests.supervisor_helpers import cli, role, write_config

SEARCH = "http://127.0.0.1:9/search?q={query}"


def with_pipeline(path: Path, pipeline: dict) -> Path:
    data = yaml.safe_load(path.read_text())
    data["pipeline"] = pipeline
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("pipeline, key, fragment", [
    ({"sources": {"shop": {"search_url": "http://x.example/search"}}}, "pipeline.sources.shop.search_url",
     "no {query} placeholder"),
    ({"sources": {"shop": {"format": "json"}}}, "pipeline.sources.shop.search_url", "is required"),
    ({"sources": {"shop": {"search_url": SEARCH, "burst": 0}}}, "pipeline.sources.shop.burst", "at least 1"),
    ({"watches": {"w": {"source": "shop", "query": "x", "target_price": -3}}}, "pipeline.watches.w.target_price",
     "must be a positive price"),
    ({"watches": {"w": {"source": "shop", "query": "x", "webhook": "nope"}}}, "pipeline.watches.w.webhook",
     "not an http(s) URL"),
    ({"watches": {"w": {"source": "shop", "query": "x", "colour": "red"}}}, "pipeline.watches.w",
     "unknown key 'colour'"),
    ({"watches": {"w": {"source": "shop", "query": "x", "target_price": 5, "deal_threshold": 0.2}}},
     "pipeline.watches.w", "exclude each other"),
])
def test_declared_entries_are_validated_with_file_line_and_key(tmp_path, pipeline, key, fragment):
    path = with_pipeline(write_config(tmp_path / "s.yaml", "embedded", {"scraping": role(1)}), pipeline)
    with pytest.raises(ConfigError) as caught:
        load(path)
    text = str(caught.value)
    assert str(path) in text and key in text and fragment in text and caught.value.line


def test_a_good_declaration_loads_parsed(tmp_path):
    path = with_pipeline(write_config(tmp_path / "s.yaml", "embedded", {"scraping": role(1)}), {
        "sources": {"shop": {"search_url": SEARCH, "rate_per_minute": 30}},
        "watches": {"ram": {"source": "shop", "query": "ddr4", "target_price": "12.50", "every": "30m",
                            "re_alerts": True}}})
    pipeline = load(path).app_settings["pipeline"]
    assert pipeline["watches"]["ram"] == {"source": "shop", "query": "ddr4", "target_price": 1250, "every": 1800.0,
                                          "re_alerts": True}


def test_synced_at_start_and_on_reload_never_silently_deleted(tmp_path, conn, database_url, supervisor):
    roles = {"scraping": role(2, queues=["scraping"], actors=["actors.scraping"])}
    path = write_config(tmp_path / "s.yaml", database_url, roles)
    s = supervisor(path)
    s.wait_state({"scraping": 2}, timeout=90)  # generous: CI machines can be very busy
    # An empty tracker says how to begin, once for the whole fleet.
    wait_for(lambda: "no watches yet" in s.log(), 60, message="the empty-tracker hint")
    assert s.log().count("no watches yet") == 1 and "supervisor demo" in s.log()

    with_pipeline(path, {
        "sources": {"shop": {"search_url": SEARCH, "burst": 2}},
        "watches": {"ram": {"source": "shop", "query": "ddr4 32gb", "target_price": 50},
                    "gpu": {"source": "shop", "query": "rtx 3080", "deal_threshold": 0.25, "every": "10m"}}})
    out = cli("reload", config=path)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM watches") == 2, 60, message="declared watches synced")
    assert conn.execute("SELECT name, query, target_price_cents, deal_threshold, poll_interval_seconds"
                        " FROM watches ORDER BY name").fetchall() == [
        ("gpu", "rtx 3080", None, 0.25, 600), ("ram", "ddr4 32gb", 5000, None, 3600)]
    assert conn.execute("SELECT name, burst FROM sources").fetchall() == [("shop", 2)]
    ids = dict(conn.execute("SELECT name, id FROM watches").fetchall())

    # Updated in place by name; a watch no longer declared stays.
    with_pipeline(path, {"sources": {"shop": {"search_url": SEARCH, "burst": 5}},
                         "watches": {"ram": {"source": "shop", "query": "ddr4 64gb", "target_price": 90}}})
    assert cli("reload", config=path).returncode == 0
    wait_for(lambda: scalar(conn, "SELECT query FROM watches WHERE name = 'ram'") == "ddr4 64gb", 20,
             message="the changed watch synced")
    assert dict(conn.execute("SELECT name, id FROM watches").fetchall()) == ids
    assert scalar(conn, "SELECT burst FROM sources") == 5
    assert "config sync: updated" in s.log()

    pruned = cli("tracker", "sync", "--prune", "--json", config=path)
    assert pruned.returncode == 0, pruned.stderr
    assert yaml.safe_load(pruned.stdout)["removed"] == ["watch gpu"]
    assert [r[0] for r in conn.execute("SELECT name FROM watches")] == ["ram"]


def test_a_declared_watch_carries_its_re_alerts(conn, database_url):
    from actors import catalog

    source = {"shop": {"search_url": SEARCH}}
    report = catalog.sync(conn, {"sources": source, "watches": {"ram": {"source": "shop", "query": "ddr4",
                                                                          "re_alerts": True}}})
    assert report.created == ["source shop", "watch ram"]
    assert scalar(conn, "SELECT re_alerts FROM watches WHERE name = 'ram'") is True
    report = catalog.sync(conn, {"sources": source, "watches": {"ram": {"source": "shop", "query": "ddr4"}}})
    assert report.updated == ["watch ram"]  # the key left out: back to the config's default
    assert scalar(conn, "SELECT re_alerts FROM watches WHERE name = 'ram'") is None
