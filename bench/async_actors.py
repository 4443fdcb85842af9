"""The async actor of bench/async_jobs.py. Plain Dramatiq: no broker code in here."""

import asyncio

import dramatiq

QUEUE = "async"


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
async def asleep(seconds: float = 1.0) -> None:
    await asyncio.sleep(seconds)
