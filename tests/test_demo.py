"""`supervisor demo`, end to end and shortened: deals found, each delivered to
the local webhook exactly once, forecasts written, and nothing left running."""

from __future__ import annotations

import re

import psutil
import psycopg

from tests.conftest import cli


def test_the_demo_shows_deals_notifications_and_forecasts_then_stops_everything(fresh_database):
    result = cli("demo", "--for", "30s", url=fresh_database, timeout=180)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    deals = re.findall(r"^deal found +#(\d+)", out, re.M)
    notified = dict(re.findall(r"^notified +#(\d+) +webhook received it (\d+) time", out, re.M))
    forecasts = re.findall(r"^forecast +(\S+):", out, re.M)
    assert len(deals) >= 3 and len(set(deals)) == len(deals)
    assert set(notified) == set(deals) and set(notified.values()) == {"1"}
    assert sorted(forecasts) == ["gpu:rtx3080", "ram:ddr4:32gb:3200", "ssd:nvme:1tb"]
    assert f"{len(deals)} deal(s) found, {len(deals)} notification(s) delivered (each exactly once)" in out

    master = int(re.search(r"supervisor running \(pid (\d+)", out).group(1))
    assert not psutil.pid_exists(master) or psutil.Process(master).status() == psutil.STATUS_ZOMBIE
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT count(*) FROM workers WHERE stopped_at IS NULL").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM notification_attempts WHERE status = 'succeeded'"
                            ).fetchone()[0] == len(deals)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "supervisor-demo-" in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
