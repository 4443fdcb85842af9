"""Dramatiq's middleware signals, calling only the middleware that handle each one.

Dramatiq's ``Broker.emit_before`` / ``emit_after`` look up and call the hook of
every middleware for every signal, though most hooks are Middleware's empty
defaults: four signals per job over a dozen middleware is some 50 calls, of
which a handful do anything. Here each signal's list of real hooks is computed
once (again whenever the middleware list changes); what runs, its order and
its error handling are Dramatiq's. (A hook set on a middleware instance after
the first signal of its name is seen only once the list changes.)
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.middleware import Middleware, MiddlewareError


def _handles(middleware: Middleware, name: str) -> bool:
    """False only for Middleware's own empty hook, neither overridden nor set on the instance."""
    if name in vars(middleware):
        return True
    return getattr(type(middleware), name, None) is not getattr(Middleware, name, None)


class Signals:
    """Mixed into PostgresBroker ahead of Dramatiq's Broker."""

    middleware: list[Middleware]
    logger: logging.Logger
    _signal_hooks: dict[str, list[Middleware]]
    _signal_key: tuple[int, ...]

    def _hooks(self, name: str, reverse: bool) -> list[Middleware]:
        """The middleware that handle ``name``, in calling order."""
        # The key notices any change to the list (add_middleware, or a caller's own edit).
        key = tuple(map(id, self.middleware))
        if getattr(self, "_signal_key", None) != key:
            self._signal_hooks = {}
            self._signal_key = key
        hooks = self._signal_hooks.get(name)
        if hooks is None:
            ordered = reversed(self.middleware) if reverse else self.middleware
            hooks = [m for m in ordered if _handles(m, name)]
            self._signal_hooks[name] = hooks
        return hooks

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        signal = "before_" + signal
        for middleware in self._hooks(signal, reverse=False):
            try:
                getattr(middleware, signal)(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        signal = "after_" + signal
        for middleware in self._hooks(signal, reverse=True):
            try:
                getattr(middleware, signal)(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)
