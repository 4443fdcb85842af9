"""A role's default priority: a job sent to one of its queues without a priority gets
the role's, wherever the sender knows the config (its workers, `supervisor enqueue`,
POST /api/v1/jobs); an explicit priority, 0 included, wins."""

from __future__ import annotations

import pytest
import yaml

from supervisor.config import ConfigError, parse
from tests.conftest import cli, scalar, wait_for
from tests.supervisor_helpers import role, write_config


def test_a_queue_takes_one_default_priority_and_bad_ones_name_file_line_and_key():
    cfg = parse("roles:\n  urgent: {queues: [alerts], actors: [m], priority: 10}\n"
                "  plain: {queues: [bulk], actors: [m]}\n")
    assert cfg.queue_priorities() == {"alerts": 10}
    with pytest.raises(ConfigError, match=r"roles\.b\.priority.*queue 'alerts' has priority 10 in role a"):
        parse("roles:\n  a: {queues: [alerts], actors: [m], priority: 10}\n"
              "  b: {queues: [alerts], actors: [m], priority: 5}\n")
    with pytest.raises(ConfigError, match=r"roles\.a\.priority.*expected an integer priority"):
        parse("roles:\n  a: {queues: [q], actors: [m], priority: high}\n")


def test_jobs_sent_without_a_priority_get_their_roles_everywhere_the_config_is_known(
        tmp_path, conn, database_url, supervisor, http_server):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"chain": role(processes=1, queues=["tests"], priority=7),
                         "other": role(processes=1, queues=["other"], priority=3)})
    # A worker of the role sends a job on (Dramatiq's on_success callback: sent by the worker's broker).
    s = supervisor(path)
    s.wait_state({"chain": 1, "other": 1})
    sent = cli("enqueue", "record", "--queue", "tests", "--json", config=path)
    assert sent.returncode == 0, sent.stderr
    explicit = cli("enqueue", "record", "--queue", "tests", "--priority", "0", "--json", config=path)
    elsewhere = cli("enqueue", "record", "--queue", "other", "--json", config=path)
    bare = cli("enqueue", "record", "--queue", "tests", "--json", url=database_url)  # no config: no role known
    priorities = dict(conn.execute("SELECT id::text, priority FROM jobs").fetchall())
    ids = [yaml.safe_load(r.stdout)["id"] for r in (sent, explicit, elsewhere, bare)]
    assert [priorities[i] for i in ids] == [7, 0, 3, 0]
    # A job the role's worker sends on (a callback) without a priority gets the role's.
    conn.execute("INSERT INTO jobs (queue, actor, args, options) VALUES ('tests', 'flaky', '[1]', %s)",
                 ('{"on_success": "record", "max_attempts": 3}',))
    chained = "SELECT priority FROM jobs WHERE actor = 'record' AND jsonb_typeof(args->0) = 'object'"
    assert wait_for(lambda: conn.execute(chained).fetchone(), 30, message="the chained job") == (7,)
    api = http_server("-c", str(path), url=database_url)
    posted = api.client.post("/api/v1/jobs", json={"actor": "record", "queue": "other"})
    assert posted.status_code == 201, posted.text
    assert scalar(conn, "SELECT priority FROM jobs WHERE id = %s", (posted.json()["id"],)) == 3
