"""``supervisor.results.PostgresBackend``: Dramatiq results kept in PostgreSQL.

The broker installs ``Results(backend=PostgresBackend(...))`` by default, so an
actor declared with ``store_results=True`` needs nothing more; pass a backend
to ``message.get_result(backend=...)`` only when using a broker of your own.
"""

from .broker.results import PostgresBackend

__all__ = ["PostgresBackend"]
