"""What the running worker process knows about itself, for actor code.

The worker sets this once at boot from the already-parsed config, so actors
never read YAML themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

_pipeline: Mapping[str, Any] = MappingProxyType({})
_worker_id: str | None = None


def configure(*, pipeline: Mapping[str, Any] | None = None, worker_id: str | None = None) -> None:
    global _pipeline, _worker_id
    _pipeline = MappingProxyType(dict(pipeline or {}))
    _worker_id = worker_id


def pipeline() -> Mapping[str, Any]:
    """The config's `pipeline:` section (empty when run without a config)."""
    return _pipeline


def worker_id() -> str | None:
    return _worker_id
