"""The YAML config: frozen dataclasses whose fields declare each key once (keys.py),
located reading, section parsers.

Every error names the file, the line and the dotted key, because the person
reading it is editing that file (often through `supervisor reload`).
"""

from typing import TYPE_CHECKING, Any

from .http import ROLES, HttpConfig, HttpToken
from .model import (
    Config,
    ConfigError,
    DatabaseConfig,
    Limits,
    Retention,
    RoleConfig,
    ScheduleConfig,
    SupervisorConfig,
)

if TYPE_CHECKING:
    from .sections import DEFAULT_PATH, ENV_PATH, control_socket_of, find_path, load, parse

# The readers (and YAML) load on first use: a worker needs the dataclasses only
# (its settings come from its command line or, forked, from the master).
_SECTIONS = {"DEFAULT_PATH", "ENV_PATH", "control_socket_of", "find_path", "load", "parse"}


def __getattr__(name: str) -> Any:
    if name in _SECTIONS:
        from . import sections

        return getattr(sections, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DEFAULT_PATH",
    "ENV_PATH",
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "ROLES",
    "HttpConfig",
    "HttpToken",
    "Limits",
    "Retention",
    "RoleConfig",
    "ScheduleConfig",
    "SupervisorConfig",
    "control_socket_of",
    "find_path",
    "load",
    "parse",
]
