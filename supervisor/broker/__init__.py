"""What producers and workers import: the broker, its consumer, leases and middleware."""

from .broker import PostgresBroker, setup_broker
from .consuming.consumer import PostgresConsumer
from .consuming.leases import Leases
from .joining import JobFailed
from .message import PgMessageProxy
from .middleware import JobOptions, Retries

__all__ = ["JobFailed", "JobOptions", "Leases", "PgMessageProxy", "PostgresBroker", "PostgresConsumer", "Retries", "setup_broker"]
