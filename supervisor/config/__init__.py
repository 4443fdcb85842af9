"""The YAML config: located reading, section parsers, frozen dataclasses.

Every error names the file, the line and the dotted key, because the person
reading it is editing that file (often through `supervisor reload`).
"""

from .http import HttpConfig
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
from .sections import DEFAULT_PATH, ENV_PATH, control_socket_of, find_path, load, parse

__all__ = [
    "DEFAULT_PATH",
    "ENV_PATH",
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "HttpConfig",
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
