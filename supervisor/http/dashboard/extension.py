"""What an app contributes to the dashboard (``App.pages`` returns these).

An app's page is a list of tables the dashboard renders like its own; the same
object may add tables to the Limits page (e.g. circuit breakers) and one-line
alerts to the Overview. Every callable gets a connection of the HTTP child's pool
(autocommit, statement timeout) and must be quick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg


@dataclass(frozen=True)
class Table:
    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    note: str | None = None  # shown under the title (e.g. what the numbers mean)


@dataclass(frozen=True)
class Page:
    slug: str  # served at /apps/<slug>
    title: str  # the navigation label
    tables: Callable[[psycopg.Connection], Sequence[Table]]
    limits: Callable[[psycopg.Connection], Sequence[Table]] | None = None
    alerts: Callable[[psycopg.Connection], Sequence[str]] | None = field(default=None)
