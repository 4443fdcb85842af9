"""actor-supervisor: Dramatiq actors on PostgreSQL under a forking supervisor."""

from .broker import PostgresBroker, PostgresConsumer, setup_broker

__all__ = ["PostgresBroker", "PostgresConsumer", "setup_broker"]
__version__ = "0.1.0"
