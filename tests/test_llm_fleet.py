"""The LLM's concurrency cap holds across processes (a PostgreSQL semaphore of
advisory locks), and a killed holder's slot comes back."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import threading

import psycopg

from tests.conftest import ROOT, scalar, wait_for
from tests.test_extraction import fake_llm

MODEL = "fleet-fake"


def extract_many(url: str, base_url: str, n: int, barrier, out) -> None:
    """One process of the fleet: n extractions at once from n threads."""
    from psycopg_pool import ConnectionPool

    from actors import llm
    from actors.settings import LlmSettings

    cfg = LlmSettings(base_url=base_url, model=MODEL, api_key=None, concurrency=2, rate_per_minute=60_000,
                      timeout=30.0)
    results: list[str] = []
    with ConnectionPool(url, min_size=1, max_size=n + 1, kwargs={"autocommit": True}) as pool:
        barrier.wait(60)

        def one(k: int) -> None:
            results.append(llm.extract(cfg, pool, f"Samsung 1TB NVMe #{k}", None, None).extractor)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    out.put(results)


def test_the_llm_cap_holds_across_three_processes(conn, database_url, threaded_server):
    from actors.queries import slots

    seen = fake_llm(threaded_server, {"component": "ssd", "capacity_gb": 1000, "interface": "nvme"}, delay=0.2)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=extract_many, args=(database_url, threaded_server.url_for("/v1"), 3, barrier, out))
             for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(30)
    assert [sorted(r) for r in results] == [[f"llm:{MODEL}"] * 3] * 3  # nobody fell back to the rules
    assert len(seen["requests"]) == 9 and seen["peak"] == 2
    assert scalar(conn, slots.HELD, {"key": f"llm:{MODEL}"}) == 0  # every slot given back


HOLD = """
import sys, psycopg
from actors.queries import slots
conn = psycopg.connect(sys.argv[1])  # the slot lives as long as this transaction
assert conn.execute(slots.TRY_SLOT, {"key": "llm:held", "slot": 0}).fetchone()[0]
print("held", flush=True)
sys.stdin.read()
"""


def test_a_killed_holder_frees_its_slot(conn, database_url):
    from actors.queries import slots

    holder = subprocess.Popen([sys.executable, "-c", HOLD, database_url], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert scalar(conn, slots.HELD, {"key": "llm:held"}) == 1
        with psycopg.connect(database_url, autocommit=True) as other:
            assert other.execute(slots.TRY_SLOT, {"key": "llm:held", "slot": 0}).fetchone()[0] is False
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        wait_for(lambda: scalar(conn, slots.HELD, {"key": "llm:held"}) == 0, 10, message="the slot freed")
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
