"""PostgresConsumer: claims rows of one queue in batches, sized by what the process can run."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from dramatiq.broker import Consumer
from dramatiq.errors import BrokerConnectionError

from ... import testsignals
from ..message import PgMessageProxy
from .capacity import Capacity

log = logging.getLogger(__name__)

ClaimFn = Callable[[str, int, bool], list[PgMessageProxy]]

# While the database is away, claim again this often (each try is cheap: the
# broker waits for a connection only briefly then). Dramatiq's own answer to a
# connection error, restarting the consumer after 3 s, would add those 3 s to
# every recovery.
OUTAGE_RETRY_SECONDS = 0.1


class Outcomes(Protocol):
    """Where a consumer writes what became of a message (the broker's ``outcomes``)."""

    def ack(self, message: PgMessageProxy, on_written: Callable[[int], None] | None = None) -> None: ...
    def nack(self, message: PgMessageProxy) -> None: ...
    def requeue(self, messages: Iterable[PgMessageProxy], reason: str = ...) -> int: ...


class PostgresConsumer(Consumer):
    """Given everything it needs: the claim function, its queue's wake-up event,
    its capacity (the queue's prefetch bound, within the process's capacity),
    the process's claiming switch, and where outcomes go.

    The consumer is the one owner of capacity: it reserves before a claim and
    releases what the claim did not fill and every finished message.
    """

    def __init__(
        self,
        queue_name: str,
        *,
        prefetch: int,
        timeout_ms: int,
        claim: ClaimFn,
        wakeup: threading.Event,
        capacity: Capacity,
        claiming: threading.Event,
        poll_interval: float,
        outcomes: Outcomes,
        priority: Callable[[PgMessageProxy], int] | None = None,
    ) -> None:
        self.queue_name = queue_name
        self.prefetch = max(1, prefetch)
        self.timeout = timeout_ms / 1000
        self.buffer: deque[PgMessageProxy] = deque()
        self.wakeup = wakeup
        self.capacity = capacity
        self.claiming = claiming
        self.poll_interval = poll_interval
        self.outcomes = outcomes
        self.priority = priority
        self._claim = claim
        self._more = True  # claim at once on start: there may be a backlog
        self._next_poll = 0.0
        self._outage = False

    def __next__(self) -> PgMessageProxy | None:
        """Return a claimed message, or None after ``timeout`` so the consumer
        thread can notice a stop (Dramatiq's Consumer: one message at a time)."""
        if self.buffer:
            return self.buffer.popleft()
        claimed = self.take(self.timeout)
        if not claimed:
            return None
        self.buffer.extend(claimed)
        return self.buffer.popleft()

    def take(self, timeout: float) -> list[PgMessageProxy]:
        """Claim a batch, ordered by actor priority, or return [] after ``timeout``
        seconds (the caller's chance to notice a stop or a pause). The database is
        asked only when there is reason to expect work: a NOTIFY for this queue, the
        last claim came back full, or the poll interval (for delayed and retried
        jobs) has passed. The batch's capacity stays reserved until each message's
        ack, nack or requeue."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return []
            if not self.claiming.is_set():
                self.claiming.wait(remaining)
                continue
            if not (self._more or self.wakeup.is_set() or now >= self._next_poll):
                self.wakeup.wait(min(remaining, self._next_poll - now))
                continue
            n = self.capacity.reserve(self.prefetch)
            if n == 0:
                self.capacity.wait_free(remaining)
                continue
            self.wakeup.clear()
            try:
                claimed = self._claim(self.queue_name, n, not self._more)
            except BrokerConnectionError as exc:
                self.capacity.release(n)
                if not self._outage:
                    log.warning("cannot claim from %s (%s); trying again every %.1fs",
                                self.queue_name, exc, OUTAGE_RETRY_SECONDS)
                    testsignals.emit(testsignals.ClaimsFailing(self.queue_name))
                self._outage = self._more = True
                self.wakeup.wait(min(OUTAGE_RETRY_SECONDS, max(0.0, deadline - time.monotonic())))
                continue
            except BaseException:
                self.capacity.release(n)
                raise
            if self._outage:
                log.warning("claiming from %s again", self.queue_name)
                testsignals.emit(testsignals.ClaimsBack(self.queue_name))
                self._outage = False
            # At DEBUG, each claim and what it found: an operator asking why a queue's
            # jobs sit (paused, keys held, not due) sees that they are being asked for.
            log.debug("claimed %d of %d from %s", len(claimed), n, self.queue_name)
            if testsignals.recording:
                testsignals.emit(testsignals.Claimed(self.queue_name, len(claimed), n))
            self.capacity.release(n - len(claimed))
            self._more = len(claimed) == n
            self._next_poll = time.monotonic() + self.poll_interval
            if claimed:
                if self.priority is not None and len(claimed) > 1:
                    # What it holds together goes to the worker by Dramatiq's actor
                    # priority, lower first (a stable sort: claim order within one).
                    claimed.sort(key=self.priority)
                return claimed

    def ack(self, message: PgMessageProxy) -> None:  # type: ignore[override]  # only our claims arrive
        # The process's slot is free once the job is done (the next claim overlaps
        # the ack's commit); the queue's prefetch slot only once the ack has
        # committed: until then the row is 'running', and prefetch bounds what the
        # database shows as held, as with Dramatiq's own brokers.
        try:
            self.outcomes.ack(message, on_written=self.capacity.release_own)
        except BaseException:
            self.capacity.release_own()
            raise
        finally:
            self.capacity.release_within()

    def nack(self, message: PgMessageProxy) -> None:  # type: ignore[override]  # only our claims arrive
        try:
            self.outcomes.nack(message)
        finally:
            self.capacity.release()

    def requeue(self, messages: Iterable[PgMessageProxy]) -> None:  # type: ignore[override]
        messages = list(messages)
        try:
            count = self.outcomes.requeue(messages)
        finally:
            self.capacity.release(len(messages))
        if count:
            log.info("requeued %d unstarted jobs of %s", count, self.queue_name)

    def give_back(self, messages: list[PgMessageProxy], waited: float) -> int:
        """Rows handed to the worker that no thread took for ``waited`` seconds, every
        thread busy with jobs that did not end (pace.GiveBack): back to the queue, for
        a process with a free thread. Returns how many; raises if they could not be
        written (they are still this process's then)."""
        count = self.outcomes.requeue(messages, reason=f"given back unstarted: no thread free for"
                                                         f" {waited * 1000:.0f} ms")
        self.capacity.release(len(messages))
        log.debug("gave back %d jobs of %s: no thread free for %.0f ms", len(messages), self.queue_name,
                  waited * 1000)
        return count

    def close(self) -> None:
        if self.buffer:
            try:
                self.requeue(list(self.buffer))
            except BrokerConnectionError:
                log.warning("could not requeue %d prefetched jobs; their leases will expire", len(self.buffer))
            self.buffer.clear()
