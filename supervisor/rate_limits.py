"""``supervisor.rate_limits.PostgresBackend``: Dramatiq's rate-limiter backend on PostgreSQL.

Every Dramatiq rate limiter and ``Barrier`` works with it across processes, hosts and
restarts, with no Redis::

    from dramatiq.rate_limits import ConcurrentRateLimiter
    from supervisor.rate_limits import PostgresBackend

    DB_SLOTS = ConcurrentRateLimiter(PostgresBackend(), "db-slots", limit=2)

With no argument it uses the database of the global PostgresBroker (found at first use).
The broker installs Dramatiq's GroupCallbacks with it, so group completion callbacks
need nothing more. The design: ARCHITECTURE.md, "Workflows on PostgreSQL".
"""

from .broker.limiter import PostgresBackend

__all__ = ["PostgresBackend"]
