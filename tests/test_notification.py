"""Webhook delivery through the ledger, against a local receiver."""

from __future__ import annotations

import json
import logging
import time

import pytest
from werkzeug import Response

from tests.conftest import scalar, wait_for
from tests.pipeline_helpers import (
    make_alert,
    make_source,
    make_watch,
    running_worker,
)

SECRET = "s3cretT0ken-9f8e7d"


class Receiver:
    """A webhook endpoint whose answers the test scripts, one per request."""

    def __init__(self, server, path: str, answers=None):
        self.requests: list[dict] = []
        self.answers = list(answers or [])
        self.url = server.url_for(path)
        server.expect_request(path, method="POST").respond_with_handler(self.handle)

    def handle(self, request):
        self.requests.append({"headers": dict(request.headers), "json": request.get_json()})
        answer = self.answers.pop(0) if self.answers else (204, {}, 0)
        status, headers, delay = answer
        if delay:
            time.sleep(delay)
        return Response("" if status == 204 else json.dumps({"status": status}), status=status,
                        headers=headers, content_type="application/json")


@pytest.fixture
def deliver(conn, pipeline_broker, pipeline_config):
    """Make an alert for a webhook URL, run deliver_alert for it in a worker, return
    the final job status."""
    source_id = make_source(conn)

    def run(url: str, *, fmt: str = "auto", alert_id: int | None = None, final=("succeeded", "failed"),
            **options):
        from actors.notification import deliver_alert

        if alert_id is None:
            watch_id = make_watch(conn, source_id, "ddr4", webhook_url=url, webhook_format=fmt, name="RAM deals")
            alert_id = make_alert(conn, watch_id, source_id, external_id=f"x{time.monotonic_ns()}")
        with running_worker(pipeline_broker, queues=["notification"]):
            msg = deliver_alert.send_with_options(args=(alert_id,), **options)
            wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (msg.message_id,)) in final,
                     timeout=20, message="delivery to finish")
        return alert_id, msg.message_id, scalar(conn, "SELECT status FROM jobs WHERE id = %s", (msg.message_id,))

    return run


def attempts(conn, alert_id):
    return conn.execute("SELECT status, http_status FROM notification_attempts WHERE alert_id = %s ORDER BY id",
                        (alert_id,)).fetchall()


def test_delivers_generic_json_once(conn, deliver, threaded_server):
    hook = Receiver(threaded_server, "/hook")
    alert_id, _, status = deliver(hook.url)
    assert status == "succeeded" and len(hook.requests) == 1
    body, headers = hook.requests[0]["json"], hook.requests[0]["headers"]
    assert body["event"] == "deal" and body["alert_id"] == alert_id and body["price_cents"] == 6000
    assert body["listing"]["title"] == "Corsair 32GB DDR4 3200" and body["watch"]["name"] == "RAM deals"
    assert headers["Idempotency-Key"] == f"alert-{alert_id}"
    assert attempts(conn, alert_id) == [("succeeded", 204)]
    assert scalar(conn, "SELECT notified FROM alerts WHERE id = %s", (alert_id,))
    # Sending it again finds the successful attempt and does nothing.
    _, _, again = deliver(hook.url, alert_id=alert_id)
    assert again == "succeeded" and len(hook.requests) == 1 and len(attempts(conn, alert_id)) == 1


def test_discord_embed(conn, deliver, threaded_server):
    hook = Receiver(threaded_server, "/api/webhooks/1/abc")
    deliver(hook.url, fmt="discord")
    body = hook.requests[0]["json"]
    embed = body["embeds"][0]
    assert embed["title"] == "Corsair 32GB DDR4 3200" and embed["url"].startswith("http://shop.example/item/")
    assert {"name": "Price", "value": "$60.00", "inline": True} in embed["fields"]
    assert body["allowed_mentions"] == {"parse": []}


def test_429_waits_for_retry_after(conn, deliver, threaded_server):
    hook = Receiver(threaded_server, "/hook", answers=[(429, {"Retry-After": "1"}, 0)])
    started = time.monotonic()
    alert_id, _, status = deliver(hook.url)
    assert status == "succeeded" and len(hook.requests) == 2
    assert time.monotonic() - started >= 1.0
    assert attempts(conn, alert_id) == [("failed", 429), ("succeeded", 204)]


def test_server_errors_retry_and_client_errors_fail(conn, deliver, threaded_server):
    flaky = Receiver(threaded_server, "/flaky", answers=[(503, {}, 0)])
    alert_id, _, status = deliver(flaky.url, min_backoff=100, max_backoff=100)
    assert status == "succeeded" and attempts(conn, alert_id) == [("failed", 503), ("succeeded", 204)]

    gone = Receiver(threaded_server, "/gone", answers=[(404, {}, 0)])
    alert_id, job_id, status = deliver(gone.url)
    assert status == "failed" and attempts(conn, alert_id) == [("failed", 404)]
    assert "PermanentDeliveryError" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (job_id,))
    assert not scalar(conn, "SELECT notified FROM alerts WHERE id = %s", (alert_id,))


def test_unreachable_webhook_records_an_unsent_attempt_and_retries(conn, deliver):
    alert_id, job_id, status = deliver("http://127.0.0.1:9/hook", final=("retryable", "failed"))
    assert status == "retryable"
    assert conn.execute("SELECT status, error_text LIKE 'ConnectError%%' FROM notification_attempts"
                        " WHERE alert_id = %s", (alert_id,)).fetchall() == [("failed", True)]


def test_a_timed_out_webhook_is_sent_again_with_backoff_by_default(conn, deliver, pipeline_config, threaded_server):
    """The receiver got the request but answered after our timeout: the outcome is
    unknown, so (by default) it is sent again with backoff, the same Idempotency-Key
    on every try, each attempt in the ledger."""
    pipeline_config["notification"] = {"timeout": 0.3}
    hook = Receiver(threaded_server, "/slow", answers=[(200, {}, 1.0)])
    alert_id, job_id, status = deliver(hook.url, min_backoff=100, max_backoff=100)
    assert status == "succeeded" and len(hook.requests) == 2
    assert [s for s, _ in attempts(conn, alert_id)] == ["unknown", "succeeded"]
    assert {r["headers"]["Idempotency-Key"] for r in hook.requests} == {f"alert-{alert_id}"}
    assert scalar(conn, "SELECT notified FROM alerts WHERE id = %s", (alert_id,))


def test_strict_mode_never_sends_an_unknown_outcome_twice(conn, deliver, pipeline_config, threaded_server):
    """`resend_unknown: false`: an unknown outcome is not resent (unless an operator asks)."""
    pipeline_config["notification"] = {"timeout": 0.3, "resend_unknown": False}
    hook = Receiver(threaded_server, "/slow", answers=[(200, {}, 1.0)])
    alert_id, job_id, status = deliver(hook.url)
    assert status == "failed" and len(hook.requests) == 1
    assert attempts(conn, alert_id) == [("unknown", None)]
    assert "DeliveryOutcomeUnknown" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (job_id,))
    _, _, again = deliver(hook.url, alert_id=alert_id)
    assert again == "failed" and len(hook.requests) == 1
    # An operator who knows the receiver deduplicates may resend it.
    from actors.notification import run_delivery

    assert run_delivery(alert_id, resend_unknown=True) == "delivered"
    assert len(hook.requests) == 2 and hook.requests[1]["headers"]["Idempotency-Key"] == f"alert-{alert_id}"
    assert [s for s, _ in attempts(conn, alert_id)] == ["unknown", "succeeded"]


def test_the_webhook_secret_never_reaches_logs_jobs_or_the_ledger(conn, deliver, threaded_server, caplog):
    caplog.set_level(logging.DEBUG)
    ok = Receiver(threaded_server, f"/api/hooks/123456/{SECRET}")
    deliver(ok.url)
    bad = Receiver(threaded_server, f"/hooks/{SECRET}/x", answers=[(404, {}, 0)])
    deliver(bad.url)
    deliver(f"http://127.0.0.1:9/{SECRET}?token={SECRET}", final=("retryable",))
    assert len(ok.requests) == 1 and len(bad.requests) == 1
    # Everything our side logged (the local receiver's own access log is not ours).
    ours = "\n".join(caplog.handler.format(r) for r in caplog.records if r.name != "werkzeug")
    assert "could not reach http://127.0.0.1:9/***?token=***" in ours
    assert SECRET not in ours
    stored = conn.execute("SELECT string_agg(coalesce(last_error, '') || options::text, ' ') FROM jobs").fetchone()[0]
    assert SECRET not in stored
    targets = [r[0] for r in conn.execute("SELECT target || coalesce(error_text, '') FROM notification_attempts")]
    assert targets and not any(SECRET in t for t in targets)
    assert any("/api/hooks/***/***" in t for t in targets)
