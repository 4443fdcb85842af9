"""The config's `pipeline:` section, validated when the config loads (file, line and
key on every error).

Each key is declared once, on the field that holds it: the settings the actors read
(actors/settings.py, breaker.py) and the sources and watches the catalog writes
(actors/catalog.py). ``Pipeline`` only gathers them into the section's shape. What the
file gives is kept as given (checked and parsed); defaults apply where it is read.
``sources`` and ``watches`` are mappings of name -> entry, synced into the database by
name at every worker's start (so at `supervisor run` and on every reload)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.config.keys import declared, section
from supervisor.config.reader import Item, Reader, read_given

from . import catalog
from .breaker import BreakerSettings
from .catalog import SourceSpec, WatchSpec
from .settings import (
    AlertSettings,
    CacheSettings,
    ForecastSettings,
    HttpSettings,
    LlmSettings,
    NotificationSettings,
    ScoringSettings,
    ScrapingSettings,
)


@dataclass(frozen=True)
class Extraction:
    llm: LlmSettings | None = section(LlmSettings, "The model that extracts a listing's attributes (else the "
                                                   "rules alone).", None)


@dataclass(frozen=True)
class Pipeline:
    """The shape of `pipeline:` (its keys are the fields of these classes)."""

    http: HttpSettings = section(HttpSettings, "The tracker's HTTP client.", factory=HttpSettings)
    scraping: ScrapingSettings = section(ScrapingSettings, "Scraping a watch's search.", factory=ScrapingSettings)
    breaker: BreakerSettings = section(BreakerSettings, "Each source's circuit breaker.", factory=BreakerSettings)
    extraction: Extraction = section(Extraction, "Reading a listing's attributes.", factory=Extraction)
    scoring: ScoringSettings = section(ScoringSettings, "Judging a listing against its baseline.",
                                       factory=ScoringSettings)
    alerts: AlertSettings = section(AlertSettings, "Alerting again on a listing.", factory=AlertSettings)
    notification: NotificationSettings = section(NotificationSettings, "Posting alerts to webhooks.",
                                                 factory=NotificationSettings)
    forecasting: ForecastSettings = section(ForecastSettings, "Price forecasts.", factory=ForecastSettings)
    cache: CacheSettings = section(CacheSettings, "The page cache.", factory=CacheSettings)
    sources: tuple[SourceSpec, ...] = section(SourceSpec, "Sources declared by name (synced at every worker's "
                                                          "start).", (), named="<source>")
    watches: tuple[WatchSpec, ...] = section(WatchSpec, "Watches declared by name (synced at every worker's "
                                                        "start).", (), named="<watch>")


def _named(reader: Reader, item: Item, cls: type) -> dict[str, Any]:
    if not isinstance(item.value, dict):
        raise reader.error(item, "must be a mapping of name: {...}")
    out: dict[str, Any] = {}
    for name, child in item.value.items():
        try:
            catalog.check_name(name)
        except ValueError as exc:
            raise reader.error(child, str(exc)) from None
        entry = read_given(reader, child, cls)
        if "target_price" in entry and "deal_threshold" in entry:
            raise reader.error(child, "target_price and deal_threshold exclude each other: give one")
        out[name] = entry
    return out


def parse_pipeline(reader: Reader, item: Item) -> dict[str, Any]:
    def entries(cls: type) -> Callable[[Item], dict[str, Any]]:
        return lambda i: _named(reader, i, cls)

    return read_given(reader, item, Pipeline,
                      {k.name: entries(k.section) for k in declared(Pipeline) if k.named and k.section})
