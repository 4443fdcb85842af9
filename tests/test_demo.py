"""`supervisor demo`, end to end and shortened: deals found, each delivered to
the local webhook exactly once, forecasts written, and nothing left running."""

from __future__ import annotations

import json

import psutil
import psycopg

from tests.conftest import cli


def test_the_demo_shows_deals_realerts_reextraction_notifications_and_forecasts_then_stops_everything(
        fresh_database):
    result = cli("demo", "--for", "45s", "--json", url=fresh_database, timeout=180)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    events = [json.loads(line) for line in result.stdout.splitlines()]
    of = {kind: [e for e in events if e["event"] == kind] for kind in {e["event"] for e in events}}
    deals = [e["alert_id"] for e in of["deal"] + of.get("realert", [])]
    assert len(of["deal"]) >= 3 and len(set(deals)) == len(deals)
    # A flash deal gone for a poll and back alerts again; an operator's re-extraction
    # (every listing, at priority 1) runs, and alerts nothing already notified.
    assert of.get("realert"), [e for e in events if e["event"] in ("deal", "realert")]
    assert {e["title"] for e in of["realert"]} <= {e["title"] for e in of["deal"]}
    (enqueued,) = of["reextract"]
    (reextracted,) = of["reextracted"]
    assert enqueued["listings"] >= 24 and reextracted["listings"] == enqueued["listings"]
    notified = {e["alert_id"]: e["received"] for e in of["notified"]}
    # Each delivered once; a deal found in the last second may still be on its way when the demo stops.
    assert set(notified) <= set(deals) and len(notified) >= 3 and set(notified.values()) == {1}
    assert sorted(e["product_key"] for e in of["forecast"]) == ["gpu:rtx3080", "ram:ddr4:32gb:3200", "ssd:nvme:1tb"]
    (summary,) = of["summary"]
    assert (summary["deals"], summary["realerts"], summary["delivered"], summary["forecasts"],
            summary["exactly_once"]) == (len(deals), len(of["realert"]), len(notified), 3, True)
    assert events[-1]["event"] == "stopped"

    (running,) = of["running"]
    master = running["pid"]
    assert not psutil.pid_exists(master) or psutil.Process(master).status() == psutil.STATUS_ZOMBIE
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT count(*) FROM workers WHERE stopped_at IS NULL").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM notification_attempts WHERE status = 'succeeded'"
                            ).fetchone()[0] >= len(notified)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "supervisor-demo-" in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
