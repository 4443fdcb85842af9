"""Actors that fail in known places, for the Errors and Actors pages' tests. Plain Dramatiq."""

import json

import dramatiq


def parse_body(text: str) -> dict:
    """The app's own helper: a JSON error raised in the standard library is grouped here."""
    return json.loads(text)


@dramatiq.actor(queue_name="errors", max_retries=2, min_backoff=20, max_backoff=40)
def parse_feed(n: int) -> None:
    """Fails every attempt (three), each message different: one group."""
    parse_body('{"feed": ' + "9" * n + " broken}")


@dramatiq.actor(queue_name="errors", max_retries=0)
def refuse(n: int) -> None:
    raise PermissionError(f"user {n} may not do this")


@dramatiq.actor(queue_name="errors", max_retries=3, min_backoff=600_000, max_backoff=600_000)
def call_later(n: int) -> None:
    """Fails once, then waits ten minutes for its retry: a pending retry to cancel."""
    raise TimeoutError(f"upstream {n} timed out")


@dramatiq.actor(queue_name="errors", max_retries=0)
def fine(n: int = 0) -> None:
    pass
