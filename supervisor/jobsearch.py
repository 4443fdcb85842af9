"""Finding a job: by id or the start of one, by dedupe or concurrency key, by the workflow
it is a step of, or by a value inside its arguments (``kwargs.user_id = 7``, ``args[0] = 42``).

The same filter names everywhere (the dashboard's Jobs page and its URL, ``GET
/api/v1/jobs``, ``supervisor jobs list``): ``id``, ``dedupe_key``, ``concurrency_key``,
``workflow``, ``match``. This module only parses; the SQL is ``broker.reads`` (every value a bind
parameter: a path becomes a ``text[]`` for ``#>``, a value a ``jsonb``).

An id prefix is a range on the primary key (``id BETWEEN prefix000… AND prefixfff…``), so
it is index-served; so is a workflow (its steps by workflow_steps' index, each job by its
id). A key or a value inside the arguments has no index on jobs (every
index there costs each claim and ack, the product's core path): such a search reads at
most ``SCAN_ROWS`` jobs per page, newest first, and says so (see ``admin.jobs_page``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

# Jobs one search inside the arguments (or by key) reads at most per page, newest first;
# the next page goes on from where it stopped.
SCAN_ROWS = 100_000
MATCH_EXAMPLE = "kwargs.user_id = 7, args[0] = 42, kwargs.order.lines[0].sku = \"A-1\""
ID_EXAMPLE = "0b6c3f9e (the start of an id) or a whole id"
NAMES = ("id", "dedupe_key", "concurrency_key", "workflow", "match")


class SearchError(ValueError):
    """A bad search term: the message names the filter and shows an example."""


# --- id or id prefix ----------------------------------------------------------------------

_HEX = re.compile(r"^[0-9a-f]{1,32}$")


def id_range(text: str) -> tuple[str, str]:
    """The lowest and highest uuid that start with ``text`` (hex digits, dashes ignored)."""
    digits = text.strip().lower().replace("-", "")
    if not _HEX.match(digits):
        raise SearchError(f"id: {text!r} is not a job id or the start of one (hex digits, dashes allowed); "
                          f"example: {ID_EXAMPLE}")
    return str(uuid.UUID(digits.ljust(32, "0"))), str(uuid.UUID(digits.ljust(32, "f")))


def workflow_id(text: str) -> str:
    """A whole workflow id (``supervisor workflows list`` shows them), normalised."""
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise SearchError(f"workflow: {text!r} is not a workflow id (a whole uuid, as `supervisor workflows list`"
                          " shows)") from None


# --- a value inside the arguments -------------------------------------------------------------
#
#   match   := root step* "=" value          ("==" is accepted too)
#   root    := "args" | "kwargs"
#   step    := "." name | "[" integer "]" | "[" "\"" json-string "\"" "]"
#   value   := a JSON literal (42, -1.5, "text", true, false, null, [..], {..})
#              or a bare word (letters, digits, _ . - @ :), read as a string

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"\[\s*(-?\d+)\s*\]")
_QUOTED = re.compile(r'\[\s*("(?:[^"\\]|\\.)*")\s*\]')
_BARE = re.compile(r"^[A-Za-z0-9_.@:-]+$")


@dataclass(frozen=True)
class Match:
    """``column #> path = value``: the job's ``args`` or ``kwargs``, a path of keys and
    array indexes (as text, what ``#>`` takes), the JSON value it must equal."""

    column: str
    path: tuple[str, ...]
    value: Any
    text: str  # as written, for the URL and messages

    @classmethod
    def parse(cls, text: str) -> Match:
        source = text.strip()

        def bad(why: str) -> SearchError:
            return SearchError(f"match: {why} in {text!r}; examples: {MATCH_EXAMPLE}")

        root = _NAME.match(source)
        if root is None or root.group() not in ("args", "kwargs"):
            raise bad("expected args or kwargs at the start")
        pos, path = root.end(), []
        while True:
            while pos < len(source) and source[pos] == " ":
                pos += 1
            if source.startswith(".", pos):
                name = _NAME.match(source, pos + 1)
                if name is None:
                    raise bad(f"expected a key name after '.' at position {pos + 1}")
                path.append(name.group())
                pos = name.end()
            elif (index := _INDEX.match(source, pos)) is not None:
                path.append(str(int(index.group(1))))
                pos = index.end()
            elif (quoted := _QUOTED.match(source, pos)) is not None:
                path.append(json.loads(quoted.group(1)))
                pos = quoted.end()
            elif source.startswith("[", pos):
                raise bad(f"expected [integer] or [\"key\"] at position {pos + 1}")
            else:
                break
        op = "==" if source.startswith("==", pos) else "=" if source.startswith("=", pos) else None
        if op is None:
            rest = source[pos:pos + 12]
            raise bad(f"expected '=' and a value after the path, got {rest!r}" if rest else "expected '= value'")
        raw = source[pos + len(op):].strip()
        if not raw:
            raise bad("expected a value after '='")
        try:
            value = json.loads(raw)
        except ValueError:
            if not _BARE.match(raw):
                raise bad(f"{raw!r} is neither JSON (42, \"text\", true, null) nor a bare word") from None
            value = raw
        return cls(root.group(), tuple(path), value, source)


# --- the filters together -----------------------------------------------------------------------


@dataclass(frozen=True)
class Search:
    """The find-a-job filters; None leaves one out."""

    id: str | None = None
    dedupe_key: str | None = None
    concurrency_key: str | None = None
    workflow: str | None = None
    match: Match | None = None

    @classmethod
    def parse(cls, source: Mapping[str, Any]) -> Search:
        """From query, form or JSON fields; blanks are absent; a bad one raises SearchError."""
        def get(name: str) -> str | None:
            value = source.get(name)
            if value is None:
                return None
            if not isinstance(value, str):
                raise SearchError(f"{name}: expected text, got {type(value).__name__}")
            return value.strip() or None

        job_id = get("id")
        if job_id is not None:
            id_range(job_id)  # checked now: a bad id is the caller's error, not the query's
        match, workflow = get("match"), get("workflow")
        return cls(id=job_id, dedupe_key=get("dedupe_key"), concurrency_key=get("concurrency_key"),
                   workflow=workflow_id(workflow) if workflow is not None else None,
                   match=Match.parse(match) if match is not None else None)

    @property
    def scans(self) -> bool:
        """Whether no index serves it: keys and values inside the arguments."""
        return any(v is not None for v in (self.dedupe_key, self.concurrency_key, self.match))

    def params(self) -> dict[str, Any]:
        """The bind parameters of ``reads``' filter fragments (None: fragment left out)."""
        lo, hi = id_range(self.id) if self.id is not None else (None, None)
        m = self.match
        return {"id_lo": lo, "id_hi": hi, "dedupe_key": self.dedupe_key, "concurrency_key": self.concurrency_key,
                "workflow": self.workflow,
                "match_args": list(m.path) if m is not None and m.column == "args" else None,
                "match_kwargs": list(m.path) if m is not None and m.column == "kwargs" else None,
                "match_value": Jsonb(m.value) if m is not None else None}

    def query(self) -> dict[str, str]:
        """As URL fields (what a link keeps)."""
        fields = {"id": self.id, "dedupe_key": self.dedupe_key, "concurrency_key": self.concurrency_key,
                  "workflow": self.workflow,
                  "match": self.match.text if self.match is not None else None}
        return {k: v for k, v in fields.items() if v is not None}
