"""What the running worker process knows about itself, for app code.

The worker sets this once at boot from the already-parsed config, so actors
never read YAML themselves: ``section("pipeline")`` is the validated value of
the config's ``pipeline:`` section (an app's own section).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

_sections: Mapping[str, Any] = MappingProxyType({})
_worker_id: str | None = None


def configure(*, app_settings: Mapping[str, Any] | None = None, worker_id: str | None = None) -> None:
    global _sections, _worker_id
    _sections = MappingProxyType(dict(app_settings or {}))
    _worker_id = worker_id


def section(name: str) -> Mapping[str, Any]:
    """An app section of the config (empty when run without a config)."""
    value = _sections.get(name)
    return value if isinstance(value, Mapping) else MappingProxyType({})


def worker_id() -> str | None:
    return _worker_id
