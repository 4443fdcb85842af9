"""Put the current job off until later without spending one of its attempts.

``raise dramatiq.Retry(delay=...)`` would work, but attempts count claims, so a
job deferred by a paused source would use up its retry
budget without ever failing. Re-enqueueing the same message under the *same*
dedupe key is not possible either: the running job still holds that key until
it is acked. So a deferral is a fresh delayed message with the same actor,
arguments and options minus the dedupe key; the current job then ends
successfully. The deferred copy records why and how often it was put off.

``limits`` replaces the flow-control options the copy carries (supervisor/flow.py): a job
sent without its limits is sent again with them (scraping.py, extraction.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dramatiq.message import Message
from dramatiq.middleware import CurrentMessage

from supervisor import flow

log = logging.getLogger(__name__)

# Options that belong to one delivery of a message, not to the job it stands for.
_PER_DELIVERY = {"dedupe_key", "retries", "traceback", "eta", "max_attempts"}


def defer(broker, delay_ms: int, reason: str, limits: Mapping[str, Any] | None = None) -> Message:
    current = CurrentMessage.get_current_message()
    if current is None:
        raise RuntimeError("defer() must be called from inside an actor")
    dropped = _PER_DELIVERY | (flow.OPTIONS | {flow.KEY_ERROR} if limits is not None else set())
    options = {k: v for k, v in current.options.items() if k not in dropped}
    options.update(limits or {})
    options["deferrals"] = int(current.options.get("deferrals", 0)) + 1
    options["deferred_because"] = reason
    if current.options.get("dedupe_key"):
        options["origin_dedupe_key"] = current.options["dedupe_key"]
    message: Message[Any] = Message(
        queue_name=current.queue_name,
        actor_name=current.actor_name,
        args=tuple(current.args),
        kwargs=dict(current.kwargs),
        options=options,
    )
    delay_ms = max(0, int(delay_ms))
    sent = broker.enqueue(message, delay=delay_ms)
    log.info("%s deferred by %.1fs (%s) as %s", current.actor_name, delay_ms / 1000, reason, sent.message_id)
    return sent
