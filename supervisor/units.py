"""The duration and size grammar of every setting, defined once.

`30`, `2.5`, `30s`, `5m`, `1h`, `500ms`, `1m30s` are durations (seconds);
`536870912`, `512MB`, `1.5GiB` are sizes (bytes, binary units).
"""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}



def parse_duration(value: Any) -> float:
    """Seconds from 30, 2.5, '30s', '5m', '1h', '500ms', '1m30s'. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m, 1h, 500ms or a number of seconds")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        sign = 1.0
        if text.startswith("-"):
            sign, text = -1.0, text[1:].strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return sign * float(text)
        pos, total = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos and text[pos:m.start()].strip():
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        else:
            if pos and not text[pos:].strip():
                return sign * total
    raise ValueError(f"expected a duration like 30s, 5m, 1h, 500ms or a number of seconds, got {value!r}")


def format_duration(seconds: float) -> str:
    """The shortest way the grammar above writes ``seconds``: 500ms, 30s, 5m, 24h, 7d, 1m30s."""
    if 0 < seconds < 1 and seconds * 1000 == round(seconds * 1000):
        return f"{seconds * 1000:g}ms"
    parts, left = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            whole = int(left // size)
            parts.append(f"{whole}{unit}")
            left -= whole * size
    if left or not parts:
        parts.append(f"{left:g}s")
    return "".join(parts)


def parse_size(value: Any) -> int:
    """Bytes from 536870912, '512MB', '1.5GiB', '800M' (units are binary: MB = MiB)."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 512MB or 2GB")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            unit = (m.group(2) or "b")[0].lower()
            return int(float(m.group(1)) * _SIZE_FACTOR[unit])
    raise ValueError(f"expected a size like 512MB or 2GB, got {value!r}")


def human_bytes(n: int | None) -> str:
    if not n:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return str(size)
