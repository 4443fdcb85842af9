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
from types import ModuleType

from ..defaults import METRICS_DIR_ENV

log = logging.getLogger(__name__)


class MetricsDir:
    def __init__(self) -> None:
        self.path: Path | None = None
        self.owned = False
        self._multiprocess: ModuleType | None = None

    def open(self) -> None:
        """Use $PROMETHEUS_MULTIPROC_DIR when set, else a fresh directory of this master's."""
        given = os.environ.get(METRICS_DIR_ENV)
        if given:
            self.path = Path(given)
            self.path.mkdir(parents=True, exist_ok=True)
        else:
            self.path = Path(tempfile.mkdtemp(prefix="actor-supervisor-metrics-"))
            self.owned = True
            os.environ[METRICS_DIR_ENV] = str(self.path)
        # Imported now, at start: after the variable is set (prometheus_client reads it at
        # import), and never later on the loop, where a slow import would stall a reap.
        from prometheus_client import multiprocess

        self._multiprocess = multiprocess

    def mark_dead(self, pid: int) -> None:
        if self.path is None or self._multiprocess is None:
            return
        try:
            self._multiprocess.mark_process_dead(pid, str(self.path))
        except OSError as exc:
            log.warning("could not drop the metrics of pid %d: %s", pid, exc)

    def close(self) -> None:
        if self.owned and self.path is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.path)
            if os.environ.get(METRICS_DIR_ENV) == str(self.path):
                del os.environ[METRICS_DIR_ENV]
