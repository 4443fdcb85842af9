"""What a background thread of a worker process does with an error: one policy for all.

The upkeep, ack batcher, lease keeper, due timer, progress writer, lease fence and
wake-up threads loop for the life of their process, and each step of a loop may fail:

- An expected database error (``EXPECTED``: psycopg's OperationalError and its kin,
  the server away, a connection ended, a timeout, a pool's; a read-only server during
  a fail-over; BrokerConnectionError) passes by itself: the thread logs one line, no
  traceback, and tries again (``warn``).
- Anything else is a programming error, or a state the code does not know, and does
  not pass by itself: retried, it would repeat forever. The loop does not catch it; it
  escapes the thread's ``run``, where ``lifetime`` logs it with its traceback, counts
  it (``actor_supervisor_thread_errors_total{thread}`` in the worker metrics, on
  /metrics through the multiprocess directory) and takes the process down (exit 70):
  whoever runs the process (the master, systemd, the dramatiq CLI) replaces it. A
  worker whose ack batcher or heartbeat has died would go on claiming jobs that it
  never finishes; one that has exited has its jobs released and run elsewhere.

A thread that was asked to stop ends quietly, whatever it meets on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import psycopg
from dramatiq.errors import BrokerConnectionError

from .. import db, exit_codes
from ..defaults import METRICS_DIR_ENV

log = logging.getLogger(__name__)

EXPECTED: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,  # connection refused or ended, admin shutdown, timeouts, PoolTimeout, PoolClosed
    psycopg.errors.ReadOnlySqlTransaction,  # a standby answering during a fail-over
    BrokerConnectionError,  # the broker's own wrapper of the above
)

COUNTER = "actor_supervisor_thread_errors"  # exposed as ..._total{thread}

_counter: Any = None
_counter_lock = threading.Lock()


def one_line(exc: BaseException) -> str:
    """An exception as one line (libpq's messages span several), passwords hidden."""
    return " ".join(db.redact(f"{type(exc).__name__}: {exc}").split())


def warn(logger: logging.Logger, what: str, exc: BaseException, then: str = "will retry") -> None:
    """The one line an expected error gets: ``<what> failed (<error>); <then>``."""
    logger.warning("%s failed (%s); %s", what, one_line(exc), then)


def count(thread: str) -> None:
    """Count an unexpected error of ``thread`` in the process's metrics files (only where
    the multiprocess directory is set: a worker under the master, or with the variable)."""
    global _counter
    if not os.environ.get(METRICS_DIR_ENV):
        return
    with _counter_lock:
        if _counter is None:
            # Imported here, as the job metrics do: prometheus_client picks its value class
            # from the environment at import time.
            import prometheus_client as prom

            _counter = prom.Counter(COUNTER, "Unexpected errors (with a traceback in the log) of a worker"
                                    " process's background threads; each took its process down",
                                    ["thread"], registry=prom.CollectorRegistry())
        _counter.labels(thread).inc()


def died(thread: str, exc: BaseException) -> NoReturn:
    """Log ``exc`` with its traceback, count it and end the process (see the module doc)."""
    try:
        log.critical("background thread %s died of an unexpected error; ending process %d so it is replaced",
                     thread, os.getpid(), exc_info=exc)
        count(thread)
    finally:
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(exit_codes.CRASH)


@contextlib.contextmanager
def lifetime(thread: str, stopping: Callable[[], bool]) -> Iterator[None]:
    """Around the whole body of a background thread's ``run``: whatever escapes it ends
    the process (``died``), unless the thread was asked to stop (``stopping()``)."""
    try:
        yield
    except BaseException as exc:
        if stopping():
            log.info("background thread %s stopped on %s", thread, one_line(exc))
            return
        died(thread, exc)
