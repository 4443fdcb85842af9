"""OpenTelemetry traces from a send into the job (the ``[otel]`` extra).

A send is a PRODUCER span ``send <queue>``; it writes its W3C trace context into the
message's options (``traceparent``, and ``tracestate`` / ``baggage`` where there are
any: the global propagator's keys), so the context is stored with the job and survives
delays, retries (a retry keeps the options) and a release to another process. A run is
a CONSUMER span ``process <queue>`` whose parent is that context: an attempt is a span,
all of a job's attempts sit in the sender's trace. Attributes follow the messaging
semantic conventions (``messaging.system``, ``messaging.operation.type``,
``messaging.destination.name``, ``messaging.message.id``, a batch's
``messaging.batch.message_count``) plus ``messaging.actor_supervisor.actor``,
``.attempt`` and ``.outcome``; an exception is recorded on the span, its status ERROR.

Turned on by ``instrument()``: by ``opentelemetry-instrument`` (the entry point
``opentelemetry_instrumentor``: ``instrumentor.SupervisorInstrumentor``), or by a
program that sets up its SDK in code. Until then ``active`` is None, the producer pays
one attribute check per send, a worker has no tracing middleware, and nothing of
OpenTelemetry is imported. The SDK set up in the master before it forks carries into
each worker: the SDK's batch processor starts its thread again in the child (its
``os.register_at_fork`` hook), and each worker flushes its spans at shutdown (a forked
child ends with ``os._exit``, which runs no atexit hook).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import dramatiq.broker
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from .message import PgMessageProxy

SYSTEM = "actor_supervisor"  # messaging.system: ours is no system the conventions list
NAME = "actor-supervisor"  # the instrumentation scope (the distribution's name)


class Tracing:
    """The tracer and the propagator the producer and the workers of this process use."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.trace, self.context, self.propagate = trace, context, propagate
        self.kinds = SpanKind
        self.status, self.code = Status, StatusCode
        self.provider = tracer_provider
        self.tracer = trace.get_tracer(NAME, tracer_provider=tracer_provider)

    @contextlib.contextmanager
    def sending(self, messages: Sequence[Message[Any]]) -> Iterator[None]:
        """One PRODUCER span around a send of ``messages`` (one queue's, or the first's
        named), its context written into each message's options."""
        first = messages[0]
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "send",
            "messaging.destination.name": first.queue_name,
        }
        if len(messages) == 1:
            attributes["messaging.message.id"] = first.message_id
            attributes["messaging.actor_supervisor.actor"] = first.actor_name
        else:
            attributes["messaging.batch.message_count"] = len(messages)
        with self.tracer.start_as_current_span(f"send {first.queue_name}", kind=self.kinds.PRODUCER,
                                               attributes=attributes):
            for message in messages:
                self.propagate.inject(message.options)
            yield

    def flush(self) -> None:
        provider = self.provider or self.trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)  # the SDK's; the API's no-op has none
        if flush is not None:
            flush()


class TraceJobs(Middleware):
    """The CONSUMER span of each run, its parent the context the send stored. First in
    the broker's list: its span is open around every other hook, and it ends after
    Retries has chosen the outcome."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._open: dict[str, tuple[Any, Any, int | None]] = {}  # job id -> span, context token, thread

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        t = self.tracing
        parent = t.propagate.extract(message.options)
        span = t.tracer.start_span(f"process {message.queue_name}", context=parent, kind=t.kinds.CONSUMER,
                                   attributes={
                                       "messaging.system": SYSTEM, "messaging.operation.type": "process",
                                       "messaging.operation.name": "process",
                                       "messaging.destination.name": message.queue_name,
                                       "messaging.message.id": message.message_id,
                                       "messaging.actor_supervisor.actor": message.actor_name,
                                       "messaging.actor_supervisor.attempt": getattr(message, "attempts", 1),
                                   })
        # Current for the actor's code (its own spans are children, its log lines carry the
        # ids). An async actor's job attaches in the job's own context, which goes with it.
        token = t.context.attach(t.trace.set_span_in_context(span, parent))
        in_thread = getattr(message, "interrupt", None) is None
        self._open[message.message_id] = (span, token, threading.get_ident() if in_thread else None)
        ids = span.get_span_context()
        if ids.is_valid and isinstance(message, PgMessageProxy):  # for its log line (worker/joblog.py)
            message.trace_ids = {"trace_id": format(ids.trace_id, "032x"), "span_id": format(ids.span_id, "016x")}

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        outcome = "succeeded" if exception is None else "failed" if message.failed else "retried"
        self._end(message, outcome, exception)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._end(message, "failed" if message.failed else "skipped", None)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.tracing.flush()  # a forked worker ends with os._exit: no atexit hook flushes

    def _end(self, message: MessageProxy, outcome: str, exception: BaseException | None) -> None:
        opened = self._open.pop(message.message_id, None)
        if opened is None:
            return
        span, token, thread = opened
        span.set_attribute("messaging.actor_supervisor.outcome", outcome)
        if exception is not None:
            span.record_exception(exception)
            t = self.tracing
            span.set_status(t.status(t.code.ERROR, f"{type(exception).__name__}: {exception}"))
        span.end()
        if thread == threading.get_ident():
            self.tracing.context.detach(token)


# The process's tracing, once instrument() ran (None: off, nothing imported).
active: Tracing | None = None


def instrument(tracer_provider: Any = None) -> Tracing:
    """Trace sends and runs in this process from now on (and in the workers it forks).
    A broker made earlier (the global one) gets the consumer middleware too."""
    global active
    active = Tracing(tracer_provider)
    broker = dramatiq.broker.global_broker  # not get_broker(), which would make one
    if broker is not None:  # else each broker made from now on adds it
        add_to(broker)
    return active


def uninstrument() -> None:
    global active
    active = None
    broker = dramatiq.broker.global_broker
    if broker is not None:
        for m in [m for m in broker.middleware if isinstance(m, TraceJobs)]:
            broker.middleware.remove(m)


def add_to(broker: Broker) -> None:
    """The consumer middleware, first in ``broker``'s list (where tracing is on)."""
    if active is None or any(isinstance(m, TraceJobs) for m in broker.middleware):
        return
    first = type(broker.middleware[0]) if broker.middleware else None
    broker.add_middleware(TraceJobs(active), before=first)

