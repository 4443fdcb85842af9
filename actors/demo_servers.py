"""The demo's two local HTTP servers, on 127.0.0.1 only: a marketplace whose
listings and prices move over time, and a webhook receiver that counts what
it is sent (by Idempotency-Key, so a duplicate delivery would show)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Product:
    query: str
    title: str
    base_cents: int


PRODUCTS = (
    Product("rtx 3080", "NVIDIA GeForce RTX 3080 10GB graphics card", 52_000),
    Product("ddr4 32gb", "Corsair Vengeance 32GB (2x16GB) DDR4 3200 desktop memory", 9_000),
    Product("nvme 1tb", "Samsung 970 EVO Plus 1TB NVMe M.2 SSD", 8_000),
)
REGULAR = 8  # listings per product at roughly the usual price
DEAL_EVERY = 6.0  # seconds between flash deals per product (the first after DEAL_START)
DEAL_START = 4.0
DEAL_PRICE = 0.6  # of the usual price


def listings(product: Product, elapsed: float, now: datetime) -> list[dict[str, Any]]:
    """What the marketplace lists for ``product`` ``elapsed`` seconds after it opened:
    regular listings whose prices drift, two of them auctions, plus the current
    flash deal: two of them take turns every DEAL_EVERY seconds, so each disappears
    and comes back (and alerts again: a deal that reappears is news)."""
    slug = product.query.replace(" ", "-")
    out = []
    for i in range(REGULAR):
        drift = 1 + 0.04 * math.sin(elapsed / 7.0 + i) + 0.02 * (i - REGULAR / 2) / REGULAR
        item: dict[str, Any] = {"id": f"{slug}-{i}", "title": f"{product.title} (seller {i})",
                                "price_cents": round(product.base_cents * drift), "currency": "USD",
                                "url": f"/item/{slug}-{i}", "price_type": "ask"}
        if i < 2:  # auctions: one ends within the hour (time score 100), one in two days
            item["listing_type"] = "auction"
            item["auction_ends_at"] = (now + (timedelta(minutes=50) if i == 0 else timedelta(days=2))).isoformat()
        out.append(item)
    if elapsed >= DEAL_START:
        k = int((elapsed - DEAL_START) // DEAL_EVERY) % 2
        out.append({"id": f"{slug}-deal-{k}", "title": f"{product.title} - flash sale {k + 1}",
                    "price_cents": round(product.base_cents * DEAL_PRICE), "currency": "USD",
                    "url": f"/item/{slug}-deal-{k}", "price_type": "ask"})
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


class LocalServer:
    """An HTTP server on 127.0.0.1 (a free port) in a thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       name=f"demo-http-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the demo prints its own story
        pass

    def reply(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Marketplace(LocalServer):
    def __init__(self) -> None:
        self.opened = time.monotonic()
        self.requests = 0
        super().__init__(_MarketHandler)

    def search_template(self) -> str:
        return f"{self.url}/search?q={{query}}"


class _MarketHandler(_Quiet):
    def do_GET(self) -> None:
        market: Marketplace = self.server.owner  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        query = parse_qs(parts.query).get("q", [""])[0].strip().lower()
        if parts.path != "/search":
            self.reply(404, b'{"error": "not found"}')
            return
        market.requests += 1
        elapsed = time.monotonic() - market.opened
        now = datetime.now(UTC)
        items = [item for p in PRODUCTS if p.query == query for item in listings(p, elapsed, now)]
        self.reply(200, json.dumps({"items": items}).encode())


class WebhookReceiver(LocalServer):
    def __init__(self) -> None:
        self.received: Counter[str] = Counter()  # Idempotency-Key -> deliveries
        self.lock = threading.Lock()
        super().__init__(_HookHandler)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.received)


class _HookHandler(_Quiet):
    def do_POST(self) -> None:
        receiver: WebhookReceiver = self.server.owner  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with receiver.lock:
            receiver.received[self.headers.get("Idempotency-Key") or "?"] += 1
        self.reply(204)
