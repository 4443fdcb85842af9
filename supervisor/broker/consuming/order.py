"""Where a middleware must sit in the broker's list, declared on its class and checked
when a worker starts.

Dramatiq calls the ``before_*`` hooks in the list's order and the ``after_*`` hooks in
reverse. A middleware whose hooks must run first or last says so with a ``placement``
class attribute (``Last`` or ``Before``, each with its reason); ``check`` raises one
``MiddlewareOrderError`` naming the first middleware out of place. Only the hooks around
a message's run count (``MESSAGE_HOOKS``): a middleware that has none of them (Dramatiq's
worker adds one for new queues, AsyncIO runs an event loop) may sit anywhere.

Adding a middleware from an actor module, ``broker.add_middleware(m)`` appends it after
the Fence; ``broker.add_middleware(m, before=Fence)`` puts it where it belongs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dramatiq.middleware import Middleware

from ..signals import handles

# The hooks of one message's run, in the worker thread: what the placements are about.
MESSAGE_HOOKS = ("before_process_message", "after_process_message", "after_skip_message")


@dataclass(frozen=True)
class Last:
    """No middleware with a message hook after this one: its ``before_*`` hooks run last
    and its ``after_*`` hooks first."""

    why: str


@dataclass(frozen=True)
class Before:
    """Ahead of every ``other`` in the list (if there is one): its ``after_*`` hooks run
    after the other's."""

    other: type[Middleware]
    why: str


Placement = Last | Before


class MiddlewareOrderError(RuntimeError):
    """A middleware is out of the place its class declares."""


def _name(middleware: Middleware | type[Middleware]) -> str:
    cls = middleware if isinstance(middleware, type) else type(middleware)
    return f"{cls.__module__}.{cls.__qualname__}"


def _runs_with_messages(middleware: Middleware) -> bool:
    return any(handles(middleware, hook) for hook in MESSAGE_HOOKS)


def check(middleware: Sequence[Middleware]) -> None:
    """Raise ``MiddlewareOrderError`` for the first middleware out of its declared place."""
    for i, m in enumerate(middleware):
        placement: Placement | None = getattr(m, "placement", None)
        if isinstance(placement, Last):
            after = [x for x in middleware[i + 1:] if _runs_with_messages(x)]
            if after:
                raise MiddlewareOrderError(
                    f"middleware {_name(after[0])} is after {_name(m)}, which must be last "
                    f"({placement.why}): add it with add_middleware(..., before={type(m).__name__})")
        elif isinstance(placement, Before):
            ahead = [x for x in middleware[:i] if isinstance(x, placement.other)]
            if ahead:
                raise MiddlewareOrderError(
                    f"middleware {_name(m)} is after {_name(ahead[0])}, and must be before it "
                    f"({placement.why}): add it with add_middleware(..., before={placement.other.__name__})")
