"""End to end: a local marketplace and webhook receivers, real worker processes.

Scrapes for four watches run through scraping, extraction, alerting and
notification. Every deal reaches its webhook exactly once, although the
notification worker is SIGKILLed after one webhook received its request and
before the ledger recorded the answer, and another webhook answers only after
the client has timed out. Re-scraping everything adds nothing and sends nothing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from werkzeug import Response

from tests.conftest import scalar, wait_for
from tests.pipeline_helpers import (
    PipelineWorker,
    make_source,
    make_watch,
    seed_baseline,
    settled,
)

RAM = [
    {"id": "A1", "title": "Corsair Vengeance 32GB (2x16GB) DDR4 3200MHz", "price": "$60.00", "url": "/i/A1"},
    {"id": "A2", "title": "G.Skill Ripjaws 32GB DDR4-3200", "price": "$90.00", "url": "/i/A2"},
    {"id": "A3", "title": "Kingston Fury 32GB DDR4 3200", "price": "$95.00", "url": "/i/A3"},
]
SSD = [
    {"id": "N1", "title": "Samsung 970 EVO 1TB NVMe M.2", "price": 80, "url": "/i/N1"},
    {"id": "N2", "title": "WD Black SN770 1TB NVMe", "price": 85, "url": "/i/N2"},
]
DDR5 = [{"id": "D1", "title": "Corsair 64GB (2x32GB) DDR5 6000 kit", "price": 120, "url": "/i/D1"}]
GPU_HTML = """<html><body>
<div class="s-item" data-listing-id="H1"><a href="/p/H1"><span class="title">MSI RTX 3080 Gaming X 10GB</span></a>
  <span class="price">$450.00</span></div>
<div class="s-item" data-listing-id="H2"><a href="/p/H2"><span class="title">ASUS TUF RTX 3080 OC</span></a>
  <span class="price">$690.00</span></div>
</body></html>"""


class Hooks:
    """Webhook receivers: every request, per path."""

    def __init__(self, server):
        self.server = server
        self.got: dict[str, list[dict]] = {}
        self.lock = threading.Lock()

    def add(self, path: str, before_answer=None, status: int = 204) -> str:
        def handle(request):
            with self.lock:
                self.got.setdefault(path, []).append(request.get_json())
                n = len(self.got[path])
            if before_answer:
                before_answer(n)
            return Response("", status=status)

        self.server.expect_request(path, method="POST").respond_with_handler(handle)
        return self.server.url_for(path)

    def count(self, path: str) -> int:
        with self.lock:
            return len(self.got.get(path, []))


def test_pipeline_delivers_each_deal_exactly_once(conn, database_url, pipeline_broker, threaded_server):
    from actors.scraping import send_scrape

    server = threaded_server
    pages = {"ddr4 32gb": RAM, "nvme 1tb": SSD, "ddr5 64gb": DDR5}
    server.expect_request("/json/search").respond_with_handler(
        lambda r: Response(json.dumps({"results": pages[r.args["q"]]}), content_type="application/json"))
    server.expect_request("/html/search").respond_with_data(GPU_HTML, content_type="text/html")

    notifier: dict[str, PipelineWorker] = {}

    def kill_notifier(n: int) -> None:
        # The request has arrived; the worker dies before it can read the answer.
        if n == 1:
            os.kill(notifier["current"].pid, signal.SIGKILL)
            notifier["current"].proc.wait(10)

    hooks = Hooks(server)
    json_shop = make_source(conn, "jsonshop", server.url_for("/json/search") + "?q={query}")
    html_shop = make_source(conn, "htmlshop", server.url_for("/html/search") + "?q={query}", fmt="html")
    seed_baseline(conn, "gpu:rtx3080", 70_000)
    watches = {
        "ram": make_watch(conn, json_shop, "ddr4 32gb", target_price_cents=7_000,
                          webhook_url=hooks.add("/hook/ram", before_answer=kill_notifier)),
        "gpu": make_watch(conn, html_shop, "rtx 3080", webhook_format="discord",
                          webhook_url=hooks.add("/api/webhooks/42/gpu-secret-token")),
        "ssd": make_watch(conn, json_shop, "nvme 1tb", target_price_cents=5_000, webhook_url=hooks.add("/hook/ssd")),
        "ddr5": make_watch(conn, json_shop, "ddr5 64gb", target_price_cents=15_000,
                           webhook_url=hooks.add("/hook/slow", before_answer=lambda n: time.sleep(1.5))),
    }

    # Strict mode: an unknown outcome is never resent, so every deal reaches its webhook
    # exactly once (the default resends it: tests/test_notification.py).
    pipeline = {"notification": {"timeout": 0.5, "resend_unknown": False}}
    workers = [PipelineWorker(database_url, queues=["scraping", "extraction"],
                              actors=["actors.scraping", "actors.extraction"], pipeline=pipeline)]
    notifier["current"] = PipelineWorker(database_url, queues=["notification"], actors=["actors.notification"],
                                         threads=1, pipeline=pipeline)
    workers.append(notifier["current"])
    try:
        for w in workers:
            w.wait_ready(conn)
        dead_owner = notifier["current"].owner(conn)
        for watch_id in watches.values():
            send_scrape(watch_id)

        wait_for(lambda: notifier["current"].proc.poll() is not None, timeout=60,
                 message="the notification worker to be killed mid-request")
        # What the supervisor does when it reaps a dead child: release its leases at once.
        released = pipeline_broker.leases.release_owner(dead_owner, why="worker killed")
        assert len(released) == 1
        notifier["current"] = PipelineWorker(database_url, queues=["notification"], actors=["actors.notification"],
                                             threads=1, pipeline=pipeline)
        workers.append(notifier["current"])
        notifier["current"].wait_ready(conn)
        wait_for(lambda: settled(conn), timeout=60, message="the pipeline to settle")

        # Every deal reached its webhook exactly once; the non-deals did not.
        assert {p: hooks.count(p) for p in ("/hook/ram", "/api/webhooks/42/gpu-secret-token", "/hook/ssd",
                                           "/hook/slow")} == {
            "/hook/ram": 1, "/api/webhooks/42/gpu-secret-token": 1, "/hook/ssd": 0, "/hook/slow": 1}
        assert hooks.got["/hook/ram"][0]["listing"]["title"].startswith("Corsair Vengeance")
        assert hooks.got["/api/webhooks/42/gpu-secret-token"][0]["embeds"][0]["title"] == "MSI RTX 3080 Gaming X 10GB"

        alerts = dict(conn.execute(
            "SELECT w.query, array_agg(n.status ORDER BY n.id) FROM alerts a JOIN watches w ON w.id = a.watch_id"
            " JOIN notification_attempts n ON n.alert_id = a.id GROUP BY w.query").fetchall())
        # Killed after sending and timed out after sending: outcome unknown, not resent.
        assert alerts == {"ddr4 32gb": ["unknown"], "rtx 3080": ["succeeded"], "ddr5 64gb": ["unknown"]}
        assert dict(conn.execute("SELECT w.query, a.notified FROM alerts a JOIN watches w ON w.id = a.watch_id"
                                 ).fetchall()) == {"ddr4 32gb": False, "rtx 3080": True, "ddr5 64gb": False}
        deliveries = conn.execute("SELECT status, attempts, coalesce(last_error, '') LIKE '%%DeliveryOutcomeUnknown%%'"
                                  " FROM jobs WHERE actor = 'deliver_alert' ORDER BY status, attempts").fetchall()
        assert deliveries == [("failed", 1, True), ("failed", 2, True), ("succeeded", 1, False)]
        assert scalar(conn, "SELECT count(*) FROM listings") == 8
        assert scalar(conn, "SELECT count(*) FROM price_points") == 8
        assert scalar(conn, "SELECT count(*) FROM listings WHERE product_key IS NOT NULL") == 8
        assert scalar(conn, "SELECT count(*) FROM watches WHERE last_polled_at IS NULL") == 0

        # Scraping everything again changes nothing downstream.
        for watch_id in watches.values():
            send_scrape(watch_id)
        wait_for(lambda: settled(conn) and scalar(
            conn, "SELECT count(*) FROM jobs WHERE actor = 'scrape_watch' AND status = 'succeeded'") == 8,
            timeout=60, message="the second round to settle")
        assert scalar(conn, "SELECT count(*) FROM price_points") == 8
        assert scalar(conn, "SELECT count(*) FROM alerts") == 3
        assert sum(hooks.count(p) for p in hooks.got) == 3
    finally:
        for w in workers:
            w.kill()
