"""The claim's execution time in PostgreSQL, from the server's own log.

A worker started with ``PGOPTIONS=-c log_min_duration_statement=0`` (``WORKER_PGOPTIONS``:
a superuser setting, so the bench's role must be one) has every statement it runs logged
with its duration; ``claim_ms`` reads those of the log's claim (``job_log_claim``) and of
job_queue's (``FOR UPDATE SKIP LOCKED``) that started in a window. The worker's own timing
of a claim (soak_trace) adds the round trip, decoding the rows and waiting for the GIL: the
two apart tell the database's part of a slow claim from the worker's.

The log must be the server's stderr log with ``log_line_prefix`` starting ``%m`` (Debian's
default: ``%m [%p] %q%u@%d``) in UTC (``log_timezone``), readable by the bench; a
statement's text follows its ``duration:`` line on the lines after it.
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import re
from datetime import UTC, datetime
from pathlib import Path

WORKER_PGOPTIONS = "-c log_min_duration_statement=0"
CLAIMS = ("job_log_claim(", "FOR UPDATE SKIP LOCKED")
_DURATION = re.compile(r"duration: ([0-9.]+) ms +execute ")


def size(path: Path) -> int:
    """Where the log ends now: read from here on."""
    return path.stat().st_size


def claim_ms(path: Path, offset: int, lo: float, hi: float) -> list[float]:
    """The durations (ms, sorted) of the claims the server logged after ``offset`` whose
    line is stamped in [lo, hi) (epoch seconds; the stamp is when the statement ended)."""
    out: list[float] = []
    pending: float | None = None
    with path.open(errors="replace") as f:
        f.seek(offset)
        for line in f:
            if line[:2].isdigit():  # a new entry: "2026-12-06 06:37:18.187 UTC [pid] ..."
                pending = None
                found = _DURATION.search(line)
                if found:
                    if line[24:27] != "UTC":
                        raise SystemExit(f"{path}: stamps are not in UTC ({line[:30]!r}): set log_timezone = 'UTC'")
                    at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
                    if lo <= at < hi:
                        pending = float(found.group(1))
                        if any(c in line for c in CLAIMS):
                            out.append(pending)
                            pending = None
            elif pending is not None and any(c in line for c in CLAIMS):
                out.append(pending)
                pending = None
    return sorted(out)
