"""SupervisorInstrumentor: what ``opentelemetry-instrument`` finds by the entry point
``opentelemetry_instrumentor`` (as it finds Celery's), so

    OTEL_TRACES_EXPORTER=otlp opentelemetry-instrument supervisor run

traces every send and run (broker/tracing.py). Imported only by OpenTelemetry's
launcher or by a program that calls it: it needs opentelemetry-instrumentation (the
``[otel]`` extra), which the rest of the package never imports.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from . import tracing


class SupervisorInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # the instrumented code is this package itself

    def _instrument(self, **kwargs: Any) -> None:
        tracing.instrument(kwargs.get("tracer_provider"))

    def _uninstrument(self, **kwargs: Any) -> None:
        tracing.uninstrument()
