"""The directory where the children write their Prometheus metrics (multiprocess mode).

Set in the environment before the first fork, so every child (workers and the
HTTP child) inherits it; the HTTP child sums the files at scrape time. When the
master reaps a child it marks the pid dead, which drops that child's live gauges
(counters and histograms keep counting, as Prometheus expects of a restart).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ..defaults import METRICS_DIR_ENV

log = logging.getLogger(__name__)


class MetricsDir:
    def __init__(self) -> None:
        self.path: Path | None = None
        self.owned = False

    def open(self) -> None:
        """Use $PROMETHEUS_MULTIPROC_DIR when set, else a fresh directory of this master's."""
        given = os.environ.get(METRICS_DIR_ENV)
        if given:
            self.path = Path(given)
            self.path.mkdir(parents=True, exist_ok=True)
            return
        self.path = Path(tempfile.mkdtemp(prefix="actor-supervisor-metrics-"))
        self.owned = True
        os.environ[METRICS_DIR_ENV] = str(self.path)

    def mark_dead(self, pid: int) -> None:
        if self.path is None:
            return
        # Imported after open(): prometheus_client reads the environment at import.
        from prometheus_client import multiprocess

        try:
            multiprocess.mark_process_dead(pid, str(self.path))
        except OSError as exc:
            log.warning("could not drop the metrics of pid %d: %s", pid, exc)

    def close(self) -> None:
        if self.owned and self.path is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.path)
            if os.environ.get(METRICS_DIR_ENV) == str(self.path):
                del os.environ[METRICS_DIR_ENV]
