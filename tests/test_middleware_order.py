"""The middleware order is declared by each middleware that needs a place
(``placement``: the Fence last, JobLog before Retries) and checked when a worker starts
(broker/consuming/order.py): a misplaced one stops the worker with one error line naming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq.middleware import AgeLimit, Middleware

from supervisor import exit_codes
from supervisor.broker import PostgresBroker
from supervisor.broker.consuming import order
from supervisor.broker.consuming.fencing import Fence
from supervisor.broker.middleware import Retries
from supervisor.worker.joblog import JobLog
from tests.conftest import wait_for

ERROR = ("middleware tests.order_actors.Stamp is after supervisor.broker.consuming.fencing.Fence, which must be last"
         " (its after_process_message runs first")


class Stamp(Middleware):
    def before_process_message(self, broker, message) -> None:
        pass


class BootOnly(Middleware):
    """No message hook: it may sit after the Fence (as Dramatiq's worker middleware does)."""

    def after_worker_boot(self, broker, worker) -> None:
        pass


@pytest.fixture
def broker(database_url: str) -> Iterator[PostgresBroker]:
    b = PostgresBroker(database_url)
    yield b
    b.close()


def test_the_brokers_own_list_is_in_order_and_a_message_hook_after_the_fence_is_not(broker):
    order.check(broker.middleware)
    assert isinstance(broker.middleware[-1], Fence)

    broker.add_middleware(BootOnly())
    order.check(broker.middleware)  # no message hook: anywhere will do

    broker.add_middleware(Stamp())
    with pytest.raises(order.MiddlewareOrderError, match=r"middleware tests\.test_middleware_order\.Stamp "
                       r"is after supervisor\.broker\.consuming\.fencing\.Fence, which must be last .*before=Fence\)$"):
        order.check(broker.middleware)

    broker.middleware.remove(broker.middleware[-1])
    broker.add_middleware(Stamp(), before=Fence)
    order.check(broker.middleware)


def test_a_hook_set_on_an_instance_after_the_fence_counts(broker):
    plain = Middleware()
    plain.after_skip_message = lambda broker, message: None  # type: ignore[method-assign]
    broker.add_middleware(plain)
    with pytest.raises(order.MiddlewareOrderError, match="dramatiq.middleware.middleware.Middleware is after"):
        order.check(broker.middleware)


def test_the_job_log_must_come_before_retries(broker):
    broker.add_middleware(JobLog("r"), before=AgeLimit)
    order.check(broker.middleware)

    broker.middleware = [m for m in broker.middleware if not isinstance(m, JobLog)]
    broker.add_middleware(JobLog("r"), before=Fence)
    with pytest.raises(order.MiddlewareOrderError, match=r"middleware supervisor\.worker\.joblog\.JobLog is after "
                       r"supervisor\.broker\.middleware\.Retries, and must be before it .*before=Retries\)$"):
        order.check(broker.middleware)

    broker.middleware = [m for m in broker.middleware if not isinstance(m, Retries | JobLog)]
    broker.add_middleware(JobLog("r"), before=Fence)
    order.check(broker.middleware)  # nothing to be before


def test_a_worker_whose_actor_module_appends_a_middleware_stops_at_start_with_one_error(
        conn, workers, tmp_path):
    stamp = tmp_path / "stamp"
    w = workers(actors="tests.order_actors", extra_env={"ORDER_ACTORS_STAMP": str(stamp)})
    assert w.proc.wait(30) == exit_codes.BAD_ACTORS
    log = w.stderr()
    errors = [line for line in log.splitlines() if " ERROR [" in line]
    assert len(errors) == 1 and ERROR in errors[0], log
    assert "Traceback" not in log
    # Refused before it registered or claimed anything.
    assert conn.execute("SELECT count(*) FROM workers WHERE pid = %s", (w.pid,)).fetchone()[0] == 0


def test_the_same_middleware_added_before_the_fence_runs(conn, workers, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    stamp = tmp_path / "stamp"
    # With job metrics on, every middleware the worker adds is in the list the check sees.
    w = workers(actors="tests.order_actors", extra_env={
        "ORDER_ACTORS_STAMP": str(stamp), "ORDER_ACTORS_PLACE": "before-fence",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics)})
    w.wait_ready(conn)
    conn.execute("INSERT INTO jobs (queue, actor) VALUES ('tests', 'noop')")
    wait_for(stamp.exists, 30, message="the middleware's hook to run")
    assert w.terminate() == exit_codes.OK
