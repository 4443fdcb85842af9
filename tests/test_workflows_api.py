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


def test_the_api_cancels_and_retries_a_workflow_and_a_step_behind_the_token(conn, broker, http_server):
    wf, fresh = _sent(broker)
    s = http_server(env={"SUPERVISOR_HTTP_TOKEN": "s3cret"})
    auth = {"Authorization": "Bearer s3cret"}
    base = f"/api/v1/workflows/{wf.id}"
    r = s.client.post(f"{base}/cancel")
    assert r.status_code == 401 and r.json()["action"] == "workflows.cancel" and r.json()["needs"] == "operator"
    assert scalar(conn, "SELECT state FROM workflows WHERE id = %s", (wf.id,)) == "running"
    r = s.client.post(f"{base}/cancel", headers=auth)
    assert r.status_code == 200, r.text
    assert r.json() == {"workflow": wf.id, "step": None, "cancelled": 2, "interrupted": 0}
    assert scalar(conn, "SELECT state FROM workflows WHERE id = %s", (wf.id,)) == "cancelled"
    r = s.client.post(f"{base}/retry", headers=auth)
    assert r.json() == {"workflow": wf.id, "step": None, "retried": 2, "released": 1}
    root, child = (st["id"] for st in s.client.get(base).json()["steps"])
    # a step and its descendants: the child alone (blocked), then retried (its parent still enqueued)
    r = s.client.post(f"{base}/steps/{child}/cancel", headers=auth)
    assert r.json() == {"workflow": wf.id, "step": child, "cancelled": 1, "interrupted": 0}
    assert scalar(conn, "SELECT state FROM workflow_steps WHERE id = %s", (child,)) == "cancelled"
    r = s.client.post(f"{base}/steps/{child}/retry", headers=auth)
    assert r.json() == {"workflow": wf.id, "step": child, "retried": 1, "released": 0}
    assert scalar(conn, "SELECT state FROM workflow_steps WHERE id = %s", (child,)) == "blocked"
    # what is not there, what is no id, what cannot be retried
    nobody = "00000000-0000-0000-0000-000000000000"
    for path, status, text in [(f"/api/v1/workflows/{nobody}/cancel", 404, "no workflow"),
                               (f"{base}/steps/{nobody}/retry", 404, "no step"),
                               (f"{base}/steps/{fresh.id}/cancel", 404, "no step"),
                               ("/api/v1/workflows/nope/retry", 400, "not a workflow or step id"),
                               (f"/api/v1/workflows/{fresh.id}/retry", 409, f"workflow {fresh.id} has no ended step")]:
        r = s.client.post(path, headers=auth)
        assert r.status_code == status and r.json()["error"].startswith(text), (path, r.text)
    entries = s.client.get("/api/v1/audit").json()["entries"]
    done = [(e["action"], e["target"], e["status"]) for e in entries if e["status"] == 200]
    assert done[-1] == ("workflows.cancel", f"workflow {wf.id}", 200) and len(done) == 4
    schema = s.client.get("/api/v1/openapi.json").json()["paths"]
    assert {"/api/v1/workflows/{workflow_id}/cancel", "/api/v1/workflows/{workflow_id}/steps/{step_id}/retry"} <= set(schema)


def test_the_upkeep_prunes_finished_workflows_by_the_retention_of_their_state(conn, broker):
    from supervisor.config import parse
    from supervisor.registry import Registration
    from supervisor.worker.upkeep import Upkeep, UpkeepSettings

    ok, bad, live = _sent(broker, 3)
    conn.execute("UPDATE workflows SET state = 'succeeded', finished_at = now() - interval '8 days' WHERE id = %s",
                 (ok.id,))
    conn.execute("UPDATE workflows SET state = 'failed', finished_at = now() - interval '8 days' WHERE id = %s",
                 (bad.id,))
    registration = Registration(broker.pool, broker.owner, role="t", queues=["wfapi"])
    # the defaults: succeeded kept 7 days, failed 30
    counts = Upkeep(broker, registration, settings=UpkeepSettings(), state=lambda: "running").prune()
    assert counts["workflow steps"] == 2
    assert sorted(r[0] for r in conn.execute("SELECT id::text FROM workflows")) == sorted([bad.id, live.id])
    assert scalar(conn, "SELECT count(*) FROM workflow_steps WHERE workflow = %s", (ok.id,)) == 0
    # a shorter retention of failed jobs prunes the failed workflow; a running one stays, whatever its age
    conn.execute("UPDATE workflows SET created_at = now() - interval '90 days' WHERE id = %s", (live.id,))
    short = parse("roles: {w: {queues: [q], actors: [m]}}\nretention: {failed: 1d}\n").retention
    counts = Upkeep(broker, registration, settings=UpkeepSettings(retention=short), state=lambda: "running").prune()
    assert counts["workflow steps"] == 2
    assert [r[0] for r in conn.execute("SELECT id::text FROM workflows")] == [live.id]


def test_a_prune_batch_is_a_budget_of_steps(conn, broker):
    from supervisor.broker.sql import workflows as sql

    for wf in _sent(broker, 4):  # 2 steps each
        conn.execute("UPDATE workflows SET state = 'cancelled', finished_at = now() - interval '1 day' WHERE id = %s",
                     (wf.id,))
    # a budget of 3 steps: the first workflow (2), and the one that crosses it (2 more)
    assert conn.execute(sql.PRUNE, {"state": "cancelled", "older_than_s": 60, "limit": 3}).rowcount == 4
    assert scalar(conn, "SELECT count(*) FROM workflows") == 2
    assert conn.execute(sql.PRUNE, {"state": "cancelled", "older_than_s": 60, "limit": 100}).rowcount == 4
    assert conn.execute(sql.PRUNE, {"state": "cancelled", "older_than_s": 60, "limit": 100}).rowcount == 0
