"""Workflows seen and steered (issue 41, item 4 less the dashboard): GET /api/v1/workflows and
/api/v1/workflows/{id}, `supervisor workflows list|show|cancel|retry` (--json, one-line
errors), the gauge of workflows per state, a step's workflow on its job's page."""

from __future__ import annotations

import json

import dramatiq
from prometheus_client.parser import text_string_to_metric_families

import supervisor
from supervisor.broker import PostgresBroker
from tests.conftest import cli, scalar


def _sent(broker: PostgresBroker, n: int = 2) -> list[supervisor.Workflow]:
    """Workflows written, none run (no worker): a root enqueued and a blocked child each."""
    act = dramatiq.actor(broker=broker, queue_name="wfapi", actor_name="wfapi_step")(lambda *a: None)
    out = []
    for i in range(n):
        wf = supervisor.workflow(f"api-{i}", broker=broker)
        root = wf.add(act.message(i))
        wf.add(act.message(), after=[root])
        out.append(wf.send())
    return out


def test_the_api_lists_pages_and_shows_workflows_and_the_metrics_count_them(conn, broker, http_server):
    first, second = _sent(broker)
    s = http_server()
    page = s.client.get("/api/v1/workflows", params={"limit": 1}).json()
    assert [w["id"] for w in page["workflows"]] == [second.id] and page["next_before"]
    rest = s.client.get("/api/v1/workflows", params={"limit": 1, "before": page["next_before"]}).json()
    assert [w["id"] for w in rest["workflows"]] == [first.id]
    assert s.client.get("/api/v1/workflows", params={"state": "failed"}).json()["workflows"] == []
    r = s.client.get("/api/v1/workflows", params={"state": "sideways"})
    assert r.status_code == 400 and "unknown state" in r.json()["error"]
    shown = s.client.get(f"/api/v1/workflows/{first.id}").json()
    assert shown["state"] == "running" and shown["steps"] == shown["steps"][:2]
    root, child = shown["steps"]
    assert (root["state"], child["state"], child["parents"], child["job_id"]) == ("enqueued", "blocked", [root["id"]],
                                                                                  child["id"])
    assert s.client.get("/api/v1/workflows/00000000-0000-0000-0000-000000000000").status_code == 404
    assert s.client.get("/api/v1/workflows/nope").status_code == 400
    assert s.client.get(f"/api/v1/jobs/{root['id']}").json()["workflow"] == first.id
    families = {f.name: f for f in text_string_to_metric_families(s.client.get("/metrics").text)}
    by_state = {x.labels["state"]: x.value for x in families["actor_supervisor_workflows"].samples}
    assert by_state == {"running": 2, "succeeded": 0, "failed": 0, "cancelled": 0}


def test_the_cli_lists_shows_cancels_and_retries(conn, broker, database_url):
    (wf,) = _sent(broker, 1)
    listed = cli("workflows", "list", "--json", url=database_url)
    assert listed.returncode == 0, listed.stderr
    assert [w["id"] for w in json.loads(listed.stdout)] == [wf.id]
    shown = cli("workflows", "show", wf.id, url=database_url)
    assert shown.returncode == 0 and "api-0" in shown.stdout and "blocked" in shown.stdout
    done = cli("workflows", "cancel", wf.id, "--json", url=database_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cancelled"] == 2
    assert scalar(conn, "SELECT state FROM workflows") == "cancelled"
    again = cli("workflows", "retry", wf.id, url=database_url)
    assert again.returncode == 0 and "retried 2" in again.stdout
    assert scalar(conn, "SELECT state FROM workflows") == "running"
    for args, text in [(("show", "nope"), "not a workflow or step id"),
                       (("cancel", "00000000-0000-0000-0000-000000000000"), "no workflow"),
                       (("retry", wf.id, "--step", "00000000-0000-0000-0000-000000000000"), "no step")]:
        bad = cli("workflows", *args, url=database_url)
        assert bad.returncode != 0 and bad.stderr.startswith(f"error: {text}") and "Traceback" not in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    helped = cli("workflows", "--help")
    assert helped.returncode == 0 and "cancel" in helped.stdout and "retry" in helped.stdout
