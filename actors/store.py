"""The broker and connection pool the app's actors use: the worker's own.

A worker process installs its PostgresBroker as Dramatiq's global broker before
it imports actor modules, so every actor of the app runs on it.
"""

from __future__ import annotations

import dramatiq
from psycopg_pool import ConnectionPool

from supervisor.broker import PostgresBroker


def broker() -> PostgresBroker:
    current = dramatiq.get_broker()
    if not isinstance(current, PostgresBroker):
        raise RuntimeError("the price tracker's actors need a PostgresBroker (supervisor.setup_broker())")
    return current


def pool() -> ConnectionPool:
    return broker().actor_pool
