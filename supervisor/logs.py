"""Logging for every process: one line per event on stderr (journald), JSON when configured."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

_STANDARD = set(vars(logging.makeLogRecord({})))


class SecondStamps(logging.Formatter):
    """formatTime as logging's, each second's text made once: a busy worker logs a line
    per job, many a second (the last second's text kept as one tuple: threads may race)."""

    _last: tuple[int, str | None, str] = (-1, None, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's
        second, fmt, text = self._last
        if second != int(record.created) or fmt != datefmt:
            second = int(record.created)
            text = time.strftime(datefmt or self.default_time_format, self.converter(record.created))
            self._last = (second, datefmt, text)
        if datefmt is None and self.default_msec_format:
            return self.default_msec_format % (text, record.msecs)
        return text


class JsonFormatter(SecondStamps):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "pid": os.getpid(),
            "msg": record.getMessage(),
        }
        otel = sys.modules.get("opentelemetry.trace")  # only where tracing is in use: no import here
        if otel is not None:
            ids = otel.get_current_span().get_span_context()
            if ids.is_valid:
                out["trace_id"], out["span_id"] = format(ids.trace_id, "032x"), format(ids.span_id, "016x")
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO", json_logs: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(SecondStamps(f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
