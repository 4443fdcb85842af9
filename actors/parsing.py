"""Listings out of a search results page: JSON or HTML.

JSON: a list of items, or an object holding one under ``items``, ``listings``,
``results`` or ``data``. Each item needs a title and a price; it may carry an
id, url, description, condition, currency, seller and price type.

HTML: every element with a ``data-listing-id`` attribute, or class ``listing``
(also ``s-item``, ``product-card``), is one listing; inside it, elements with
class ``title``/``price``/``description``/``condition`` give the fields and
the first link gives the URL. A page with no listings must say so with an
element of class ``no-results`` (else it is taken for a changed layout).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin


class ParseError(ValueError):
    """The page could not be read as listings (a permanent failure)."""


@dataclass(frozen=True)
class ParsedListing:
    title: str
    price_cents: int
    external_id: str | None = None
    url: str | None = None
    description: str | None = None
    condition: str | None = None
    currency: str = "USD"
    price_type: str = "ask"
    seller: str | None = None
    listing_type: str = "fixed"  # auction | fixed (the time score's input)
    auction_ends_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


_PRICE = re.compile(r"(\d{1,3}(?:[,\s]\d{3})+|\d+)(?:[.,](\d{1,2}))?")
_CURRENCY_SIGNS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY"}
_PRICE_TYPES = {"ask": "ask", "buy_it_now": "ask", "fixed": "ask", "sold": "sold", "bid": "bid", "auction": "bid"}


def price_to_cents(value: Any) -> int:
    """12, 12.5, "12.50", "$1,299.99", "1 299,99 €", {"value": 12.5} -> cents."""
    if isinstance(value, dict):
        value = value.get("value", value.get("amount"))
    if isinstance(value, bool) or value is None:
        raise ValueError(f"no price in {value!r}")
    if isinstance(value, int | float):
        try:
            return int((Decimal(str(value)) * 100).to_integral_value())
        except InvalidOperation as exc:
            raise ValueError(f"bad price {value!r}") from exc
    match = _PRICE.search(str(value))
    if not match:
        raise ValueError(f"no price in {value!r}")
    whole = re.sub(r"[,\s]", "", match.group(1))
    cents = (match.group(2) or "0").ljust(2, "0")
    return int(whole) * 100 + int(cents)


def _currency(value: Any, default: str = "USD") -> str:
    if isinstance(value, dict) and value.get("currency"):
        return str(value["currency"]).upper()
    text = str(value or "")
    for sign, code in _CURRENCY_SIGNS.items():
        if sign in text:
            return code
    found = re.search(r"\b([A-Z]{3})\b", text)
    return found.group(1) if found else default


def _price_type(value: Any) -> str:
    return _PRICE_TYPES.get(str(value or "ask").strip().lower().replace(" ", "_"), "ask")


def _listing_type(item: dict, price_type: str) -> str:
    kind = str(_first(item, "listing_type", "format", "type") or "").strip().lower()
    return "auction" if kind == "auction" or price_type == "bid" else "fixed"


def _when(value: Any) -> datetime | None:
    """An ISO-8601 time or epoch seconds; naive times are UTC; anything else is no time."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), UTC)
        when = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _first(item: dict, *names: str) -> Any:
    for name in names:
        if item.get(name) not in (None, ""):
            return item[name]
    return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value).strip() or None


def _from_item(item: Any, base_url: str) -> ParsedListing:
    if not isinstance(item, dict):
        raise ValueError(f"item is a {type(item).__name__}, not an object")
    title = _text(_first(item, "title", "name"))
    if not title:
        raise ValueError("item has no title")
    cents = _first(item, "price_cents")
    price = _first(item, "price", "current_price", "amount")
    if cents is not None:
        price_cents = int(cents)
    elif price is not None:
        price_cents = price_to_cents(price)
    else:
        raise ValueError(f"item {title!r} has no price")
    url = _text(_first(item, "url", "link", "href"))
    price_type = _price_type(_first(item, "price_type", "type", "listing_type"))
    listing_type = _listing_type(item, price_type)
    return ParsedListing(
        title=title,
        price_cents=price_cents,
        external_id=_text(_first(item, "id", "external_id", "item_id", "listing_id")),
        url=urljoin(base_url, url) if url else None,
        description=_text(_first(item, "description", "subtitle")),
        condition=_text(_first(item, "condition")),
        currency=str(item.get("currency") or _currency(price)).upper(),
        price_type=price_type,
        seller=_text(_first(item, "seller")),
        listing_type=listing_type,
        auction_ends_at=_when(_first(item, "auction_ends_at", "ends_at", "end_time"))
        if listing_type == "auction" else None,
        raw=item,
    )


def _collect(items: list[Any], base_url: str, where: str) -> list[ParsedListing]:
    listings, problems = [], []
    for n, item in enumerate(items):
        try:
            listings.append(_from_item(item, base_url))
        except ValueError as exc:
            problems.append(f"#{n}: {exc}")
    if items and not listings:
        raise ParseError(f"{where}: none of {len(items)} listings could be read ({'; '.join(problems[:3])})")
    return listings


def parse_json(text: str, base_url: str = "") -> list[ParsedListing]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"JSON page is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        for name in ("items", "listings", "results", "data"):
            if isinstance(data.get(name), list):
                data = data[name]
                break
        else:
            raise ParseError(
                f"JSON page has no list of listings (keys: {', '.join(sorted(data)[:8]) or 'none'}); "
                "expected a list or an object with items/listings/results/data"
            )
    if not isinstance(data, list):
        raise ParseError(f"JSON page is a {type(data).__name__}, not a list of listings")
    return _collect(data, base_url, "JSON page")


_LISTING_CLASSES = {"listing", "s-item", "product-card"}
_FIELD_CLASSES = {"title": "title", "name": "title", "price": "price", "description": "description",
                  "subtitle": "description", "condition": "condition", "seller": "seller"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _ListingHTML(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.items: list[dict[str, Any]] = []
        self.no_results = False
        self._depth = 0  # open elements inside the current listing (0: outside)
        self._fields: list[tuple[str, int]] = []  # (field, depth it opened at)
        self._item: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = set(a.get("class", "").split())
        if "no-results" in classes:
            self.no_results = True
        if self._item is None:
            if "data-listing-id" in a or classes & _LISTING_CLASSES:
                self._item = {"id": a.get("data-listing-id") or a.get("data-id") or None}
                if a.get("data-price"):
                    self._item["price"] = a["data-price"]
                self._depth = 0 if tag in _VOID else 1
            return
        if tag == "a" and "href" in a and "url" not in self._item:
            self._item["url"] = a["href"]
        for cls in classes:
            name = _FIELD_CLASSES.get(cls)
            if name and name not in self._item:
                self._item[name] = ""
                self._fields.append((name, self._depth + 1))
                break
        if tag not in _VOID:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self._item is None or tag in _VOID:
            return
        while self._fields and self._fields[-1][1] >= self._depth:
            self._fields.pop()
        self._depth -= 1
        if self._depth <= 0:
            # Whitespace in HTML text is layout, not content.
            item = {k: (" ".join(v.split()) if isinstance(v, str) else v) for k, v in self._item.items()}
            self.items.append({k: v for k, v in item.items() if v not in (None, "")})
            self._item, self._fields = None, []

    def handle_data(self, data: str) -> None:
        if self._item is not None and self._fields:
            name = self._fields[-1][0]
            self._item[name] += data


def parse_html(text: str, base_url: str = "") -> list[ParsedListing]:
    parser = _ListingHTML()
    try:
        parser.feed(text)
        parser.close()
    except Exception as exc:  # HTMLParser is lenient; anything it raises means garbage
        raise ParseError(f"HTML page could not be parsed: {exc}") from None
    if not parser.items:
        if parser.no_results:
            return []
        raise ParseError(
            "HTML page has no listings (no element with data-listing-id or class listing/s-item/"
            "product-card, and no no-results marker): the page layout may have changed"
        )
    return _collect(parser.items, base_url, "HTML page")


def parse(text: str, *, content_type: str = "", fmt: str = "auto", base_url: str = "") -> list[ParsedListing]:
    """Parse by the source's declared format, else by content type, else by sniffing."""
    if fmt == "auto":
        if "json" in content_type:
            fmt = "json"
        elif "html" in content_type:
            fmt = "html"
        else:
            fmt = "json" if text.lstrip()[:1] in ("[", "{") else "html"
    if fmt == "json":
        return parse_json(text, base_url)
    if fmt == "html":
        return parse_html(text, base_url)
    raise ParseError(f"unknown source format {fmt!r} (use auto, json or html)")
