"""Each setting declared once: the key tables give the config reader, `supervisor worker`'s
flags, the actors' `pipeline:` settings and the key reference. No database."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from actors import settings
from actors.breaker import BreakerSettings
from actors.catalog import SourceSpec, WatchSpec
from actors.config import Pipeline
from supervisor import config, runtime
from supervisor.cli import worker_cmd
from supervisor.config.docs import DOCS_PATH, every_key, markdown
from supervisor.config.http import HttpConfig, HttpToken
from supervisor.config.keys import declared
from tests.conftest import ROOT, cli

# Fields that hold no key of their own: a map entry's name, where it was read, what the
# parser adds, the second half of http.listen, the LLM key read from its variable.
NOT_KEYS = {"name", "line", "path", "app_settings", "port", "api_key"}
SECTIONS = (config.Config, config.DatabaseConfig, config.SupervisorConfig, config.RoleConfig, config.Limits,
            config.Retention, config.ScheduleConfig, HttpConfig, HttpToken, Pipeline, BreakerSettings,
            settings.HttpSettings, settings.LlmSettings, settings.ScoringSettings, settings.AlertSettings,
            settings.NotificationSettings, settings.ForecastSettings, settings.CacheSettings,
            settings.ScrapingSettings, SourceSpec, WatchSpec)


def test_every_field_of_a_section_is_a_declared_key_with_a_meaning():
    for cls in SECTIONS:
        keys = {k.field for k in declared(cls)}
        undeclared = {f.name for f in dataclasses.fields(cls)} - keys - NOT_KEYS
        assert not undeclared, f"{cls.__name__}: declare {undeclared} with keys.key()"
        for k in declared(cls):
            assert k.doc.endswith((".", ")")) and k.kind != "value", (cls.__name__, k.name)


def test_the_key_reference_in_docs_is_up_to_date():
    written = (ROOT / DOCS_PATH).read_text()
    assert written == markdown(every_key()), f"run: supervisor config keys --markdown > {DOCS_PATH}"
    assert f"({DOCS_PATH})" in (ROOT / "README.md").read_text()  # linked from the README


def test_config_keys_lists_every_key_with_its_default_and_meaning():
    done = cli("config", "keys", "--json")
    assert done.returncode == 0, done.stderr
    found = {row["key"]: row for row in json.loads(done.stdout)}
    threads = found["roles.<role>.threads"]
    assert (threads["default"], threads["kind"], threads["flag"]) == ("8", "integer >= 1", "--threads / -t")
    assert threads["meaning"] == "Worker threads per process."
    assert found["roles.<role>.lease"]["default"] == "30s"
    assert found["retention.audit"]["default"] == "90d"
    assert found["pipeline.breaker.cooldown"]["default"] == "5m"  # an app's section, under its YAML names
    assert found["pipeline.watches.<watch>.every"]["default"] == "1h"
    assert "Only a restart applies a change." in found["database.url"]["meaning"]
    people = cli("config", "keys")
    assert people.returncode == 0 and "roles.<role>.threads = 8  [integer >= 1]  (--threads / -t)" in people.stdout


def test_the_worker_flags_are_the_role_keys():
    flagged = [k for k in declared(config.RoleConfig) if k.flag]
    assert {k.name for k in flagged} >= {"queues", "actors", "threads", "prefetch", "lease", "heartbeat",
                                         "shutdown_timeout", "poll_interval"}
    argv = ["-q", "a,b", "-a", "m", "-t", "4", "--prefetch", "2", "--lease", "1m", "--heartbeat", "5",
            "--min-backoff", "500ms", "--time-limit", "2m", "--no-job-log", "--log-level", "warning"]
    ctx = worker_cmd.worker.make_context("worker", argv)
    role = worker_cmd.role_of("r", ctx.params)
    assert role == config.RoleConfig(name="r", queues=("a", "b"), actors=("m",), threads=4, prefetch=4, lease=60.0,
                                     heartbeat=5.0, min_backoff=0.5, time_limit=120.0)  # prefetch rounded up
    assert worker_cmd.given(config.SupervisorConfig, ctx.params) == {"log_level": "WARNING", "job_log": False}
    # What is not given is the key's declared default, the same as in the config.
    bare = worker_cmd.role_of("r", worker_cmd.worker.make_context("worker", ["-q", "a", "-a", "m"]).params)
    assert bare == config.RoleConfig(name="r", queues=("a",), actors=("m",))


@pytest.mark.parametrize("flag,value,key,yaml_value", [
    ("--threads", "0", "threads", "0"),
    ("--lease", "soon", "lease", "soon"),
    ("--queues", "a,b c", "queues", "[a, b c]"),
    ("--poll-interval", "0s", "poll_interval", "0s"),
])
def test_a_flag_and_its_key_are_checked_alike(flag, value, key, yaml_value):
    import click

    with pytest.raises(click.BadParameter) as bad:
        worker_cmd.worker.make_context("worker", ["-q", "a", "-a", "m", flag, value])
    given = {"queues": "[a]", "actors": "[m]", key: yaml_value}
    with pytest.raises(config.ConfigError) as err:
        config.parse("roles:\n  r:\n" + "".join(f"    {k}: {v}\n" for k, v in given.items()))
    assert bad.value.message == err.value.message


def test_a_rule_between_keys_is_one_rule_for_the_file_and_the_flags():
    done = cli("worker", "-q", "a", "-a", "m", "--lease", "5s", "--heartbeat", "5s", "--no-migrate")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: --heartbeat: heartbeat (5s) must be shorter than lease (5s), "
                                   "or leases expire between beats")
    with pytest.raises(config.ConfigError) as err:
        config.parse("roles:\n  r: {queues: [a], actors: [m], lease: 5s, heartbeat: 5s}\n")
    assert done.stderr.strip().endswith(err.value.message)


def test_the_pipeline_settings_take_their_keys_declared_defaults_and_checks():
    runtime.configure(app_settings={"pipeline": {"breaker": {"cooldown": "2m", "threshold": 3},
                                                 "extraction": {"llm": {"base_url": "http://x/v1/", "model": "m"}}}})
    try:
        assert settings.breaker() == BreakerSettings(threshold=3, cooldown_seconds=120.0)
        llm = settings.llm()
        assert llm is not None and (llm.base_url, llm.model, llm.timeout) == ("http://x/v1", "m", 30.0)
        assert settings.cache() == settings.CacheSettings()
        runtime.configure(app_settings={"pipeline": {"scoring": {"min_samples": 0}}})
        with pytest.raises(ValueError, match=r"^pipeline\.scoring\.min_samples: must be at least 1"):
            settings.scoring()
    finally:
        runtime.configure(app_settings={})


def test_declared_sources_and_watches_keep_their_yaml_names_until_synced():
    cfg = config.parse(textwrap.dedent("""
        roles:
          a: {queues: [q], actors: [m]}
        pipeline:
          sources:
            shop: {search_url: "https://shop.example/s?q={query}", rate_per_minute: 30}
          watches:
            ram: {source: shop, query: ddr4, target_price: 60, every: 30m}
    """), "conf.yaml", env={})
    section = cfg.app_settings["pipeline"]
    assert section["watches"]["ram"] == {"source": "shop", "query": "ddr4", "target_price": 6000, "every": 1800}
    from actors.catalog import declared_sources, declared_watches

    assert declared_sources(section) == [SourceSpec(name="shop", search_url="https://shop.example/s?q={query}",
                                                    rate_limit_per_minute=30.0)]
    assert declared_watches(section) == [WatchSpec(query="ddr4", source="shop", name="ram", target_price_cents=6000,
                                                   poll_interval_seconds=1800)]
