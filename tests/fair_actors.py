"""Actors whose key carries a fairness weight (they live in the log: migration 056), for
tests/test_log_fair.py. Each run notes when it started and ended on the server's clock
(test_results), as tests/keyed_actors.py's do."""

import dramatiq

from tests.run_notes import note

QUEUE = "fair"


@dramatiq.actor(queue_name=QUEUE, max_retries=0, fairness_key="tenant:{kwargs[tenant]}")
def tenant_job(tenant: str, n: int, sleep_s: float = 0.01) -> None:
    """A tenant's job; its weight is the message's (``fairness_weight``), 1 by default."""
    note(tenant, n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, fairness_key="cap:{kwargs[tenant]}", fairness_weight=2,
                concurrency_limit=1)
def capped_tenant(tenant: str, n: int, sleep_s: float = 0.02) -> None:
    """Weight 2, and one at a time per tenant."""
    note(tenant, n, sleep_s)
