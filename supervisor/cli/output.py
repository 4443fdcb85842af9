"""Printing: JSON for machines, aligned tables for people. Gathering happens elsewhere."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, default=_json_default, indent=2))


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value).replace("\n", " ")


def table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def rows(data: list[dict[str, Any]], as_json: bool, columns: list[str]) -> None:
    """Rows as JSON (every column) or as a table of ``columns``."""
    if as_json:
        print_json(data)
    else:
        table(data, columns)
