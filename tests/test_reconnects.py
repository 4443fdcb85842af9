"""Operators see their processes' connections (issue 42): the server each process of a
`supervisor run` reaches, per child in `supervisor status` and the Overview, and
``actor_supervisor_db_reconnects_total{cause}`` on /metrics, here on the one test server
(the failover itself: tests/test_failover.py)."""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest
import yaml

from supervisor import servers
from tests.conftest import cli, scalar, wait_for
from tests.http_helpers import free_port
from tests.supervisor_helpers import enqueue, role, write_config

RECONNECTS = re.compile(r'^actor_supervisor_db_reconnects_total\{cause="(\w+)"\} (\S+)$', re.M)


def reconnects(base: str) -> dict[str, float]:
    """The reconnect counter by cause, as /metrics sums it over the processes' files."""
    text = httpx.get(f"{base}/metrics", timeout=20).text
    out: dict[str, float] = {}
    for cause, value in RECONNECTS.findall(text):
        out[cause] = out.get(cause, 0.0) + float(value)
    return out


def with_http(config, port: int):
    data = yaml.safe_load(config.read_text())
    data["http"] = {"listen": f"127.0.0.1:{port}"}
    config.write_text(yaml.safe_dump(data))
    return config


def children_servers(status: dict) -> dict[int, dict | None]:
    """pid -> the server each child of the master's status reply reports."""
    return {p["pid"]: p["server"] for r in status["roles"] for p in r["processes"]}


@pytest.mark.parametrize(("exc", "cause"), [
    (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), servers.ADMIN_SHUTDOWN),
    (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), servers.READ_ONLY),
    (psycopg.OperationalError("server closed the connection unexpectedly"), servers.CONNECTION_LOST),
    (psycopg.errors.CrashShutdown("terminating connection because of crash of another server process"),
     servers.OTHER),
])
def test_the_cause_of_a_lost_connection(exc: Exception, cause: str) -> None:
    assert servers.cause_of(exc) == cause


def test_last_change_is_the_newest_failover_any_process_saw() -> None:
    a, b = "10.0.0.1:5432", "10.0.0.2:5432"
    assert servers.last_change([None, {"address": a, "since": 1.0, "previous": None}]) is None
    last = servers.last_change([{"address": b, "since": 5.0, "previous": a},
                                {"address": b, "since": 7.0, "previous": a},
                                {"address": a, "since": 1.0, "previous": None}, None])
    assert last == {"address": b, "since": 7.0, "previous": a, "there": 2, "known": 3}


def test_a_terminated_session_is_counted_and_every_child_names_its_server(conn, database_url, tmp_path,
                                                                         supervisor) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = with_http(write_config(tmp_path / "sup.yaml", database_url, {"w": role(processes=2, threads=2)}), port)
    master = supervisor(config)
    master.wait_state({"w": 2, "http": 1})
    address = f"{conn.info.host}:{conn.info.port}"
    # Every child (both workers, the HTTP child) says on its beat which server it reaches.
    wait_for(lambda: (s := children_servers(master.status())) and all(s.values()), 30,
             message="every child reporting its server")
    status = master.status()
    assert {s["address"] for s in children_servers(status).values()} == {address}
    assert all(s["previous"] is None for s in children_servers(status).values())
    # And on its beat's registry row, for every host's readers (the Workers page, the API).
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM workers WHERE pid = ANY(%s) AND db_server = %s",
                            (list(master.pids("w")), address)) == 2, 30, interval=0.2,
             message="the workers' rows naming their server")
    assert address in httpx.get(base + "/workers", timeout=20).text
    before = reconnects(base)
    assert set(before) == set(servers.CAUSES)  # declared at 0 before any reconnect
    assert sum(before.values()) == 0

    # The server ends the workers' sessions (as a fast shutdown or an operator would): each
    # one is made anew, and counted by its cause, 57P01 admin_shutdown.
    workers = master.pids("w")
    killed = scalar(conn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                          " WHERE application_name = ANY(%s)",
                    ([f"actor-supervisor {master.status()['node']}:{pid}" for pid in workers],))
    assert killed >= 2
    enqueue(conn, 20)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 20, 60,
             message="the jobs ran on new sessions")
    after = wait_for(lambda: (r := reconnects(base)) and r[servers.ADMIN_SHUTDOWN] > 0 and r, 30,
                     interval=0.2, message="the terminated sessions counted")
    assert after[servers.FAILOVER] == 0  # the same server: no failover
    assert master.pids("w") == workers  # nothing restarted

    # `supervisor status` names each child's server; the Overview lists every process's.
    text = cli("status", config=config).stdout
    assert "SERVER" in text and text.count(address) >= 3, text
    overview = httpx.get(base + "/", timeout=20).text
    for pid in workers:
        assert re.search(rf'data-pid="{pid}">.*?<td class="address">{re.escape(address)}</td>', overview), overview
