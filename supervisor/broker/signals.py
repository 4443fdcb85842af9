"""Dramatiq's middleware signals, calling only the middleware that handle each one.

Dramatiq's ``Broker.emit_before`` / ``emit_after`` look up and call the hook of
every middleware for every signal, though most hooks are Middleware's empty
defaults: four signals per job over a dozen middleware is some 50 calls, of
which a handful do anything. Here each signal's list of real hooks is computed
once (again whenever the middleware list changes); what runs, its order and
its error handling are Dramatiq's. (A hook set or replaced on a middleware instance
after the first signal of its name is seen only once the list changes.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from dramatiq.middleware import Middleware, MiddlewareError


def handles(middleware: Middleware, name: str) -> bool:
    """False only for Middleware's own empty hook, neither overridden nor set on the instance."""
    if name in vars(middleware):
        return True
    return getattr(type(middleware), name, None) is not getattr(Middleware, name, None)


class MiddlewareList(list[Middleware]):
    """The broker's middleware list, holding each signal's hooks; any change to the
    list (add_middleware, or a caller's own edit) forgets them. Checking the list
    on every signal instead cost more than the calls it saved."""

    def __init__(self, items: Iterable[Middleware] = ()) -> None:
        super().__init__(items)
        # signal -> (middleware, its bound hook): no attribute lookup per call
        self.hooks: dict[str, list[tuple[Middleware, Callable[..., Any]]]] = {}


def _forgetting(name: str) -> Callable[..., Any]:
    """list's own ``name``, after which the hooks are computed again."""
    method = getattr(list, name)

    def changed(self: MiddlewareList, *args: Any, **kwargs: Any) -> Any:
        self.hooks = {}
        return method(self, *args, **kwargs)

    changed.__name__ = changed.__qualname__ = name
    return changed


# Every method that changes a list in place.
for _name in ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse",
              "__setitem__", "__delitem__", "__iadd__", "__imul__"):
    setattr(MiddlewareList, _name, _forgetting(_name))


class Signals:
    """Mixed into PostgresBroker ahead of Dramatiq's Broker."""

    logger: logging.Logger
    _middleware: MiddlewareList

    @property
    def middleware(self) -> MiddlewareList:
        return self._middleware

    @middleware.setter
    def middleware(self, items: Iterable[Middleware]) -> None:
        # Dramatiq's Broker.__init__ assigns a plain list: keep it as ours.
        self._middleware = items if isinstance(items, MiddlewareList) else MiddlewareList(items)

    def _hooks(self, name: str, reverse: bool) -> list[tuple[Middleware, Callable[..., Any]]]:
        """The middleware that handle ``name``, in calling order, each with its hook."""
        middleware = self._middleware
        hooks = middleware.hooks.get(name)
        if hooks is None:
            ordered = reversed(middleware) if reverse else middleware
            hooks = middleware.hooks[name] = [(m, getattr(m, name)) for m in ordered if handles(m, name)]
        return hooks

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        signal = "before_" + signal
        for middleware, hook in self._hooks(signal, reverse=False):
            try:
                hook(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        signal = "after_" + signal
        for middleware, hook in self._hooks(signal, reverse=True):
            try:
                hook(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)
