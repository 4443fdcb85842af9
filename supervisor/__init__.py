"""actor-supervisor: run Dramatiq actors on PostgreSQL under a forking supervisor."""

from .broker import PostgresBroker, PostgresConsumer, setup_broker
from .broker.jobfields import log_fields
from .broker.progress import progress

__all__ = ["PostgresBroker", "PostgresConsumer", "log_fields", "progress", "setup_broker"]
