"""The group of a failed attempt, parsed from the traceback text it stores.

A group is (actor, exception type, where): ``where`` is the innermost frame of the
actor's own code as ``file:function``, the file relative to its import root
(``actors/scraping.py:parse_page``). Not the message, whose ids, counts and URLs vary
from one failure of the same bug to the next; not the line number, which moves with
every deploy and would split one group in two. The actor's own code is every file
outside the Python installation (its standard library and site-packages), Dramatiq
and this runtime, plus the actor's own top-level package wherever it is installed:
so an exception raised deep in a library is grouped where the actor called it. A
traceback with no such frame takes its innermost frame; text that is no traceback
(a missing actor) has no frame (``where`` is '').

Parsed from the text (``message.error_text``: the tail of the formatted traceback)
rather than the live exception, so the stored traceback alone defines the group.
"""

from __future__ import annotations

import functools
import os
import re
import site
import sys
import sysconfig
from dataclasses import dataclass
from importlib import util

# "  File "/path/x.py", line 12, in fn" (Python's traceback format)
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in (?P<fn>.+)$', re.MULTILINE)
# Where one exception's traceback starts: the last one is the exception raised.
_BLOCK = re.compile(r"^((Exception Group )?Traceback \(most recent call last\):"
                    r"|During handling of the above exception|The above exception was the direct cause)",
                    re.MULTILINE)
_TYPE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
TYPE_WIDTH = 200
WHERE_WIDTH = 300


@dataclass(frozen=True)
class ErrorKey:
    type: str
    where: str  # '' when the text names no frame


@dataclass(frozen=True)
class OwnCode:
    """Which files are an actor's own code: its package (``package``, a folder), or any
    file outside ``libraries`` (folders). Pseudo-files (``<frozen ...>``) never are."""

    package: str = ""
    libraries: tuple[str, ...] = ()

    def __call__(self, path: str) -> bool:
        if path.startswith("<"):
            return False
        full = os.path.realpath(path)
        if self.package and full.startswith(self.package):
            return True
        return not full.startswith(self.libraries)

    def short(self, path: str) -> str:
        """``path`` relative to the import root it was found under (the longest entry of
        sys.path holding it, or the folder holding the actor's package), so one group has
        one name on every host and in every release."""
        if path.startswith("<"):
            return path
        full = os.path.realpath(path)
        extra = [os.path.dirname(self.package.rstrip(os.sep))] if self.package else []
        for root in _dirs([*(p or os.getcwd() for p in sys.path), *extra]):
            if full.startswith(root):
                return full[len(root):]
        return path


def parse(text: str, own: OwnCode | None = None) -> ErrorKey:
    """The type and the innermost own frame of the last exception in ``text``."""
    own = own or own_code()
    if "Exception Group Traceback" in text:  # the group's own frames, without its "  | " margin
        text = "\n".join(line[4:] if line.startswith(("  | ", "  + ")) else line for line in text.splitlines())
    blocks = list(_BLOCK.finditer(text))
    last = text[blocks[-1].end():] if blocks else text
    frames = list(_FRAME.finditer(last))
    after = last[frames[-1].end():] if frames else last
    exception = next((line for line in after.splitlines() if line.strip() and not line[0].isspace()), "")
    match = _TYPE.match(exception)
    kind = match.group(1) if match else (exception.strip() or "unknown error")
    where = ""
    if frames:
        chosen = next((f for f in reversed(frames) if own(f["file"])), frames[-1])
        where = f"{own.short(chosen['file'])}:{chosen['fn'].strip()}"
    return ErrorKey(kind[:TYPE_WIDTH], where[:WHERE_WIDTH])


def _dirs(paths: list[str | None] | list[str]) -> tuple[str, ...]:
    """Existing folders, resolved, each ending in a separator, longest first."""
    found = {os.path.join(os.path.realpath(p), "") for p in paths if p and os.path.isdir(p)}
    return tuple(sorted(found, key=len, reverse=True))


@functools.cache
def _package_dir(module: str) -> str:
    """The folder of ``module``'s top-level package ('' when unknown, or a plain module)."""
    try:
        spec = util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    return next(iter(_dirs(list(spec.submodule_search_locations))), "")


@functools.cache
def own_code(actor_module: str | None = None) -> OwnCode:
    """The own code of an actor defined in ``actor_module``: libraries are the Python
    installation (standard library, site-packages), Dramatiq and this runtime."""
    paths = sysconfig.get_paths()
    libraries: list[str | None] = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    libraries += [*site.getsitepackages(), site.getusersitepackages()]
    libraries += [_package_dir("dramatiq"), _package_dir(__name__)]
    return OwnCode(_package_dir(actor_module) if actor_module else "", _dirs(libraries))
