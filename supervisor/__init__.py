"""actor-supervisor: run Dramatiq actors on PostgreSQL under a forking supervisor."""

from .broker import PostgresBroker, PostgresConsumer, setup_broker

__all__ = ["PostgresBroker", "PostgresConsumer", "setup_broker"]
