from tests.conftest import scalar, wait_for


def test_worker_process_runs_a_job(conn, workers, database_url):
    w = workers(threads=2)
    w.wait_ready(conn)
    conn.execute("INSERT INTO jobs (queue, actor, kwargs) VALUES ('tests', 'record', '{\"n\": 7}')")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 1)
    assert scalar(conn, "SELECT n FROM test_results") == 7
    assert w.terminate() == 0
    assert scalar(conn, "SELECT state FROM workers WHERE pid = %s", (w.pid,)) == "stopped"
