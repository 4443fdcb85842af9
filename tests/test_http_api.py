"""The HTTP server against a real database, over real HTTP on loopback."""

from __future__ import annotations

from tests.http_helpers import http_server  # noqa: F401 - fixture


def test_standalone_server_serves_reads_and_guards_actions(conn, http_server):  # noqa: F811
    conn.execute("INSERT INTO jobs (queue, actor) VALUES ('q1', 'a'), ('q1', 'a'), ('q2', 'b')")
    s = http_server(env={"SUPERVISOR_HTTP_TOKEN": "s3cret"})
    queues = {q["queue"]: q for q in s.client.get("/api/v1/queues").json()["queues"]}
    assert queues["q1"]["ready"] == 2 and queues["q2"]["ready"] == 1
    # No master runs: healthz says so, naming the reason.
    r = s.client.get("/healthz")
    assert r.status_code == 503 and "no master" in r.json()["problem"]
    # The repository's config/supervisor.yaml names roles, and no worker runs them.
    r = s.client.get("/readyz")
    assert r.status_code == 503 and any("role scraping: 0 of" in p for p in r.json()["problems"]), r.json()
    # Actions need the token.
    assert s.client.post("/api/v1/queues/q1/pause").status_code == 401
    assert s.client.post("/api/v1/queues/q1/pause", headers={"Authorization": "Bearer nope"}).status_code == 403
    schema = s.client.get("/api/v1/openapi.json").json()
    assert "/api/v1/queues" in schema["paths"]
