"""OpenTelemetry traces from a send into the job (supervisor/broker/tracing.py): a
producer in this process (the SDK set up in code, its in-memory exporter) sends jobs
inside its own span to a real `opentelemetry-instrument supervisor run` (console
exporter, the standard OTEL_* variables, a forked worker process); each run's span is
read back from the master's output and sits in the sender's trace under its send span,
with the messaging attributes; a retry is a second span in the same trace, the
exception recorded on the first. Without instrumenting, nothing of OpenTelemetry loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.broker import tracing
from tests.conftest import scalar, wait_for
from tests.supervisor_helpers import log_producer, role, write_config

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

INSTRUMENT = str(Path(sys.executable).with_name("opentelemetry-instrument"))
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none",
           "OTEL_SERVICE_NAME": "workers", "OTEL_BSP_SCHEDULE_DELAY": "200"}


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(provider)
    try:
        yield provider, exporter
    finally:
        tracing.uninstrument()


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the console exporter printed (indented JSON objects among log lines)."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (at := text.find("\n{\n", at)) >= 0:
        span, end = decoder.raw_decode(text, at + 1)
        spans.append(span)
        at = end
    return spans


def test_a_send_s_trace_goes_on_in_the_forked_worker_s_run(conn, database_url, tmp_path, supervisor, traced):
    provider, exporter = traced
    cfg = write_config(tmp_path / "sup.yaml", database_url, {"w": role(processes=1, threads=2)}, log_json=True)
    s = supervisor(cfg, env=CONSOLE, launcher=(INSTRUMENT,))
    s.wait_state({"w": 1})
    with log_producer(database_url, "tests", {"record": {}, "flaky": {}}) as producer, \
            provider.get_tracer("test").start_as_current_span("request") as request:
        sent = [producer.actors["record"].send(i) for i in range(5)]
        retried = producer.actors["flaky"].send(1)  # fails once, then succeeds
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 6, 60,
             message="the jobs succeeded")
    assert s.terminate() == 0  # the worker flushes its spans as it shuts down

    trace_id = request.get_span_context().trace_id
    sends = {sp.attributes["messaging.message.id"]: sp for sp in exporter.get_finished_spans()
             if sp.kind == SpanKind.PRODUCER}
    assert set(sends) == {m.message_id for m in [*sent, retried]}
    for sp in sends.values():
        assert sp.name == "send tests" and sp.parent is not None
        assert (sp.context.trace_id, sp.parent.span_id) == (trace_id, request.get_span_context().span_id)
        assert sp.attributes["messaging.system"] == "actor_supervisor"
        assert sp.attributes["messaging.destination.name"] == "tests"
        assert sp.attributes["messaging.operation.type"] == "send"

    runs: dict[str, list[dict[str, Any]]] = {}
    for span in console_spans(s.log()):
        if span["kind"] == "SpanKind.CONSUMER":
            runs.setdefault(span["attributes"]["messaging.message.id"], []).append(span)
    assert set(runs) == set(sends), s.log()[-3000:]
    for job_id, spans in runs.items():
        for span in spans:
            assert span["name"] == "process tests"
            assert int(span["context"]["trace_id"], 16) == trace_id  # in the sender's trace
            assert int(span["parent_id"], 16) == sends[job_id].context.span_id  # under its send
            a = span["attributes"]
            assert (a["messaging.system"], a["messaging.operation.type"], a["messaging.destination.name"]) == (
                "actor_supervisor", "process", "tests")
            assert span["resource"]["attributes"]["service.name"] == "workers"
    for m in sent:
        [run] = runs[m.message_id]
        assert (run["attributes"]["messaging.actor_supervisor.actor"],
                run["attributes"]["messaging.actor_supervisor.outcome"],
                run["attributes"]["messaging.actor_supervisor.attempt"]) == ("record", "succeeded", 1)
    first, second = sorted(runs[retried.message_id], key=lambda sp: sp["attributes"]["messaging.actor_supervisor.attempt"])
    assert first["attributes"]["messaging.actor_supervisor.outcome"] == "retried"
    assert first["status"]["status_code"] == "ERROR" and "planned failure" in first["status"]["description"]
    [event] = first["events"]
    assert event["name"] == "exception" and event["attributes"]["exception.type"] == "RuntimeError"
    assert second["attributes"]["messaging.actor_supervisor.outcome"] == "succeeded"
    assert second["attributes"]["messaging.actor_supervisor.attempt"] == 2

    # Each job's JSON log line (written off the job's thread) names its run's span.
    lines = [json.loads(line) for line in s.log().splitlines()
             if line.startswith("{") and '"logger": "supervisor.jobs"' in line]
    by_job = {(line["job_id"], line["outcome"]): line for line in lines}
    for m in sent:
        [run] = runs[m.message_id]
        line = by_job[(m.message_id, "succeeded")]
        assert (line["trace_id"], line["span_id"]) == (run["context"]["trace_id"][2:], run["context"]["span_id"][2:])


def test_nothing_of_opentelemetry_loads_until_instrumented(database_url) -> None:
    code = """
import sys
import dramatiq
import supervisor
from supervisor.broker.broker import PostgresBroker
from supervisor.broker import tracing
from supervisor.worker import process
broker = PostgresBroker(sys.argv[1])
dramatiq.actor(broker=broker, queue_name="tests", actor_name="noop")(lambda: None)
broker.actors["noop"].send()
broker.close()
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded and tracing.active is None, loaded
assert not any(type(m).__name__ == "TraceJobs" for m in broker.middleware)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code, database_url], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
