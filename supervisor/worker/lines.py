"""LineWriter: log records made and written off the thread that noted them, in batches.

A thread notes a line with ``put`` (one append to a deque, no lock, no I/O). Every
``INTERVAL`` (or as soon as ``BATCH`` lines wait) the writer's thread turns what was noted
into records and hands them to the handlers the logger reaches, as ``Logger.handle``
would (the logger's level and filters, then each handler's level and filters). A plain
``StreamHandler`` (stderr, what ``supervisor.logs`` sets up; ``type(h).emit`` not
overridden) gets the whole batch in one write and one flush under its lock; any other
handler gets ``handle(record)`` per record, as it would have inline.

What a record made here cannot know is the noting thread's name and id (a format with
``%(threadName)s`` shows the writer's); its time is the note's.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..broker import threads

INTERVAL = 0.05  # seconds a noted line may wait: a log reader never sees the gap
BATCH = 2000  # lines that wake the writer early (a burst keeps memory bounded)


class LineWriter:
    """Records of ``logger``, made by ``make`` from what ``put`` noted, written in batches."""

    def __init__(self, logger: logging.Logger, make: Callable[[Any], logging.LogRecord]) -> None:
        self.logger = logger
        self.make = make
        self._noted: deque[Any] = deque()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._write_lock = threading.Lock()  # one batch at a time (the thread, or stop's last one)

    def put(self, noted: Any) -> None:
        """Note a line (any thread); the writer's thread starts with the first, in the
        process that notes it (a worker is forked: no thread is inherited)."""
        self._noted.append(noted)
        if self._thread is None:
            self._start()
        if self._halt.is_set():  # stopped: nothing would write it later (a job ending past the drain)
            self.write()
        elif len(self._noted) >= BATCH:
            self._wake.set()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._halt.is_set():
                self._thread = threading.Thread(target=self._run, name="job-log", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        with threads.lifetime("job-log", self._halt.is_set):
            while not self._halt.is_set():
                self._wake.wait(INTERVAL)
                self._wake.clear()
                self.write()

    def stop(self) -> None:
        """Write what is noted and stop the thread (lines noted later are written at once)."""
        self._halt.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.write()

    def write(self) -> None:
        """Turn every noted line into a record and hand the batch to the handlers."""
        with self._write_lock:
            records: list[logging.LogRecord] = []
            noted = self._noted
            while noted:
                record = self.make(noted.popleft())
                if self.logger.filter(record):
                    records.append(record)
            if records:
                for handler in reached(self.logger):
                    emit(handler, [r for r in records if r.levelno >= handler.level])


def reached(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of ``logger`` reaches (``Logger.callHandlers``' walk), or
    logging's last resort when there are none."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        current = current.parent if current.propagate else None
    if not found and logging.lastResort is not None:
        found.append(logging.lastResort)
    return found


def emit(handler: logging.Handler, records: list[logging.LogRecord]) -> None:
    """``records`` through ``handler``: one write for a plain stream handler."""
    if not records:
        return
    if not (isinstance(handler, logging.StreamHandler) and type(handler).emit is logging.StreamHandler.emit):
        for record in records:
            handler.handle(record)
        return
    lines = []
    for record in records:
        if not handler.filter(record):
            continue
        try:
            lines.append(handler.format(record) + handler.terminator)
        except Exception:
            handler.handleError(record)
    if not lines:
        return
    with handler.lock:  # type: ignore[union-attr]  # a Handler's lock exists once created
        try:
            handler.stream.write("".join(lines))
            handler.flush()
        except Exception:
            handler.handleError(records[-1])
