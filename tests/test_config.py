"""Config parsing and validation: no processes, no database."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from supervisor import config
from supervisor.config import ConfigError, parse
from supervisor.master.reload import diff
from supervisor.units import parse_duration, parse_size
from supervisor.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """
roles:
  a:
    queues: [q]
    actors: [m]
"""


def load(text: str, env: dict | None = None) -> config.Config:
    return parse(textwrap.dedent(text), "conf.yaml", env=env or {})


def error(text: str, env: dict | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text, env)
    return info.value


def test_minimal_config_gets_defaults():
    cfg = load(MINIMAL)
    (role,) = cfg.roles
    assert (role.name, role.processes, role.threads, role.queues, role.actors) == ("a", 1, 8, ("q",), ("m",))
    assert (role.lease, role.heartbeat, role.shutdown_timeout) == (30.0, 10.0, 30.0)
    assert cfg.database.url is None
    assert cfg.supervisor.control_socket.name == "supervisor.sock"
    assert cfg.schedules == () and cfg.app_settings == {}


@pytest.mark.parametrize("text,seconds", [
    (30, 30.0), (2.5, 2.5), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("500ms", 0.5),
    ("1m30s", 90.0), ("2d", 172800.0), ("10", 10.0), (" 3 s ", 3.0),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["abc", "5x", "s", "", True, None, "1m zz"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_sizes():
    assert parse_size("512MB") == 512 << 20
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError):
        parse_size("lots")


def test_every_role_setting_reaches_worker_settings():
    cfg = load("""
        roles:
          scraping:
            processes: 3
            threads: 5
            prefetch: 10
            queues: [scraping, slow]
            actors: [actors.scraping]
            lease: 1m
            heartbeat: 20s
            max_retries: 4
            min_backoff: 500ms
            max_backoff: 1h
            shutdown_timeout: 10s
            time_limit: 2m
            limits: {memory_percent: 90%, cpu_percent: 95, max_rss: 512MB, max_jobs: 1000}
        schedules:
          poll:
            cron: "*/5 * * * *"
            actor: poll_due
            queue: slow
            args: [1, two]
            kwargs: {limit: 10}
            lock_ttl: 4m
        pipeline:
          http: {timeout: 15s}
    """)
    s = WorkerSettings.from_role(cfg, "scraping")
    assert isinstance(s, WorkerSettings)
    assert s == WorkerSettings(role=config.RoleConfig(
        name="scraping", queues=("scraping", "slow"), actors=("actors.scraping",), processes=3, threads=5,
        prefetch=10, lease=60.0, heartbeat=20.0, shutdown_timeout=10.0, max_retries=4,
        min_backoff=0.5, max_backoff=3600.0, time_limit=120.0,
        limits=config.Limits(memory_percent=90.0, cpu_percent=95.0, max_rss=512 << 20, max_jobs=1000),
    ), schedules=cfg.schedules)
    assert s.app_settings == {"pipeline": {"http": {"timeout": 15.0}}}  # validated and parsed at load
    role = cfg.role("scraping")
    assert role.limits == config.Limits(memory_percent=90.0, cpu_percent=95.0, max_rss=512 << 20, max_jobs=1000)
    (sched,) = cfg.schedules
    assert sched == config.ScheduleConfig(name="poll", cron="*/5 * * * *", actor="poll_due", queue="slow",
                                          args=(1, "two"), kwargs={"limit": 10}, lock_ttl_seconds=240.0, timezone="UTC")


def test_interpolation():
    cfg = load("""
        database: {url: "${DATABASE_URL:-embedded}"}
        roles:
          a:
            processes: ${PROCS:-2}
            threads: ${THREADS}
            queues: ["${QUEUE:-default}"]
            actors: [m]
        pipeline:
          http: {user_agent: "costs $$5"}
          notification: {username: "${THREADS}"}
          extraction: {llm: {api_key_env: "${API_KEY:-KEY}"}}
    """, env={"THREADS": "3", "QUEUE": ""})
    role = cfg.role("a")
    assert cfg.database.url == "embedded"
    assert role.processes == 2 and role.threads == 3  # unquoted: a number, as if written in place
    assert role.queues == ("default",)  # :- also replaces an empty value
    assert cfg.app_settings["pipeline"] == {"http": {"user_agent": "costs $5"}, "notification": {"username": "3"},
                                            "extraction": {"llm": {"api_key_env": "KEY"}}}


def test_unset_variable_names_it():
    e = error("""
        roles:
          a: {queues: [q], actors: ["${ACTOR_MODULE}"]}
    """)
    assert (e.line, e.key) == (3, "roles.a.actors[0]")
    assert "ACTOR_MODULE is not set" in e.message


def test_unknown_key_names_file_line_key_and_suggests():
    e = error("""
        roles:
          scraping:
            queues: [q]
            actors: [m]
            thread: 8
    """)
    assert (e.path, e.line, e.key) == ("conf.yaml", 6, "roles.scraping.thread")
    assert "did you mean 'threads'" in e.message
    assert str(e).startswith("conf.yaml:6: roles.scraping.thread: unknown key")


def test_unknown_top_level_and_supervisor_keys():
    assert error("rolez: {}\n" + MINIMAL).key == "rolez"
    e = error("supervisor: {tick: 1s, shutdown: 5s}\n" + MINIMAL)
    assert (e.line, e.key) == (1, "supervisor.shutdown")


@pytest.mark.parametrize("snippet,key,words", [
    ("threads: 0", "roles.a.threads", "at least 1"),
    ("threads: two", "roles.a.threads", "whole number"),
    ("threads: 2.5", "roles.a.threads", "whole number"),
    ("processes: -1", "roles.a.processes", "at least 0"),
    ("processes: true", "roles.a.processes", "whole number"),
    ("lease: -5s", "roles.a.lease", "at least"),
    ("shutdown_timeout: -1", "roles.a.shutdown_timeout", "at least 0s"),
    ("heartbeat: 0s", "roles.a.heartbeat", "more than 0s"),
    ("heartbeat: 40s", "roles.a.heartbeat", "shorter than lease"),
    ("threads: 4\n    prefetch: 2", "roles.a.prefetch", "at least threads"),
    ("time_limit: soon", "roles.a.time_limit", "duration"),
    ("queues: []", "roles.a.queues", "at least one"),
    ("queues: q", None, None),  # a single name is fine
    ("actors: [not-a.module]", "roles.a.actors[0]", "module name"),
    ("max_backoff: 1s\n    min_backoff: 10s", "roles.a.max_backoff", "min_backoff"),
    ("shutdown_timeout: 1h", "roles.a.shutdown_timeout", "longer than supervisor.shutdown_timeout"),
    ("limits: {memory_percent: 150}", "roles.a.limits.memory_percent", "between 0 and 100"),
    ("limits: {max_rss: 100}", "roles.a.limits.max_rss", "under 1MB"),
    ("limits: {max_jobs: 0}", "roles.a.limits.max_jobs", "at least 1"),
    ("limits: {max_rss: 1GB, swap: 1}", "roles.a.limits.swap", "unknown key"),
])
def test_bad_role_values(snippet, key, words):
    base = [line for line in ("queues: [q]", "actors: [m]") if not snippet.startswith(line.split(":")[0])]
    text = "roles:\n  a:\n" + "".join(f"    {line}\n" for line in base) + f"    {snippet}\n"
    if key is None:
        load(text)
        return
    e = error(text)
    assert e.key == key, str(e)
    assert e.line >= 4
    assert words in e.message, str(e)


def test_missing_required_keys():
    e = error("roles:\n  a:\n    queues: [q]\n")
    assert (e.line, e.key) == (2, "roles.a.actors") and "required" in e.message
    assert error("supervisor: {tick: 1s}\n").key == "roles"
    assert error("roles: {}\n").key == "roles"


def test_supervisor_values():
    assert error("supervisor: {tick: 0}\n" + MINIMAL).key == "supervisor.tick"
    assert error("supervisor: {watch_config: yes please}\n" + MINIMAL).key == "supervisor.watch_config"
    assert error("supervisor: {log_level: LOUD}\n" + MINIMAL).key == "supervisor.log_level"
    assert error("supervisor: {shutdown_timeout: -1s}\n" + MINIMAL).key == "supervisor.shutdown_timeout"
    long = "/tmp/" + "x" * 120 + ".sock"
    assert "too long" in error(f"supervisor: {{control_socket: {long}}}\n" + MINIMAL).message


def test_relative_paths_are_relative_to_the_config_file(tmp_path):
    path = tmp_path / "conf" / "s.yaml"
    path.parent.mkdir()
    path.write_text("supervisor: {control_socket: run/ctl.sock, state_dir: state}\n" + MINIMAL)
    cfg = config.load(path)
    assert cfg.supervisor.control_socket == path.parent.resolve() / "run" / "ctl.sock"
    assert cfg.supervisor.state_dir == path.parent.resolve() / "state"


def test_yaml_syntax_error_names_the_line():
    e = error("""
        roles:
          a: {queues: [q], actors: [m]
          b: 1
    """)
    assert e.line in (3, 4) and "YAML syntax error" in e.message
    assert str(e).startswith(f"conf.yaml:{e.line}: ")


def test_duplicate_keys_are_errors_but_merges_override():
    e = error("roles:\n  a:\n    queues: [q]\n    actors: [m]\n    queues: [r]\n")
    assert (e.line, e.key) == (5, "roles.a.queues") and "duplicate" in e.message
    cfg = load("""
        x-base: &base {queues: [q], actors: [m], threads: 2}
        roles:
          a:
            <<: *base
            threads: 6
    """)
    assert cfg.role("a").threads == 6 and cfg.role("a").queues == ("q",)


def test_schedule_queue_must_be_served_and_cron_valid():
    e = error(MINIMAL + "schedules:\n  s: {cron: '* * * * *', actor: f, queue: elsewhere}\n")
    assert e.key == "schedules.s.queue" and "served by no role" in e.message
    e = error(MINIMAL + "schedules:\n  s: {cron: '61 * * * *', actor: f, queue: q}\n")
    assert e.key == "schedules.s.cron" and e.line == 7
    e = error(MINIMAL + "schedules:\n  s: {cron: '* * * * *', queue: q}\n")
    assert e.key == "schedules.s.actor"
    e = error(MINIMAL + "schedules:\n  s: {cron: '* * * * *', actor: f, queue: q, lock_ttl: 0}\n")
    assert e.key == "schedules.s.lock_ttl"


def test_schedule_catch_up_keys():
    (sched,) = load(MINIMAL + "schedules:\n  s: {cron: '@daily', actor: f, queue: q}\n").schedules
    assert (sched.catch_up, sched.catch_up_limit, sched.catch_up_window) == ("none", 100, None)  # today's
    (sched,) = load(MINIMAL + "schedules:\n  s:\n    cron: '@daily'\n    actor: f\n    queue: q\n"
                    "    catch_up: all\n    catch_up_limit: 7\n    catch_up_window: 2d\n").schedules
    assert (sched.catch_up, sched.catch_up_limit, sched.catch_up_window) == ("all", 7, 172800.0)
    for bad, key, fragment in [("catch_up: sometimes", "catch_up", "none, last, all"),
                               ("catch_up: true", "catch_up", "expected a non-empty string"),
                               ("catch_up_limit: 0", "catch_up_limit", "at least 1"),
                               ("catch_up_window: 0s", "catch_up_window", "more than 0s")]:
        e = error(MINIMAL + f"schedules:\n  s:\n    cron: '@daily'\n    actor: f\n    queue: q\n    {bad}\n")
        assert (e.path, e.line, e.key) == ("conf.yaml", 11, f"schedules.s.{key}") and fragment in e.message, e


def test_empty_and_missing_files(tmp_path):
    assert "empty" in error("").message
    with pytest.raises(ConfigError) as info:
        config.load(tmp_path / "nope.yaml")
    assert "cannot read" in str(info.value) and "nope.yaml" in str(info.value)


def test_find_path(monkeypatch):
    monkeypatch.delenv("SUPERVISOR_CONFIG", raising=False)
    assert config.find_path(None) == Path("config/supervisor.yaml")
    monkeypatch.setenv("SUPERVISOR_CONFIG", "/etc/x.yaml")
    assert config.find_path(None) == Path("/etc/x.yaml")
    assert config.find_path("mine.yaml") == Path("mine.yaml")


def test_bundled_configs_are_valid(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    default = config.load(ROOT / "config" / "supervisor.yaml")
    assert {r.name for r in default.roles} == {"scraping", "extraction", "notification", "forecasting"}
    assert default.role("scraping").actors == ("actors.scraping",)
    prod = config.load(ROOT / "config" / "production.example.yaml")
    assert prod.database.url == "postgresql://u@h/db"
    assert {r.name for r in prod.roles} == {r.name for r in default.roles}
    monkeypatch.delenv("DATABASE_URL")
    assert config.load(ROOT / "config" / "supervisor.yaml").database.url == "embedded"


def test_reload_diff():
    old = load("""
        supervisor: {tick: 1s}
        roles:
          a: {processes: 2, queues: [q], actors: [m]}
          b: {processes: 1, queues: [r], actors: [m], threads: 4}
          c: {queues: [s], actors: [m]}
    """)
    new = load("""
        supervisor: {tick: 500ms}
        roles:
          a: {processes: 4, queues: [q], actors: [m]}
          b: {processes: 1, queues: [r], actors: [m], threads: 2}
          d: {queues: [s], actors: [m]}
    """)
    d = diff(old, new)
    assert d.resized == {"a": (2, 4)} and d.rolled == {"b": ["threads 4 -> 2"]}
    assert d.added == ["d"] and d.removed == ["c"]
    assert "supervisor.tick: 1 -> 0.5" in d.lines()
    assert diff(old, old).empty
    piped = load("""
        supervisor: {tick: 1s}
        roles:
          a: {processes: 2, queues: [q], actors: [m]}
          b: {processes: 1, queues: [r], actors: [m], threads: 4}
          c: {queues: [s], actors: [m]}
        pipeline: {scoring: {min_samples: 3}}
    """)
    assert set(diff(old, piped).rolled) == {"a", "b", "c"}  # children read pipeline: at boot


def test_control_socket_is_found_even_in_an_invalid_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("database: {url: '${SECRET_URL}'}\nsupervisor: {control_socket: run/ctl.sock}\n"
                    "roles:\n  a: {queues: [q], actors: [m], thread: 3}\n")
    with pytest.raises(ConfigError):
        config.load(path, env={})
    assert config.control_socket_of(path, env={}) == tmp_path.resolve() / "run" / "ctl.sock"
    path.write_text("supervisor: {state_dir: '${STATE:-st}'}\nroles: {}\n")
    assert config.control_socket_of(path, env={}) == tmp_path.resolve() / "st" / "supervisor.sock"
    path.write_text("roles: [unclosed\n")
    with pytest.raises(ConfigError):
        config.control_socket_of(path)


def test_app_sections_are_validated_at_load_with_file_line_and_key():
    with pytest.raises(ConfigError) as err:
        load("""
            roles:
              a: {queues: [q], actors: [m]}
            pipeline:
              http:
                timout: 5s
        """)
    assert (err.value.line, err.value.key) == (6, "pipeline.http.timout")
    assert "did you mean 'timeout'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load("""
            roles:
              a: {queues: [q], actors: [m]}
            pipeline:
              notification: {timeout: soon}
        """)
    assert (err.value.line, err.value.key) == (5, "pipeline.notification.timeout")
    assert "expected a duration" in str(err.value)


def test_http_section():
    assert load(MINIMAL).http is None  # off by default
    text = MINIMAL + 'http: {listen: "0.0.0.0:8080", token: "${SUPERVISOR_HTTP_TOKEN:-}", read_only: true}\n'
    cfg = load(text)
    assert cfg.http is not None and (cfg.http.host, cfg.http.port, cfg.http.token, cfg.http.read_only) == (
        "0.0.0.0", 8080, None, True)  # an empty token is no token
    assert load(text, env={"SUPERVISOR_HTTP_TOKEN": "t0k"}).http.token == "t0k"
    assert load(MINIMAL + "http: {}\n").http.listen == "127.0.0.1:9191"
    e = error(MINIMAL + "http:\n  listen: localhost\n")
    assert (e.line, e.key) == (7, "http.listen") and "host:port" in e.message
    e = error(MINIMAL + "http: {lisen: x}\n")
    assert "did you mean 'listen'" in e.message
    e = error(MINIMAL.replace("  a:", "  http:") + "http: {}\n")
    assert e.key == "roles.http" and "taken by the HTTP child" in e.message
    # A reload that changes it says what happens to the child.
    assert diff(load(MINIMAL), load(text)).added == ["http"]
    assert diff(load(text), load(MINIMAL)).removed == ["http"]
    assert diff(load(text), load(text.replace("true", "false"))).lines()[-1] == "http: rolled (read_only)"


def test_http_tokens_with_roles_and_secrets_from_the_environment():
    text = MINIMAL + textwrap.dedent("""\
        http:
          token: "${SUPERVISOR_HTTP_TOKEN:-}"
          tokens:
            alice: {role: admin, secret_env: ALICE_TOKEN}
            bob:
              role: viewer
              secret_env: BOB_TOKEN
        """)
    env = {"ALICE_TOKEN": "a-secret", "BOB_TOKEN": "b-secret"}
    http = load(text, env).http
    assert http is not None and [(t.name, t.role, t.secret) for t in http.principals()] == [
        ("alice", "admin", "a-secret"), ("bob", "viewer", "b-secret")]
    assert "a-secret" not in repr(http)  # secrets stay out of logs and reprs
    # The single token keeps working: an admin named "token", beside the named ones.
    http = load(text, {**env, "SUPERVISOR_HTTP_TOKEN": "t"}).http
    assert [(t.name, t.role) for t in http.principals()][-1] == ("token", "admin") and http.auth_required
    # Errors name the file, the line and the key.
    e = error(text.replace("role: viewer", "role: superuser"), env)
    assert (e.path, e.line, e.key) == ("conf.yaml", 11, "http.tokens.bob.role"), e
    assert e.message == "unknown role 'superuser' (roles: viewer, operator, admin)"
    e = error(text, {"ALICE_TOKEN": "a-secret"})
    assert (e.line, e.key) == (12, "http.tokens.bob.secret_env") and "BOB_TOKEN is not set" in e.message
    e = error(text, {"ALICE_TOKEN": "same", "BOB_TOKEN": "same"})
    assert e.key == "http.tokens.bob.secret_env" and "same secret as token alice" in e.message
    e = error(text, {**env, "SUPERVISOR_HTTP_TOKEN": "b-secret"})
    assert e.key == "http.token" and "same secret as http.tokens.bob" in e.message
    e = error(text.replace("bob:\n", "bob:\n      colour: red\n"), env)
    assert e.key == "http.tokens.bob.colour" and "unknown key" in e.message
    e = error(MINIMAL + "http: {tokens: {carol: {secret_env: C}}}\n", {"C": "x"})
    assert e.key == "http.tokens.carol.role" and e.message == "is required"
    e = error(MINIMAL + "http: {tokens: [alice]}\n")
    assert e.key == "http.tokens" and "alice: {role: admin, secret_env: ALICE_TOKEN}" in e.message
    e = error(MINIMAL + "http: {token: t, tokens: {token: {role: viewer, secret_env: T}}}\n", {"T": "x"})
    assert e.key == "http.tokens.token" and "single http.token" in e.message
    # A new secret or role rolls the HTTP child (without saying the secret).
    changed = diff(load(text, env), load(text, {**env, "BOB_TOKEN": "new"}))
    assert changed.lines()[-1] == "http: rolled (tokens)"


def test_poll_interval_per_role_reaches_the_worker_settings():
    from supervisor.config import parse
    from supervisor.worker.settings import WorkerSettings

    cfg = parse("roles:\n  fast: {queues: [q], actors: [m], poll_interval: 250ms}\n  plain: {queues: [q], actors: [m]}\n")
    assert WorkerSettings.from_role(cfg, "fast").role.poll_interval == 0.25
    assert WorkerSettings.from_role(cfg, "plain").role.poll_interval == 1.0
    with pytest.raises(Exception, match="roles.fast.poll_interval"):
        parse("roles:\n  fast: {queues: [q], actors: [m], poll_interval: 0s}\n")


def test_the_memory_guard_is_on_by_default_and_can_be_turned_off():
    from supervisor.config import parse

    cfg = parse("roles:\n  a: {queues: [q], actors: [m]}\n  b: {queues: [q], actors: [m], limits: {max_jobs: 5}}\n"
                "  c: {queues: [q], actors: [m], limits: {memory_percent: off}}\n")
    assert [cfg.role(n).limits.memory_percent for n in "abc"] == [85.0, 85.0, None]
    assert cfg.role("a").limits.cpu_percent is None  # CPU: only when set (ARCHITECTURE.md, the resource guard)


def test_the_old_storage_key_still_loads_and_a_wrong_value_is_one_line() -> None:
    # database.storage was a choice until one store: an older config with it still loads
    # (the master then warns that `table` is ignored), and a value it never took is refused.
    cfg = load("database: {storage: table}\nroles:\n  a: {queues: [q], actors: [m]}\n")
    assert cfg.database.storage == "table"
    assert "storage" in str(error("database: {storage: lake}\nroles:\n  a: {queues: [q], actors: [m]}\n"))
