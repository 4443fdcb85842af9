"""The line-keeping YAML reader and the checkers every section parser uses.

The node tree from ``yaml.compose`` keeps line numbers that plain ``safe_load``
throws away, so every error names the file, the line and the dotted key. Apps
validate their own config sections with the same ``Section`` and checkers.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..units import parse_duration
from .model import ConfigError

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

# --- the located tree -----------------------------------------------------------------


@dataclass
class Item:
    """A YAML value with where it came from."""

    value: Any  # scalar, dict[str, Item] or list[Item]
    line: int
    key: str


_INTERP = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$\{")
_STR_TAG = "tag:yaml.org,2002:str"


class Reader:
    def __init__(self, path: Path, env: Mapping[str, str]) -> None:
        self.path = path
        self.env = env
        self._loader = yaml.SafeLoader("")  # only for its resolver, merge handling and constructors

    def error(self, item: Item | None, message: str, key: str | None = None, line: int | None = None) -> ConfigError:
        return ConfigError(
            self.path,
            line if line is not None else (item.line if item else None),
            key if key is not None else (item.key if item else None),
            message,
        )

    def interpolate(self, text: str, line: int, key: str) -> str:
        def sub(m: re.Match[str]) -> str:
            whole = m.group(0)
            if whole == "$$":
                return "$"
            name = m.group(1)
            if name is None:
                raise ConfigError(self.path, line, key, f"bad interpolation in {text!r}: use ${{VAR}} or ${{VAR:-default}}")
            value = self.env.get(name)
            op = m.group(2)
            if op == ":-" and not value or op == "-" and value is None:
                default: str = m.group(3)
                return default
            if value is None:
                raise ConfigError(
                    self.path, line, key,
                    f"environment variable {name} is not set (set it, or write ${{{name}:-default}})",
                )
            return value

        return _INTERP.sub(sub, text)

    def tree(self, node: yaml.Node, key: str) -> Item:
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
            self._loader.flatten_mapping(node)
            merged = len(node.value) - explicit  # '<<' pairs come first; explicit keys override them
            out: dict[str, Item] = {}
            explicit_names: set[str] = set()
            for index, (k_node, v_node) in enumerate(node.value):
                k_line = k_node.start_mark.line + 1
                if not isinstance(k_node, yaml.ScalarNode) or k_node.tag != _STR_TAG:
                    raise ConfigError(self.path, k_line, key or None, f"keys must be plain names, not {k_node.value!r}")
                name = k_node.value
                child_key = f"{key}.{name}" if key else name
                if name in out and index >= merged and name in explicit_names:
                    raise ConfigError(self.path, k_line, child_key, f"duplicate key (first on line {out[name].line})")
                item = self.tree(v_node, child_key)
                # A mapping's line is that of its key, which is where people look.
                item.line = k_line if not isinstance(v_node, yaml.ScalarNode) else item.line
                out[name] = item
                if index >= merged:
                    explicit_names.add(name)
            return Item(out, line, key)
        if isinstance(node, yaml.SequenceNode):
            return Item([self.tree(n, f"{key}[{i}]") for i, n in enumerate(node.value)], line, key)
        assert isinstance(node, yaml.ScalarNode)
        return Item(self.scalar(node, line, key), line, key)

    def scalar(self, node: yaml.ScalarNode, line: int, key: str) -> Any:
        if "$" in node.value and node.tag == _STR_TAG:
            text = self.interpolate(node.value, line, key)
            # An unquoted ${N:-2} means the number 2, as if written in place.
            tag = self._loader.resolve(yaml.ScalarNode, text, (True, False)) if node.style is None else _STR_TAG
            node = yaml.ScalarNode(tag, text, node.start_mark, node.end_mark, style=node.style)
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise ConfigError(self.path, line, key, f"bad value: {exc.problem}") from exc


class Section:
    """Reads the keys of one mapping, each at most once, and rejects the rest."""

    def __init__(self, reader: Reader, item: Item, allowed: tuple[str, ...], *, extensions: bool = False) -> None:
        if not isinstance(item.value, dict):
            raise reader.error(item, f"must be a mapping of {', '.join(allowed)}, got {kind(item.value)}")
        self.r = reader
        self.item = item
        self.map: dict[str, Item] = item.value
        for name, child in self.map.items():
            # x-* keys hold YAML anchors for reuse (as in docker compose) and are ignored.
            if name not in allowed and not (extensions and name.startswith("x-")):
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
                raise reader.error(child, f"unknown key {name!r}{hint}")

    def key(self, name: str) -> str:
        return f"{self.item.key}.{name}" if self.item.key else name

    def get(self, name: str, check: Callable[[Item], Any], default: Any = None, *, required: bool = False) -> Any:
        child = self.map.get(name)
        if child is None or child.value is None:
            if required:
                raise self.r.error(self.item, "is required", key=self.key(name))
            return default
        try:
            return check(child)
        except ConfigError:
            raise
        except BadItem as exc:
            raise self.r.error(exc.item, str(exc)) from exc
        except ValueError as exc:
            raise self.r.error(child, str(exc)) from exc


def kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    return f"{type(value).__name__} {value!r}"


def string(item: Item) -> str:
    if not isinstance(item.value, str) or not item.value.strip():
        raise ValueError(f"expected a non-empty string, got {kind(item.value)}")
    return item.value


def boolean(item: Item) -> bool:
    if not isinstance(item.value, bool):
        raise ValueError(f"expected true or false, got {kind(item.value)}")
    return item.value


def integer(minimum: int) -> Callable[[Item], int]:
    def check(item: Item) -> int:
        v = item.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected a whole number, got {kind(v)}")
        if v < minimum:
            raise ValueError(f"must be at least {minimum}, got {v}")
        return v

    return check


def duration(minimum: float = 0.0, *, strict: bool = False) -> Callable[[Item], float]:
    def check(item: Item) -> float:
        seconds = parse_duration(item.value)
        if seconds < minimum or strict and seconds <= minimum:
            bound = f"more than {minimum:g}s" if strict else f"at least {minimum:g}s"
            raise ValueError(f"must be {bound}, got {item.value!r}")
        return seconds

    return check


def percent(item: Item) -> float:
    v = item.value
    if isinstance(v, str) and v.strip().endswith("%"):
        v = v.strip()[:-1]
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"expected a percentage like 85 or 85%, got {item.value!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a percentage like 85, got {kind(v)}")
    if not 0 < v <= 100:
        raise ValueError(f"must be between 0 and 100 (exclusive of 0), got {v}")
    return float(v)


class BadItem(ValueError):
    """A bad element inside a list: the error points at the element's own line."""

    def __init__(self, item: Item, message: str) -> None:
        super().__init__(message)
        self.item = item


def names(pattern: re.Pattern[str], what: str) -> Callable[[Item], tuple[str, ...]]:
    def check(item: Item) -> tuple[str, ...]:
        v = item.value
        items = [item] if isinstance(v, str) else v  # a single name is a one-element list
        if not isinstance(items, list):
            raise ValueError(f"expected a list of {what}s, got {kind(v)}")
        if not items:
            raise ValueError(f"must list at least one {what}")
        out: list[str] = []
        for child in items:
            if not isinstance(child.value, str) or not pattern.match(child.value):
                raise BadItem(child, f"{kind(child.value)} is not a valid {what}")
            if child.value in out:
                raise BadItem(child, f"{child.value!r} is listed twice")
            out.append(child.value)
        return tuple(out)

    return check




def plain(reader: Reader, item: Item, *, mapping: bool = False, sequence: bool = False) -> Any:
    """The located tree back to plain Python values."""
    v = item.value
    if mapping and not isinstance(v, dict):
        raise ValueError(f"expected a mapping, got {kind(v)}")
    if sequence and not isinstance(v, list):
        raise ValueError(f"expected a list, got {kind(v)}")
    if isinstance(v, dict):
        return {k: plain(reader, c) for k, c in v.items()}
    if isinstance(v, list):
        return [plain(reader, c) for c in v]
    return v


def number(minimum: float | None = None, maximum: float | None = None) -> Callable[[Item], float]:
    def check(item: Item) -> float:
        v = item.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"expected a number, got {kind(v)}")
        if minimum is not None and v < minimum:
            raise ValueError(f"must be at least {minimum:g}, got {v}")
        if maximum is not None and v > maximum:
            raise ValueError(f"must be at most {maximum:g}, got {v}")
        return float(v)

    return check


# A nested schema: each key maps to a checker or to the schema of a sub-mapping.
Schema = Mapping[str, Any]


def mapping(reader: Reader, item: Item, schema: Schema) -> dict[str, Any]:
    """Validate a mapping against ``schema``: unknown keys, bad values and wrong
    kinds are errors naming file, line and key; returns only the keys given."""
    section = Section(reader, item, tuple(schema))
    out: dict[str, Any] = {}
    for name, check in schema.items():
        if isinstance(check, Mapping):
            child = section.map.get(name)
            if child is not None and child.value is not None:
                out[name] = mapping(reader, child, check)
            continue
        value = section.get(name, check)
        if value is not None:
            out[name] = value
    return out
