"""The limit keys over real HTTP (`supervisor http` with role tokens): the Limits page,
`GET /api/v1/limits` and /metrics show keys jobs wait on (no bucket yet included); a
change of a key's limits needs an operator's token, says what was wrong with a bad value
in one line, is written to the audit log, and the next claim obeys it."""

from __future__ import annotations

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, scalar
from tests.test_flow_claim import add, claim

TOKENS = {"vic": ("viewer", "VIC_TOKEN", "v-secret"), "olga": ("operator", "OLGA_TOKEN", "o-secret")}


def _server(http_server, tmp_path):
    data = yaml.safe_load((ROOT / "config" / "supervisor.yaml").read_text())
    data["http"] = {"tokens": {name: {"role": role, "secret_env": env} for name, (role, env, _) in TOKENS.items()}}
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return http_server("-c", str(path), env={env: secret for _, env, secret in TOKENS.values()})


def test_keys_are_seen_on_the_page_the_api_and_metrics_and_changed_with_an_operators_token(conn, http_server,
                                                                                           tmp_path):
    add(conn, "shop:1", 3, limits={"r": 50.0, "b": 5})
    add(conn, "shop/2", 1, limits={"c": 1})
    s = _server(http_server, tmp_path)
    as_ = {name: {"Authorization": f"Bearer {secret}"} for name, (_, _, secret) in TOKENS.items()}

    keys = {k["key"]: k for k in s.client.get("/api/v1/limits").json()["keys"]}
    assert (keys["shop:1"]["waiting"], keys["shop:1"]["rate"], keys["shop:1"]["tokens"]) == (3, 50.0, 5.0)
    assert keys["shop/2"]["concurrency"] == 1 and keys["shop/2"]["override"] is None
    assert scalar(conn, "SELECT count(*) FROM rate_limiter_state") == 0  # seen before any bucket
    page = s.client.get("/limits").text
    assert '<tr data-key="shop:1">' in page and '<td class="n waiting">3</td>' in page
    assert '<td class="rate">50/s</td>' in page and 'id="buckets"' in page  # the buckets' table stays
    assert 'data-needs="operator"' in page  # the form, for an operator's token

    # No token: 401; a viewer's: 403; a bad value: 400 in one line; nothing changed.
    url = "/api/v1/limits/shop:1"
    assert s.client.put(url, json={"rate": "1/s"}).status_code == 401
    r = s.client.put(url, json={"rate": "1/s"}, headers=as_["vic"])
    assert r.status_code == 403 and r.json()["needs"] == "operator" and r.json()["action"] == "limits.set"
    r = s.client.put(url, json={"concurrency": 0}, headers=as_["olga"])
    assert r.status_code == 400 and r.json()["error"] == "concurrency: expected a whole number >= 1 or none, got 0"
    assert scalar(conn, "SELECT count(*) FROM rate_limiter_state WHERE override IS NOT NULL") == 0

    r = s.client.put(url, json={"rate": "2/s burst 1"}, headers=as_["olga"])
    assert r.status_code == 200 and r.json()["override"] == {"rate": 2.0, "burst": 1}
    assert r.json()["override_by"] == "token olga"
    with conn.transaction():
        took, _ = claim(conn, 8)
    assert [k for k, _ in took] == ["shop/2", "shop:1"]  # one token of the override's burst, not 5
    # A key with a slash, through the dashboard's form (the same guard, the same audit).
    r = s.client.post("/ui/limits/set", json={"key": "shop/2", "concurrency": "none", "rate": ""},
                      headers={"X-Supervisor-Token": "o-secret"})
    assert r.status_code == 200 and r.json()["message"] == "limit shop/2: override set (concurrency none)"

    text = s.client.get("/metrics").text
    samples = {(x.name, x.labels.get("key")): x.value
               for family in text_string_to_metric_families(text) for x in family.samples}
    assert samples[("actor_supervisor_limit_waiting", "shop:1")] == 2
    assert samples[("actor_supervisor_limit_rate_per_second", "shop:1")] == 2.0
    assert samples[("actor_supervisor_limit_burst", "shop:1")] == 1  # the override's
    assert samples[("actor_supervisor_limit_tokens", "shop:1")] <= 1
    assert samples[("actor_supervisor_limit_running", "shop/2")] == 1
    assert samples[("actor_supervisor_limit_override", "shop/2")] == 1
    assert ("actor_supervisor_limit_concurrency", "shop/2") not in samples  # lifted

    r = s.client.delete("/api/v1/limits/shop/2", headers=as_["olga"])
    assert r.json() == {"key": "shop/2", "cleared": True, "previous": {"concurrency": None}}
    assert s.client.delete("/api/v1/limits/shop/2", headers=as_["olga"]).json()["cleared"] is False
    audited = conn.execute("SELECT token_name, action, target, status, detail->'override' FROM audit_log"
                           " ORDER BY id").fetchall()
    assert audited == [
        (None, "limits.set", "key shop:1", 401, None), ("vic", "limits.set", "key shop:1", 403, None),
        ("olga", "limits.set", "key shop:1", 400, None),
        ("olga", "limits.set", "limit shop:1", 200, {"rate": 2.0, "burst": 1}),
        ("olga", "limits.set", "limit shop/2", 200, {"concurrency": None}),
        ("olga", "limits.clear", "limit shop/2", 200, None), ("olga", "limits.clear", "limit shop/2", 200, None)]
    spec = s.client.get("/api/v1/openapi.json").json()["paths"]
    assert {"get"} <= set(spec["/api/v1/limits"]) and {"put", "delete"} <= set(spec["/api/v1/limits/{key}"])
