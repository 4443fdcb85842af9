"""The one retry-with-backoff helper: exponential delays, capped, with an
optional deadline. Every loop that waits for the database uses it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def delays(*, first: float = 0.5, cap: float = 30.0) -> Iterator[float]:
    """first, 2*first, 4*first, ... capped at ``cap``, for ever."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * 2)


def describe(exc: BaseException) -> str:
    """An error for a log line: its text, or its type when it has none (an empty
    "failed ()" tells the operator nothing)."""
    return str(exc).strip() or type(exc).__name__


def retry(
    fn: Callable[[], T],
    what: str,
    *,
    first: float = 0.5,
    cap: float = 30.0,
    give_up_after: float | None = None,
    stop: threading.Event | None = None,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    logger: logging.Logger = log,
) -> T:
    """Call ``fn`` until it returns, sleeping with backoff between failures.

    Re-raises the last error once ``give_up_after`` seconds have passed (never,
    by default) or when ``stop`` is set; a set ``stop`` also cuts a sleep short.
    """
    deadline = None if give_up_after is None else time.monotonic() + give_up_after
    for delay in delays(first=first, cap=cap):
        try:
            return fn()
        except retry_on as exc:
            if stop is not None and stop.is_set():
                raise
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            logger.warning("%s failed (%s); retrying in %.1fs", what, describe(exc), delay)
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
    raise AssertionError("unreachable")
