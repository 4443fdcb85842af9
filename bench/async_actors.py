"""The async actor of bench/async_jobs.py. Plain Dramatiq: no broker code in here."""

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import asyncio

import dramatiq

QUEUE = "async"


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
async def asleep(seconds: float = 1.0) -> None:
    await asyncio.sleep(seconds)
