"""Dramatiq's middleware signals, calling only the middleware that handle each one.

Dramatiq's ``Broker.emit_before`` / ``emit_after`` look up and call the hook of
every middleware for every signal, though most hooks are Middleware's empty
defaults: four signals per job over a dozen middleware is some 50 calls, of
which a handful do anything. Here each signal's list of real hooks is computed
once (again whenever the middleware list changes); what runs, its order and
its error handling are Dramatiq's. (A hook set or replaced on a middleware instance
after the first signal of its name is seen only once the list changes.)

A job's own hooks (before/after_process_message) go further: the hooks of Dramatiq's
own middleware that provably do nothing for a message (its options and its actor's
name none of what they read, see PLAN_KEYS) are left out, per actor: 7 of 14 calls
for a plain actor, about 5 us of a job's CPU on the machine that measured it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import dramatiq.middleware
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Middleware,
    MiddlewareError,
    Pipelines,
    ShutdownNotifications,
)
from dramatiq.results import Results

from .middleware import FANIN, FANOUT, GROUP_MEMBER_OPTIONS, WORKFLOW, Retries

# Hooks of Dramatiq's own middleware (these exact classes, not subclasses) that do nothing
# for a message whose options name none of PLAN_KEYS, when its actor's options (and the
# middleware's defaults) do not ask for them: AgeLimit without a max_age,
# ShutdownNotifications without notify_shutdown (before: it registers nothing; after: it
# discards an entry there is none of); after a run that returned None without an
# exception, Pipelines without a pipe_target, Callbacks without on_success, Retries
# (exceptions only), Results without store_results. They are skipped for such a
# message: 7 of a job's 14 hook calls at the defaults. A middleware class of ours names
# the signals it is inert for in the plan's case in ``inert_when_planned`` (RunResults:
# a run that returned None reports no rows; GroupCallbacks and GroupSteps: no group).
PLAN_KEYS = frozenset({"max_age", "notify_shutdown", "pipe_target", "on_success", "store_results",
                       *GROUP_MEMBER_OPTIONS, FANOUT, FANIN, WORKFLOW})
_RETRIES = (Retries, dramatiq.middleware.Retries)


def inert(middleware: Middleware, signal: str, actor_options: dict[str, Any]) -> bool:
    """Whether ``middleware``'s ``signal`` hook does nothing for a message of an actor with
    ``actor_options`` in the plan's case (see PLAN_KEYS)."""
    kind = type(middleware)
    if signal in vars(kind).get("inert_when_planned", ()):  # a middleware of ours says so (its own class only)
        return True
    if kind is ShutdownNotifications:
        notify = actor_options.get("notify_shutdown")
        return not (middleware.notify_shutdown if notify is None else notify)  # type: ignore[attr-defined]
    if signal == "before_process_message":
        return kind is AgeLimit and not actor_options.get("max_age", middleware.max_age)  # type: ignore[attr-defined]
    if kind is Pipelines:
        return True  # pipe_target is the message's own option only
    if kind is Callbacks:
        return not actor_options.get("on_success")
    if kind in _RETRIES:
        return True
    if kind is Results:
        return not actor_options.get("store_results", middleware.store_results)  # type: ignore[attr-defined]
    return False


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
        # (signal, actor) -> its hooks less the inert ones (see PLAN_KEYS)
        self.plans: dict[tuple[str, Any], list[tuple[Middleware, Callable[..., Any]]]] = {}


def _forgetting(name: str) -> Callable[..., Any]:
    """list's own ``name``, after which the hooks are computed again."""
    method = getattr(list, name)

    def changed(self: MiddlewareList, *args: Any, **kwargs: Any) -> Any:
        self.hooks = {}
        self.plans = {}
        return method(self, *args, **kwargs)

    changed.__name__ = changed.__qualname__ = name
    return changed


# Every method that changes a list in place.
for _name in ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse",
              "__setitem__", "__delitem__", "__iadd__", "__imul__"):
    setattr(MiddlewareList, _name, _forgetting(_name))


# A middleware signal of the broker's (emit_before / emit_after), as its parts are given
# it: (signal, *args, **kwargs).
Emit = Callable[..., None]


class Signals:
    """A base of PostgresBroker, ahead of Dramatiq's Broker: ``middleware`` as a property
    (only a class can hold one) and Dramatiq's emit_before / emit_after, which Dramatiq
    calls on the broker and whose hooks are given the broker itself."""

    logger: logging.Logger
    actors: dict[str, Any]
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

    def _planned(self, signal: str, hooks: list[tuple[Middleware, Callable[..., Any]]], message: Any
                 ) -> list[tuple[Middleware, Callable[..., Any]]]:
        """``hooks`` less those inert for ``message`` (see PLAN_KEYS), computed once per actor.
        An actor's options are read at its first message (as Dramatiq's options are fixed
        when the actor is declared); a change of the middleware list computes them again."""
        try:
            options, name = message.options, message.actor_name
        except AttributeError:  # not a message (a test's None): no plan
            return hooks
        if options and not PLAN_KEYS.isdisjoint(options):
            return hooks
        actor = self.actors.get(name)
        if actor is None:
            return hooks
        plans = self._middleware.plans
        plan = plans.get((signal, actor))
        if plan is None:
            plan = plans[(signal, actor)] = [(m, h) for m, h in hooks if not inert(m, signal, actor.options)]
        return plan

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        if signal == "process_message" and len(args) == 1 and not kwargs:
            return self.before_process(args[0])
        signal = "before_" + signal
        for middleware, hook in self._hooks(signal, reverse=False):
            try:
                hook(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        if signal == "process_message" and len(args) == 1 and kwargs.keys() <= _OUTCOME_KEYS:
            return self.after_process(args[0], **kwargs)
        signal = "after_" + signal
        for middleware, hook in self._hooks(signal, reverse=True):
            try:
                hook(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)

    # A job's own two signals, the hot path: the hooks called with the message itself,
    # not through *args and **kwargs (a microsecond a job), the inert ones left out.

    def before_process(self, message: Any) -> None:
        """``emit_before("process_message", message)``."""
        hooks = self._planned(_BEFORE, self._hooks(_BEFORE, reverse=False), message)
        for middleware, hook in hooks:
            try:
                hook(self, message)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", _BEFORE, middleware, exc_info=True)

    def after_process(self, message: Any, *, result: Any = None, exception: BaseException | None = None) -> None:
        """``emit_after("process_message", message, result=...)`` (or ``exception=...``)."""
        hooks = self._hooks(_AFTER, reverse=True)
        if exception is None and result is None:
            hooks = self._planned(_AFTER, hooks, message)
        for middleware, hook in hooks:
            try:
                if exception is None:
                    hook(self, message, result=result)
                else:
                    hook(self, message, exception=exception)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", _AFTER, middleware, exc_info=True)


_BEFORE, _AFTER = "before_process_message", "after_process_message"
_OUTCOME_KEYS = frozenset({"result", "exception"})  # what emit_after("process_message") may carry
