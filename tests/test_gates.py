"""broker/consuming/gates.py: which claim a queue gets, and when, from what its claims and notices said."""

from __future__ import annotations

from supervisor.broker.consuming import gates
from supervisor.broker.consuming.gates import CUT_PAUSE, MOST_KEYS, PROBE_SECONDS, Gates, max_keys


def claimed(g: Gates, queue: str = "q", n: int = 8, **meta) -> None:
    """A claim of the queue, as the broker makes one: asks which, then learns what it found."""
    g.statement(queue)
    g.learned(queue, n, **meta)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_plain_queue_probes_at_its_first_claim_then_every_probe_seconds():
    clock = Clock()
    g = Gates(clock)
    assert g.statement("q") == (False, True)
    assert g.statement("q") == (False, False)
    clock.now += PROBE_SECONDS
    assert g.statement("q") == (False, True)


def test_waiting_rows_make_claims_keyed_until_a_keyed_claim_sees_no_key():
    g = Gates(Clock())
    g.waiting("q")  # '+q'
    assert g.statement("q") == (True, False)
    claimed(g, wait=None, cursor="k9", keys=3, took=5)
    assert g.statement("q") == (True, False) and g.params("q", 8)["cursor"] == "k9"
    claimed(g, wait=None, cursor=None, keys=0, took=0)
    assert g.statement("q")[0] is False


def test_keys_all_gated_let_plain_claims_run_until_the_first_opens_or_a_notice():
    clock = Clock()
    g = Gates(clock)
    g.waiting("q")
    claimed(g, wait=0.3, cursor="k", keys=5, took=0)
    assert g.statement("q") == (False, False)  # plain rows still claimed, keys not read
    clock.now += 0.3
    assert g.statement("q") == (True, False)
    claimed(g, wait=30.0, cursor="k", keys=5, took=0)
    assert g.statement("q") == (False, False)
    g.wake("q")  # a deadline of the queue passed (a delayed waiting row is due)
    assert g.statement("q") == (True, False)
    claimed(g, wait=None, cursor="k", keys=5, took=0)  # gated by slots only: no time
    clock.now += PROBE_SECONDS - 0.01
    assert g.statement("q") == (False, False)
    g.waiting("q")  # a slot freed: '+q'
    assert g.statement("q") == (True, False)


def test_a_scan_cut_with_every_key_gated_reads_on_after_a_pause_that_doubles():
    clock = Clock()
    g = Gates(clock)
    g.waiting("q")
    pauses, reads = [], []
    for streak in range(8):
        reads.append(g.params("q", 8)["max_keys"])
        claimed(g, wait=3600.0, cursor="k", keys=max_keys(8, streak), took=0)
        start = clock.now
        while g.statement("q") != (True, False):
            clock.now += 0.001
        pauses.append(round(clock.now - start, 3))
    assert pauses == [min(CUT_PAUSE * 2 ** i, PROBE_SECONDS) for i in range(8)]
    assert pauses[-1] == PROBE_SECONDS
    # each claim of the streak reads 4x the keys of the one before, up to MOST_KEYS
    assert reads == [min(MOST_KEYS, max_keys(8) * 4 ** i) for i in range(8)]
    assert reads[-1] == MOST_KEYS
    g.params("q", 8)
    claimed(g, wait=None, cursor="k", keys=max_keys(8), took=2)  # took rows: no pause
    assert g.params("q", 8)["max_keys"] == max_keys(8)  # and the next claim reads as few again
    claimed(g, wait=3600.0, cursor="k", keys=max_keys(8), took=0)
    clock.now += CUT_PAUSE
    assert g.statement("q") == (True, False)


def test_a_scan_that_reaches_every_key_all_gated_waits_for_the_first_to_open():
    """A streak's claim reads 4x the keys: once it reads fewer than it may (it came round to
    where it started), it was not cut, and the queue's keys are read again when the first
    gate opens (the wait), at most PROBE_SECONDS later, not after a short pause."""
    clock = Clock()
    g = Gates(clock)
    g.waiting("q")
    g.params("q", 8)
    claimed(g, wait=3600.0, cursor="k", keys=max_keys(8), took=0)  # cut: 32 read of 132 keys
    clock.now += CUT_PAUSE
    assert g.statement("q") == (True, False)
    assert g.params("q", 8)["max_keys"] == 4 * max_keys(8)
    claimed(g, wait=3600.0, cursor="k", keys=100, took=0)  # fewer than it may: round to the start
    clock.now += PROBE_SECONDS - 0.01
    assert g.statement("q") == (False, False)
    clock.now += 0.01
    assert g.statement("q") == (True, False)


def test_a_wait_is_announced_only_when_sooner_than_the_last():
    clock = Clock()
    g = Gates(clock)
    assert g.params("q", 8)["announced"] is None
    claimed(g, wait=2.0, cursor=None, keys=1, took=1)
    assert g.params("q", 8)["announced"] == 2.0
    claimed(g, wait=5.0, cursor=None, keys=1, took=1)
    assert g.params("q", 8)["announced"] == 2.0
    clock.now += 2.0
    assert g.params("q", 8)["announced"] is None


def test_notice_payloads():
    assert gates.parse("~shop queue 1.25") == ("shop queue", 1.25)
    assert gates.parse("~q x") is None and gates.parse("q") is None
    assert gates.waiting_queue("+q") == "q" and gates.waiting_queue("@q") is None


def test_a_notice_during_a_claim_is_not_undone_by_what_the_claim_found():
    g = Gates(Clock())
    g.waiting("q")
    assert g.statement("q") == (True, False)
    g.waiting("q")  # '+q' while the claim ran: rows it could not see
    g.learned("q", 8, wait=2.0, cursor=None, keys=1, took=0)
    assert g.statement("q") == (True, False)  # no pause: claim again
    g.waiting("q")
    g.learned("q", 8, wait=None, cursor=None, keys=0, took=0)
    assert g.statement("q") == (True, False)  # still keyed
