"""Async actors for the `supervisor worker` subprocess tests (tests/test_executor_async.py).
Plain Dramatiq: no broker code in here."""

import asyncio
import threading

import dramatiq


@dramatiq.actor(queue_name="async", max_retries=0)
async def snooze(seconds: float) -> str:
    """Awaits ``seconds``; returns the thread it ran in (the loop's)."""
    await asyncio.sleep(seconds)
    return str(threading.get_ident())
