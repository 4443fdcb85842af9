"""actor-supervisor: run Dramatiq actors on PostgreSQL under a forking supervisor."""

from .broker import PostgresBroker, PostgresConsumer, setup_broker
from .broker.consuming.progress import progress
from .composition import pipeline
from .flow import LimitOptionError, RateLimited
from .worker.joblog import log_fields
from .workflows import Workflow, workflow

__all__ = ["LimitOptionError", "PostgresBroker", "PostgresConsumer", "RateLimited", "log_fields", "pipeline",
           "progress", "setup_broker", "Workflow", "workflow"]
