"""The dashboards and autoscaling as code (deploy/): every metric the Grafana dashboard
and the KEDA example query is one a running system exports, read from the /metrics of
a real `supervisor run` (its HTTP child and worker process) after real jobs; the KEDA
example's PostgreSQL query runs on the real schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml

from tests.conftest import scalar, wait_for
from tests.http_helpers import free_port
from tests.supervisor_helpers import role, write_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "actor-supervisor.json"
KEDA = DEPLOY / "keda" / "scaledobject.yaml"

# What a PromQL expression names that is no metric: functions are followed by "(",
# label lists and selectors are cut out first; these are the rest.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
# The sample names a family of each type exports (prometheus_client's text format).
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("", "_sum", "_count"), "untyped": ("",)}


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings ($queue, label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # selectors
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w$])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if m.group(2) is None and m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    return names


def test_metric_names_reads_promql() -> None:
    assert metric_names('histogram_quantile(0.95, sum by (le, actor_name) (rate(x_bucket{queue_name=~"$q"}'
                        '[$__rate_interval])))') == {"x_bucket"}
    assert metric_names('max(a{hours="1"}) / on (queue) b == 1') == {"a", "b"}


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(re.sub(r"^label_values\((\w+),.*\)$", r"\1", var["definition"]))
    return exprs


def keda_documents() -> dict:
    return yaml.safe_load(KEDA.read_text())


def exported(text: str) -> set[str]:
    """Every sample name /metrics declares (a family with no samples yet counts: its TYPE is there)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        base = name[:-len("_total")] if kind == "counter" and name.endswith("_total") else name
        names.update(base + s for s in SUFFIXES[kind])
    return names


def test_every_metric_the_dashboard_and_keda_query_is_exported(conn, database_url, tmp_path, supervisor):
    port = free_port()
    cfg = write_config(tmp_path / "sup.yaml", database_url, {"w": role(processes=1, threads=2)})
    data = yaml.safe_load(cfg.read_text())
    data["http"] = {"listen": f"127.0.0.1:{port}"}
    cfg.write_text(yaml.safe_dump(data))
    s = supervisor(cfg)
    s.wait_state({"w": 1, "http": 1})
    # Jobs that fill every worker family: runs, an error, a retry and a dead letter.
    conn.execute("INSERT INTO jobs (queue, actor, args, max_attempts) SELECT 'tests', 'noop', '[]', 1 "
                 "FROM generate_series(1, 5)")
    conn.execute("INSERT INTO jobs (queue, actor, args, max_attempts) VALUES ('tests', 'flaky', '[9]', 2)")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed')") == 6, 60,
             message="the jobs finished")
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=20).text
    have = exported(text)

    queries = dashboard_queries()
    [trigger] = [t for t in keda_documents()["spec"]["triggers"] if t["type"] == "prometheus"]
    queries.append(trigger["metadata"]["query"])
    wanted = set().union(*(metric_names(q) for q in queries))
    assert len(wanted) >= 20, wanted  # the board covers the families, not a token few
    missing = sorted(wanted - have)
    assert not missing, f"queried but not exported: {missing}"
    # The families the board is about all carry samples after these jobs.
    for name in ("dramatiq_messages_total", "dramatiq_message_errors_total", "dramatiq_message_retries_total",
                 "dramatiq_message_rejects_total", "dramatiq_message_duration_milliseconds_bucket",
                 "actor_supervisor_jobs", "actor_supervisor_queue_workers_needed"):
        assert re.search(rf"^{name}\{{", text, re.M), name

    # The commented PostgreSQL trigger: its query runs on the schema and counts no due job now.
    [query] = re.findall(r"^\s*#\s*query: (SELECT .*)$", KEDA.read_text(), re.M)
    assert conn.execute(query).fetchone()[0] == 0
    conn.execute("INSERT INTO jobs (queue, actor, args, run_at) VALUES ('default', 'noop', '[]', now())")
    assert conn.execute(query).fetchone()[0] == 1


def test_the_dashboard_is_grafana_s_model() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        if p["type"] != "row":
            assert p["targets"] and p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
