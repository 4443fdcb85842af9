"""``supervisor.pipeline``: Dramatiq's pipeline whose steps may also be groups.

``pipeline([a.message(), dramatiq.group([b.message(), c.message()]), d.message()])``:
``a`` runs; ``b`` and ``c`` each receive its result (unless pipe_ignore) and run at once;
``d`` receives ``[result of b, result of c]`` (member order) as its last argument once
both succeeded. A member that fails for good stops the pipeline there: the steps after
its group never run, and why is logged and kept in ``pipeline_fanins.failed``
(broker/fanin.py). A pipeline of messages only is Dramatiq's own, unchanged.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import dramatiq
from dramatiq import composition
from dramatiq.broker import Broker
from dramatiq.message import Message
from dramatiq.results import ResultMissing

from .broker.fanin import Step, send_step
from .broker.middleware import FANIN, FANOUT

Child = Message[Any] | composition.pipeline | composition.group


def _members(g: composition.group) -> list[Message[Any]]:
    members = list(g.children)
    if not members or not all(isinstance(m, Message) for m in members):
        raise TypeError("a group step of supervisor.pipeline holds one or more messages (no groups or pipelines)")
    if g.completion_callbacks:
        raise TypeError("a group step of supervisor.pipeline takes no completion callback: the next step is its")
    return members


class pipeline(composition.pipeline):  # noqa: N801  (dramatiq's name, a drop-in)
    """Dramatiq's ``pipeline`` (same arguments; a pipeline of messages only behaves as
    Dramatiq's), whose steps may also be ``dramatiq.group``\\ s of messages.

    ``messages`` holds the steps: a Message, or a group of messages."""

    messages: list[Message[Any] | composition.group]  # type: ignore[assignment]  # dramatiq's: messages only

    def __init__(self, children: Iterable[Child], *, broker: Broker | None = None) -> None:
        children = list(children)
        self.broker = broker or dramatiq.get_broker()
        steps: list[Message[Any] | composition.group] = []
        for child in children:
            if isinstance(child, composition.pipeline):
                steps.extend(s.copy() if isinstance(s, Message) else s for s in child.messages)
            elif isinstance(child, composition.group):
                _members(child)
                steps.append(child)
            else:
                steps.append(child.copy())
        self.messages = steps
        plain = [s for s in steps if isinstance(s, Message)]
        if len(plain) == len(steps):
            # Dramatiq's own chaining (pipe_target), as dramatiq.pipeline makes it.
            for message, next_message in zip(plain, plain[1:], strict=False):
                message.options["pipe_target"] = next_message.asdict()

    @property
    def has_groups(self) -> bool:
        return any(isinstance(s, composition.group) for s in self.messages)

    def __or__(self, other: Child) -> pipeline:
        return type(self)([*self.messages, other], broker=self.broker)

    def _first_step(self) -> Step:
        """The steps linked back to front, a fresh fan-in id for each group (a pipeline run
        again fans in apart): the first step, whose options carry the rest."""
        then: Step | None = None
        for step in reversed(self.messages):
            if isinstance(step, Message):
                message = step.copy()
                message.options.pop("pipe_target", None)
                if then is not None:
                    message.options["pipe_target" if "message" in then else FANOUT] = then.get("message") or then["group"]
                then = {"message": message.asdict()}
            else:
                members = _members(step)
                fanin_id = str(uuid.uuid4())
                linked = [m.copy(options={FANIN: {"id": fanin_id, "index": i, "size": len(members), "then": then}})
                          for i, m in enumerate(members)]
                then = {"group": {"id": fanin_id, "members": [m.asdict() for m in linked]}}
        assert then is not None
        return then

    def run(self, *, delay: int | None = None) -> pipeline:
        """Send the first step (a message, or a group's members); the rest follow."""
        if not self.has_groups:
            super().run(delay=delay)  # type: ignore[no-untyped-call]  # dramatiq's, unannotated
            return self
        first = self._first_step()
        if "message" in first:
            delay = max(delay or 0, first["message"]["options"].get("delay") or 0) or None
        send_step(self.broker, first, delay=delay)
        return self

    # --- results (the members' own, for actors with store_results) -----------------------

    def _result(self, step: Message[Any] | composition.group, *, block: bool, timeout: int | None) -> Any:
        if isinstance(step, composition.group):
            return list(step.get_results(block=block, timeout=timeout))
        return step.get_result(backend=self.broker.get_results_backend(), block=block, timeout=timeout)

    def get_result(self, *, block: bool = False, timeout: int | None = None) -> Any:
        """The last step's result (a group's: the list of its members' results)."""
        return self._result(self.messages[-1], block=block, timeout=timeout)

    def get_results(self, *, block: bool = False, timeout: int | None = None) -> Iterator[Any]:
        """Each step's result, in order."""
        deadline = None if not timeout else time.monotonic() + timeout / 1000
        for step in self.messages:
            if deadline is not None:
                timeout = max(0, int((deadline - time.monotonic()) * 1000))
            yield self._result(step, block=block, timeout=timeout)

    @property
    def completed_count(self) -> int:
        """Steps whose result is stored, counted from the first up to the first missing one."""
        for count, step in enumerate(self.messages):
            try:
                self._result(step, block=False, timeout=None)
            except ResultMissing:
                return count
        return len(self.messages)

    @property
    def completed(self) -> bool:
        """Whether the last step's result is stored (as Dramatiq's: False when it stores none)."""
        try:
            self.get_result()
        except ResultMissing:
            return False
        return True
