"""Rendering: JSON responses (dates as ISO 8601, UUIDs as text) and JSON errors."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from starlette.responses import JSONResponse


def _default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


class Json(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=_default, separators=(",", ":")).encode()


def error(status: int, message: str, **extra: Any) -> Json:
    return Json({"error": message, **extra}, status_code=status)
