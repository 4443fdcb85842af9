"""Where a schedule's zone and next fires are shown: `supervisor schedules`, GET
/api/v1/schedules and the Schedules page; and the zone as `supervisor check` reads it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from supervisor.worker import scheduler_sql as sql
from tests.conftest import cli

CONFIG = """\
database: {{url: "{url}"}}
supervisor: {{timezone: Europe/Paris}}
roles:
  r: {{processes: 1, queues: [default], actors: [tests.sample_actors]}}
schedules:
  report: {{cron: "30 9 * * *", timezone: {zone}, actor: send_report, queue: default}}
  nightly: {{cron: "0 2 * * *", actor: cleanup, queue: default, catch_up: last}}
"""
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/none"


def config(tmp_path: Path, url: str = UNREACHABLE, zone: str = "America/New_York") -> Path:
    path = tmp_path / "supervisor.yaml"
    path.write_text(CONFIG.format(url=url, zone=zone))
    return path


def test_from_the_config_alone_when_the_database_is_unreachable(tmp_path):
    before = datetime.now(UTC)
    done = cli("schedules", "--json", config=config(tmp_path), env={"SUPERVISOR_CONFIG": ""})
    assert done.returncode == 0, done.stderr
    assert "last fires not shown" in done.stderr
    report, nightly = json.loads(done.stdout)
    assert (report["name"], report["cron"], report["timezone"], report["catch_up"], report["last_fire"]) == (
        "report", "30 9 * * *", "America/New_York", "none", None)
    assert (nightly["timezone"], nightly["catch_up"]) == ("Europe/Paris", "last")  # supervisor.timezone
    for entry, zone, wall in ((report, "America/New_York", (9, 30)), (nightly, "Europe/Paris", (2, 0))):
        times = [datetime.fromisoformat(t) for t in entry["next"]]
        assert len(times) == 3 and times == sorted(times) and times[0] > before
        for t in times:  # each at its wall-clock time, with the zone's offset of that day
            assert (t.hour, t.minute) == wall
            assert t.utcoffset() == t.astimezone(ZoneInfo(zone)).utcoffset()
    table = cli("schedules", config=config(tmp_path), env={"SUPERVISOR_CONFIG": ""})
    assert table.returncode == 0 and "America/New_York" in table.stdout and report["next"][0] in table.stdout


def test_the_last_fire_comes_from_the_database(tmp_path, database_url, conn):
    fired = datetime(2026, 3, 8, 13, 30, tzinfo=UTC)
    conn.execute(sql.ACQUIRE, {"name": "report", "holder": "h", "ttl_s": 0, "fire_at": fired})
    done = cli("schedules", "--json", config=config(tmp_path, url=database_url), env={"SUPERVISOR_CONFIG": ""})
    assert done.returncode == 0, done.stderr
    by_name = {s["name"]: s for s in json.loads(done.stdout)}
    assert by_name["report"]["last_fire"] == "2026-03-08T09:30:00-04:00"
    assert by_name["nightly"]["last_fire"] is None


def test_check_refuses_an_unknown_zone_in_one_line(tmp_path):
    path = config(tmp_path, zone="America/NewYork")
    done = cli("check", config=path, env={"SUPERVISOR_CONFIG": ""})
    assert done.returncode == 2
    (line,) = [line for line in done.stdout.splitlines() if "timezone" in line]
    assert line.strip() == (f"{path}:6: schedules.report.timezone: unknown time zone 'America/NewYork': "
                            "use an IANA name such as America/New_York, Europe/Paris or UTC")
    assert "Traceback" not in done.stderr


def test_the_api_and_the_page_show_the_zone_and_the_next_fire_in_utc_and_in_it(tmp_path, database_url, http_server):
    server = http_server("-c", str(config(tmp_path, url=database_url)), env={"SUPERVISOR_CONFIG": ""})
    found = {s["name"]: s for s in server.client.get("/api/v1/schedules").json()["schedules"]}
    report = found["report"]
    assert report["timezone"] == "America/New_York" and len(report["next"]) == 3
    utc, local = datetime.fromisoformat(report["next_fire"]), datetime.fromisoformat(report["next_fire_local"])
    assert utc.utcoffset().total_seconds() == 0 and utc == local and report["next"][0] == report["next_fire_local"]
    assert (local.hour, local.minute) == (9, 30) and local.utcoffset() == utc.astimezone(ZoneInfo(report["timezone"])).utcoffset()
    page = server.client.get("/schedules").text
    row = page[page.index('data-schedule="report"'):]
    row = row[:row.index("</tr>")]
    assert "America/New_York" in row
    assert local.strftime("%Y-%m-%d %H:%M ") in row and utc.strftime("%Y-%m-%d %H:%M UTC") in row


def test_a_bad_default_zone_is_named_by_its_key_and_line(tmp_path):
    from supervisor.config import ConfigError, parse

    text = CONFIG.format(url=UNREACHABLE, zone="UTC").replace("Europe/Paris", "Europe/Pariss")
    with pytest.raises(ConfigError, match="unknown time zone 'Europe/Pariss'") as err:
        parse(text, tmp_path / "s.yaml")
    assert (err.value.line, err.value.key) == (2, "supervisor.timezone")
