"""The line-keeping YAML reader, and the reading of a mapping by its declared keys.

The node tree from ``yaml.compose`` keeps line numbers that plain ``safe_load``
throws away, so every error names the file, the line and the dotted key. Apps
validate their own config sections the same way: declare the keys on a dataclass
(``keys.key``), read them with ``read_fields`` or ``read_given``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .checks import (
    MODULE,
    NAME,
    BadItem,
    Check,
    Item,
    boolean,
    duration,
    integer,
    kind,
    names,
    number,
    percent,
    string,
)
from .keys import declared, names_of
from .model import ConfigError

# The checkers, re-exported: apps import them from here.
__all__ = ["MODULE", "NAME", "BadItem", "Check", "Item", "Reader", "Section", "boolean", "duration", "integer",
           "kind", "names", "number", "percent", "read_fields", "read_given", "string"]

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


Checks = Mapping[str, Callable[[Item], Any]]
_UNSET = object()


def _read(reader: Reader, item: Item, cls: type, checks: Checks | None, *, by_field: bool) -> dict[str, Any]:
    section = Section(reader, item, names_of(cls))
    checks = checks or {}
    out: dict[str, Any] = {}
    for k in declared(cls):
        given = section.map.get(k.name)
        if k.section is not None and k.name not in checks:
            assert not k.named, f"{cls.__name__}.{k.field}: its section's parser reads the named entries"
            if given is not None and given.value is not None:
                inner = _read(reader, given, k.section, None, by_field=by_field)
                out[k.field if by_field else k.name] = k.section(**inner) if by_field else inner
            elif k.required:
                raise reader.error(item, "is required", key=section.key(k.name))
            continue
        check = checks.get(k.name) or k.check
        assert check is not None, f"{cls.__name__}.{k.field}: its section's parser gives the check"
        value = section.get(k.name, check, _UNSET, required=k.required)
        if value is _UNSET:
            continue
        if not by_field:
            out[k.name] = value
        elif k.into:
            out.update(zip(k.into, value, strict=True))
        else:
            out[k.field] = value
    return out


def read_fields(reader: Reader, item: Item, cls: type, checks: Checks | None = None) -> dict[str, Any]:
    """The keys of dataclass ``cls`` given in mapping ``item``, checked, by field name:
    ``cls(**read_fields(...))`` takes its own defaults for the rest. Unknown keys and
    missing required ones are errors. ``checks`` gives (by YAML key) the check of a key
    that needs the file's context, or reads a named section (a mapping of names) itself."""
    return _read(reader, item, cls, checks, by_field=True)


def read_given(reader: Reader, item: Item, cls: type, checks: Checks | None = None) -> dict[str, Any]:
    """The same, by YAML key, nested sections as dicts: only what the file gives (an app's
    section kept as written, its defaults applied where it is read)."""
    return _read(reader, item, cls, checks, by_field=False)
