"""What tracing costs a job, part by part (issue 40): the CPU of supervisor's consumer span
hooks (``broker/tracing.py`` TraceJobs: before and after a run) per job, in one process, with
the OpenTelemetry SDK set up each way a user can have it.

    python bench/span_cost.py [--spans 20000] [--rounds 3]

Cases, alternated round by round (the best round of each counts): ``sdk, no processor`` (the
span made and ended, exported nowhere: the SDK's own cost and ours), ``batch, null exporter``
(BatchSpanProcessor handing spans to an exporter that drops them), ``batch, console`` (the
launcher's `OTEL_TRACES_EXPORTER=console`: a JSON text with indent per span, to /dev/null),
``simple, console`` (the same exported on the job's thread), ``sampled 1 in 10`` (batch and
console, `parentbased_traceidratio` 0.1, the jobs' sends untraced so each is a root) and
``ours only`` (the hooks' own work: extracting the context, the attributes, attaching; the
tracer the API's no-op one). CPU is the process's (`time.process_time`: the batch thread's
export counts), per job. A W1 no-op job costs its workers 25-30 us of CPU untraced on this
machine (bench/README.md): the figures here are what tracing adds to that.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dramatiq.broker import MessageProxy
from dramatiq.message import Message


def _case(name: str, devnull: Any) -> tuple[Any, Any]:
    """A tracer provider set up as the case says, and what to flush at the end."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if name == "ours only":
        from opentelemetry.trace import NoOpTracerProvider
        return NoOpTracerProvider(), None
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(0.1)) if name.startswith("sampled") else TracerProvider()
    processor = {
        "sdk, no processor": None,
        "batch, null exporter": lambda: BatchSpanProcessor(Drop(), max_queue_size=1 << 20),
        "batch, console": lambda: BatchSpanProcessor(ConsoleSpanExporter(out=devnull), max_queue_size=1 << 20),
        "simple, console": lambda: SimpleSpanProcessor(ConsoleSpanExporter(out=devnull)),
        "sampled 1 in 10": lambda: BatchSpanProcessor(ConsoleSpanExporter(out=devnull), max_queue_size=1 << 20),
    }[name]
    if processor is not None:
        provider.add_span_processor(processor())
    return provider, provider


CASES = ("ours only", "sdk, no processor", "batch, null exporter", "batch, console", "simple, console",
         "sampled 1 in 10")


def _run(provider: Any, flush: Any, spans: int) -> float:
    """CPU us per job of TraceJobs' before and after hooks over ``spans`` jobs."""
    from supervisor.broker.tracing import TraceJobs, Tracing

    hooks = TraceJobs(Tracing(provider))
    messages = [MessageProxy(Message(queue_name="default", actor_name="noop", args=(), kwargs={}, options={}))
                for _ in range(spans)]
    before: Callable[..., None] = hooks.before_process_message
    after: Callable[..., None] = hooks.after_process_message
    start = time.process_time()
    for m in messages:
        before(None, m)  # type: ignore[arg-type]
        after(None, m, result=None)  # type: ignore[arg-type]
    if flush is not None:
        flush.force_flush()  # the batch thread's export of the last spans counts too
    return (time.process_time() - start) / spans * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spans", type=int, default=20000, help="jobs per case and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        print("span_cost.py needs the [otel] extra: pip install -e '.[otel]'", file=sys.stderr)
        return 2
    best: dict[str, float] = {}
    with open(os.devnull, "w") as devnull:
        for r in range(args.rounds):
            for name in CASES:
                provider, flush = _case(name, devnull)
                us = _run(provider, flush, args.spans)
                if flush is not None:
                    flush.shutdown()
                best[name] = min(us, best.get(name, us))
                print(f"round {r + 1}/{args.rounds}: {name:22s} {us:7.1f} us/job", flush=True)
    print(f"\nbest of {args.rounds} rounds, {args.spans:,} jobs each (CPU of the process per job)")
    for name in CASES:
        print(f"  {name:22s} {best[name]:7.1f} us/job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
