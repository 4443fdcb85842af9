"""The notification role: deliver an alert to its watch's webhook, once.

Every delivery goes through the ledger (supervisor/ledger.py): skip when a
successful attempt exists; write the attempt in flight just before the request
leaves (from httpx's trace hook, once the connection is open); record status
code, error and duration after; mark the alert notified only on success.
429 waits for its Retry-After; 5xx and connection failures retry with backoff;
other 4xx fail. The webhook URL is a secret: only its redacted form is logged,
stored in the ledger or put in an error.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import dramatiq
import httpx
from dramatiq.middleware import CurrentMessage

from . import http, ledger, settings, store
from .queries import pipeline as sql
from .scoring import money

log = logging.getLogger(__name__)

QUEUE = "notification"


class DeliveryFailed(Exception):
    """The webhook did not take the alert; retried with backoff."""


class PermanentDeliveryError(Exception):
    """The webhook refused the alert for good (e.g. 404: the webhook was deleted)."""


class DeliveryOutcomeUnknown(Exception):
    """The request may have been received but its outcome was never recorded."""


@dataclass(frozen=True)
class Alert:
    id: int
    price_cents: int
    baseline_cents: float | None
    score: float | None
    reason: str
    notified: bool
    created_at: datetime
    watch_id: int
    watch_name: str | None
    query: str
    webhook_url: str | None
    webhook_format: str
    title: str
    url: str | None
    currency: str
    condition: str | None
    product_key: str | None
    price_type: str


def webhook_format(alert: Alert) -> str:
    if alert.webhook_format != "auto":
        return alert.webhook_format
    url = (alert.webhook_url or "").lower()
    discord = ("discord.com/api/webhooks/", "discordapp.com/api/webhooks/")
    return "discord" if any(d in url for d in discord) else "json"


def payload(alert: Alert, fmt: str, username: str) -> dict[str, Any]:
    price = money(alert.price_cents, alert.currency)
    if fmt == "discord":
        fields = [{"name": "Price", "value": price, "inline": True}]
        if alert.baseline_cents:
            fields.append({"name": "Typical", "value": money(alert.baseline_cents, alert.currency), "inline": True})
        if alert.condition:
            fields.append({"name": "Condition", "value": alert.condition[:100], "inline": True})
        embed = {
            "title": alert.title[:256],
            "description": alert.reason[:2000],
            "color": 0x2ECC71,
            "fields": fields,
            "footer": {"text": f"watch: {(alert.watch_name or alert.query)[:100]} · alert {alert.id}"},
            "timestamp": alert.created_at.isoformat(),
        }
        if alert.url:
            embed["url"] = alert.url
        return {"username": username, "embeds": [embed], "allowed_mentions": {"parse": []}}
    return {
        "event": "deal",
        "alert_id": alert.id,
        "watch": {"id": alert.watch_id, "name": alert.watch_name, "query": alert.query},
        "listing": {"title": alert.title, "url": alert.url, "condition": alert.condition,
                    "product_key": alert.product_key, "price_type": alert.price_type},
        "price_cents": alert.price_cents,
        "currency": alert.currency,
        "baseline_cents": alert.baseline_cents,
        "score": alert.score,
        "reason": alert.reason,
        "created_at": alert.created_at.isoformat(),
    }


@dramatiq.actor(queue_name=QUEUE, max_retries=8, min_backoff=5_000, max_backoff=600_000,
                throws=(PermanentDeliveryError, DeliveryOutcomeUnknown))
def deliver_alert(alert_id: int, resend_unknown: bool | None = None) -> None:
    run_delivery(alert_id, resend_unknown)


def run_delivery(alert_id: int, resend_unknown: bool | None = None) -> str:
    cfg = settings.notification()
    resend = cfg.resend_unknown if resend_unknown is None else resend_unknown
    current = CurrentMessage.get_current_message()
    job_id = current.message_id if current is not None else None
    job_attempt = getattr(current, "attempts", None)
    pool = store.pool()

    with pool.connection() as conn:
        row = conn.execute(sql.ALERT_FOR_DELIVERY, {"id": alert_id}).fetchone()
        if row is None:
            log.info("alert %s no longer exists; nothing to deliver", alert_id)
            return "alert does not exist"
        alert = Alert(*row)
        if not alert.webhook_url:
            return "watch has no webhook"
        target = http.redact_url(alert.webhook_url)
        seen = ledger.review(conn, alert_id, job_id, job_attempt)
    if seen.delivered:
        log.info("alert %s already delivered to %s; not sending again", alert_id, target)
        return "already delivered"
    if seen.unknown and not resend:
        raise DeliveryOutcomeUnknown(
            f"alert {alert_id}: an earlier request to {target} may have been received (attempts "
            f"{', '.join(map(str, seen.unknown))} have no recorded outcome); not resending to avoid a duplicate. "
            f"To resend anyway: deliver_alert.send({alert_id}, resend_unknown=True)"
        )
    return _send(pool, alert, target, job_id, job_attempt, cfg, resend)


def _send(pool, alert: Alert, target: str, job_id, job_attempt, cfg, resend: bool) -> str:
    assert alert.webhook_url is not None  # deliver() returned early without one
    webhook_url: str = alert.webhook_url
    attempt_id: int | None = None

    def trace(event: str, info: dict) -> None:
        nonlocal attempt_id
        # The connection is open and the request's first byte is about to be written.
        if event.endswith(".send_request_headers.started") and attempt_id is None:
            with pool.connection() as conn:
                attempt_id = ledger.begin(conn, alert.id, job_id, job_attempt, target)

    fmt = webhook_format(alert)
    body = payload(alert, fmt, cfg.username)
    started = time.monotonic()

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        with http.client(timeout=cfg.timeout) as client:
            response = client.post(
                webhook_url, json=body,
                headers={"Idempotency-Key": f"alert-{alert.id}"},
                extensions={"trace": trace},
            )
    except ledger.AlreadyDelivered:
        return "already delivered"
    except ledger.AttemptInFlight as exc:
        raise DeliveryFailed(str(exc)) from None
    except httpx.TransportError as exc:
        reason = f"{type(exc).__name__}: {exc}"
        with pool.connection() as conn:
            if attempt_id is None:
                ledger.record_unsent(conn, alert.id, job_id, job_attempt, target, reason, elapsed_ms())
                raise DeliveryFailed(f"alert {alert.id}: could not reach {target}: {reason}") from None
            # Sent, at least in part, but no answer: the receiver may have it.
            ledger.finish(conn, attempt_id, "unknown", error=reason, duration_ms=elapsed_ms())
        if resend:
            raise DeliveryFailed(f"alert {alert.id}: no answer from {target} ({reason}); resending") from None
        raise DeliveryOutcomeUnknown(
            f"alert {alert.id}: sent to {target} but no answer ({reason}); it may have been received, "
            "so it is not resent"
        ) from None

    status = response.status_code
    ok = 200 <= status < 300
    error = None if ok else f"HTTP {status}: {response.text[:300]}"
    with pool.connection() as conn:
        if attempt_id is None:  # cannot happen with HTTP/1.1; kept so a response is never lost
            attempt_id = ledger.begin(conn, alert.id, job_id, job_attempt, target)
        ledger.finish(conn, attempt_id, "succeeded" if ok else "failed", http_status=status, error=error,
                      duration_ms=elapsed_ms())
    if ok:
        log.info("alert %s delivered to %s (%s, HTTP %d)", alert.id, target, fmt, status)
        return "delivered"
    if status == 429:
        wait = http.retry_after_seconds(response, default=30.0)
        raise dramatiq.Retry(f"alert {alert.id}: {target} answered 429; retrying in {wait:.1f}s",
                             delay=int(wait * 1000))
    if status in http.TRANSIENT_STATUS:
        raise DeliveryFailed(f"alert {alert.id}: {target} answered HTTP {status}")
    raise PermanentDeliveryError(f"alert {alert.id}: {target} refused it with HTTP {status}: {response.text[:200]}")
