"""actor-supervisor: run Dramatiq actors on PostgreSQL under a forking supervisor."""

from .broker import PostgresBroker, PostgresConsumer, setup_broker
from .broker.jobfields import log_fields
from .broker.progress import progress
from .flow import LimitOptionError, RateLimited

__all__ = ["LimitOptionError", "PostgresBroker", "PostgresConsumer", "RateLimited", "log_fields", "progress",
           "setup_broker"]
