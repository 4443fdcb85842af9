"""Each config key declared once, on the dataclass field that holds its value.

As gunicorn's config.py gives each setting one declaration, a key here is one field::

    threads: int = key(integer(1), "Worker threads per process.", defaults.THREADS,
                       flag=("--threads", "-t"))

That one line gives its type (the annotation), its check, its default, its docs line,
its `supervisor worker` flag, and where it goes (the field: a worker reads
``settings.role.threads``). The YAML reader (``reader.read_fields``), the worker's
command line (``cli/worker_cmd.py``), `supervisor config keys` and
docs/config-keys.md all read these declarations, so nothing else names a key.

Rules between keys (heartbeat shorter than lease) are methods of the dataclass
(``problems()``): the reader and the command line raise the same ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field
from functools import cache
from typing import Any

from .checks import Item, show

_KEY = "supervisor.config.key"


@dataclass(frozen=True)
class Key:
    """One key: what the declaration says, completed by ``declared()`` with where it goes."""

    doc: str
    # None: the section's parser supplies the check (it needs the file's context: a
    # path relative to the file, an environment variable, the installed apps).
    check: Callable[[Item], Any] | None = None
    name: str = ""  # the YAML key; declared() sets it to the field's name unless given
    field: str = ""  # the dataclass field it goes to (set by declared())
    default: Any = None  # the field's default (set by declared())
    has_default: bool = False
    required: bool = False
    flag: tuple[str, ...] = ()  # `supervisor worker` option names, e.g. ("--threads", "-t")
    shown: str = ""  # the default as the docs say it, when the value alone would mislead
    what: str = ""  # what it accepts, when the check cannot say
    into: tuple[str, ...] = ()  # fields filled from the tuple the check returns (listen -> host, port)
    reload: str = ""  # "live": a reload applies it in the master; "restart": only a restart does
    section: type | None = None  # a nested mapping of the keys of this dataclass
    named: str = ""  # with section: a mapping of names (shown as this) to such mappings

    @property
    def kind(self) -> str:
        if self.what:
            return self.what
        if self.section is not None:
            return f"mapping of {self.named} to mappings" if self.named else "mapping"
        return str(getattr(self.check, "what", "")) or "value"

    @property
    def default_text(self) -> str:
        if self.shown:
            return self.shown
        if self.required or not self.has_default:
            return "required" if self.required else "-"
        if self.section is not None:
            return "-"
        return str(getattr(self.check, "shows", show)(self.default))

    @property
    def meaning(self) -> str:
        return self.doc + (" Only a restart applies a change." if self.reload == "restart" else "")


def key(check: Callable[[Item], Any] | None, doc: str, default: Any = MISSING, *, factory: Any = MISSING,
        name: str = "", required: bool = False, flag: tuple[str, ...] = (), shown: str = "", what: str = "",
        into: tuple[str, ...] = (), reload: str = "", repr: bool = True, hash: bool | None = None) -> Any:
    """A dataclass field that is a config key (see the module's docstring)."""
    declared_key = Key(doc=doc, check=check, name=name, required=required, flag=flag, shown=shown, what=what,
                       into=into, reload=reload)
    return field(default=default, default_factory=factory, repr=repr, hash=hash, metadata={_KEY: declared_key})


def section(cls: type, doc: str, default: Any = MISSING, *, factory: Any = MISSING, named: str = "",
            required: bool = False, shown: str = "") -> Any:
    """A dataclass field holding a nested mapping of keys (``named``: a mapping of names to them)."""
    return field(default=default, default_factory=factory,
                 metadata={_KEY: Key(doc=doc, section=cls, named=named, required=required, shown=shown)})


def declared(cls: type) -> tuple[Key, ...]:
    """The keys of a dataclass, in declaration order, each knowing its field and default."""
    return _declared(cls)


@cache
def _declared(cls: type) -> tuple[Key, ...]:
    out = []
    for f in dataclasses.fields(cls):
        k = f.metadata.get(_KEY)
        if k is None:
            continue
        default = f.default if f.default_factory is MISSING else f.default_factory()
        out.append(dataclasses.replace(k, name=k.name or f.name, field=f.name, default=default,
                                       has_default=default is not MISSING))
    return tuple(out)


def names_of(cls: type) -> tuple[str, ...]:
    """The YAML keys a mapping of ``cls`` may hold."""
    return tuple(k.name for k in declared(cls))


def by_name(cls: type) -> dict[str, Key]:
    return {k.name: k for k in declared(cls)}


def to_fields(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """Values read by YAML key (as an app's section keeps them) -> by field, for ``cls(**...)``."""
    keys = by_name(cls)
    return {keys[name].field: value for name, value in given.items()}


@dataclass(frozen=True)
class Row:
    """One line of the key reference (`supervisor config keys`, docs/config-keys.md)."""

    key: str  # dotted, with placeholders: roles.<role>.threads
    kind: str
    default: str
    meaning: str
    flag: str = ""  # the `supervisor worker` option, if any

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def rows(cls: type, prefix: str = "") -> Iterator[Row]:
    """Every key of ``cls`` and of its nested sections, depth first, in declaration order."""
    for k in declared(cls):
        path = prefix + k.name
        yield Row(path, k.kind, k.default_text, k.meaning, " / ".join(k.flag))
        if k.section is not None:
            yield from rows(k.section, f"{path}.{k.named}." if k.named else f"{path}.")
