"""Dramatiq's own test suite against PostgresBroker, built as the supervisor.testing plugin
builds it.

    python bench/dramatiq_suite.py --dramatiq /tmp/dramatiq-src [--executor own|dramatiq] [pytest args...]

runs ``pytest`` inside a checkout of Dramatiq (the tag of the installed version; its test
dependencies ``redis pika pylibmc`` installed beside this project) with two plugins:
``supervisor.testing`` (a throw-away database, one PostgresBroker as the global broker)
and this module, which points Dramatiq's ``stub_broker`` and ``stub_worker`` fixtures at
that broker. ``--executor`` picks the worker those fixtures and Dramatiq's
``tests.common.worker`` build: ``dramatiq`` (its ``dramatiq.Worker``, the default) or
``own`` (supervisor.worker.executor.Worker, what ``supervisor run`` uses). Nothing of
Dramatiq's is copied or edited; the tests that only make sense
on the stub broker (its in-memory queues, its own class) are deselected below, each with
its reason, and printed. The last line is pytest's: passed / failed / skipped.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
EXECUTOR_ENV = "SUPERVISOR_SUITE_EXECUTOR"
PIPELINE_ENV = "SUPERVISOR_SUITE_PIPELINE"

# Deselected: node id prefix -> why. Tests of what only Dramatiq's StubBroker has (its
# in-memory queue objects, its class, synchronous delivery), of a broker without the
# Results middleware (this one always has it), of Dramatiq's CLI, whose subprocesses run
# Dramatiq's own brokers, and one that fails without this plugin too.
# The tests parametrized over result backends run with Dramatiq's stub backend only, those
# over rate-limiter backends with supervisor.rate_limits.PostgresBackend ("postgres", on
# the broker's database, its keys emptied before each test) and the stub (see BACKEND_PARAMS).
EXCLUDED: dict[str, str] = {
    "tests/test_redis.py": "the RedisBroker",
    "tests/test_rabbitmq.py": "the RabbitmqBroker",
    "tests/benchmarks": "pytest-benchmark runs of the Redis and RabbitMQ brokers",
    "tests/test_stub_broker.py": "the StubBroker class itself (its queue objects, dead_letters_by_queue)",
    "tests/test_actors.py::test_actors_can_be_sent_messages": "reads the StubBroker's in-memory queue",
    "tests/test_actors.py::test_worker_handles_non_numeric_eta": "puts into the StubBroker's in-memory queue",
    "tests/test_actors.py::test_worker_handles_none_eta": "puts into the StubBroker's in-memory queue",
    "tests/test_results.py::test_messages_can_fail_to_get_results_if_there_is_no_backend":
        "a broker without the Results middleware",
    "tests/test_results.py::test_actor_warning_when_returns_result_and_no_results_middleware_present":
        "a broker without the Results middleware",
    "tests/test_worker.py::test_workers_process_messages_in_order":
        "counts the worker's in-memory queue the moment send() returns (the stub delivers synchronously;"
        " a row reaches a worker by NOTIFY and a claim, a few ms later)",
    "tests/middleware/test_asyncio.py::test_event_loop_thread_run_coroutine_interrupted":
        "no broker; fails in most runs here without this plugin too (a race in the test)",
    "tests/test_cli.py": "the dramatiq CLI on a RedisBroker (waits for a Redis server)",
    "tests/test_watch.py": "the dramatiq CLI's --watch on a RedisBroker",
    "tests/test_pidfile.py": "the dramatiq CLI on a StubBroker of its own (its reload test fails here without this plugin too)",
    "tests/test_composition.py::test_groups_with_completion_callbacks_fail_unless_group_callbacks_is_set_up":
        "this broker installs GroupCallbacks (on supervisor.rate_limits.PostgresBackend) by default (issue 41)",
}


# Parameters of the backend fixtures that name a Redis or memcached server, and fixtures
# of those servers or RabbitMQ: their tests are deselected (they would empty the
# machine's Redis, and test nothing of this broker).
BACKEND_PARAMS = {"redis", "memcached"}
SERVER_FIXTURES = ("redis", "memcached", "rabbitmq")


def _broker() -> Any:
    from supervisor import testing

    return testing._state["broker"]


def _stub_broker_fixture() -> Any:
    import dramatiq
    import pytest

    @pytest.fixture(name="stub_broker")
    def stub_broker(supervisor_broker: Any) -> Iterator[Any]:
        supervisor_broker.emit_after("process_boot")
        dramatiq.set_broker(supervisor_broker)
        yield supervisor_broker
        supervisor_broker.flush_acks(10)
        supervisor_broker.flush_all()

    return stub_broker


def _restore_broker_fixture() -> Any:
    import dramatiq
    import pytest

    baseline: list[Any] = []

    def reset(broker: Any) -> None:
        # Dramatiq's fixture makes a broker per test; here one broker serves the session,
        # so each test starts from its state as built: no actors (a test module may
        # declare some on import), no queues, the middleware it was built with (a test
        # adds its own, a worker its own), no queue prefetch bounds (a test that drops a
        # consumer holding a message would hold a slot of that queue for good), and it
        # is the global broker.
        broker.middleware = list(baseline)
        broker.actors.clear()  # in place: the broker's parts hold these dicts
        broker.queues.clear()
        broker.queue_capacity.clear()
        dramatiq.set_broker(broker)

    @pytest.fixture(autouse=True)
    def _restore_broker() -> Iterator[None]:
        broker = _broker()
        if not baseline:
            baseline.extend(broker.middleware)
        reset(broker)
        yield
        reset(broker)

    return _restore_broker


def _worker_class() -> Any:
    """The worker class the tests build (``--executor``)."""
    if os.environ.get(EXECUTOR_ENV) == "own":
        from supervisor.worker.executor import Worker

        return Worker
    import dramatiq

    return dramatiq.Worker


def _stub_worker_fixture() -> Any:
    import pytest

    @pytest.fixture(name="stub_worker")
    def stub_worker(stub_broker: Any) -> Iterator[Any]:
        worker = _worker_class()(stub_broker, worker_timeout=100, worker_threads=32)  # as Dramatiq's fixture
        worker.start()
        yield worker
        worker.stop()

    return stub_worker


def _stub_backends_fixtures() -> dict[str, Any]:
    import pytest
    from dramatiq.rate_limits import backends as rate_limit_backends
    from dramatiq.results import backends as result_backends

    from supervisor.rate_limits import PostgresBackend

    @pytest.fixture(name="rate_limiter_backends")
    def rate_limiter_backends() -> Iterator[dict[str, Any]]:
        broker = _broker()
        with broker.pool.connection() as c:  # the same keys recur from test to test
            c.execute("TRUNCATE limiter_keys, group_arrivals")
        postgres = PostgresBackend(url=broker.url)
        yield {"stub": rate_limit_backends.StubBackend(), "postgres": postgres}
        postgres.close()

    @pytest.fixture(name="rate_limiter_backend", params=["postgres", "stub"])
    def rate_limiter_backend(request: Any, rate_limiter_backends: dict[str, Any]) -> Any:
        return rate_limiter_backends[request.param]

    @pytest.fixture(name="result_backends")
    def result_backends_() -> dict[str, Any]:
        return {"stub": result_backends.StubBackend()}

    return {"rate_limiter_backends": rate_limiter_backends, "rate_limiter_backend": rate_limiter_backend,
            "result_backends": result_backends_}


def pytest_configure(config: Any) -> None:
    """With ``--pipeline supervisor``, Dramatiq's tests build ``supervisor.pipeline`` where
    they say ``dramatiq.pipeline`` (they import it from dramatiq when collected, after this)."""
    if os.environ.get(PIPELINE_ENV) == "supervisor":
        import dramatiq

        import supervisor

        dramatiq.pipeline = supervisor.pipeline  # type: ignore[misc]


def pytest_plugin_registered(plugin: Any, plugin_name: str | None) -> None:
    """Swap the fixtures of Dramatiq's tests/conftest.py before pytest parses them
    (it parses a conftest's fixtures when it collects the conftest's folder)."""
    if isinstance(plugin, ModuleType) and (plugin_name or "").endswith(os.path.join("tests", "conftest.py")) \
            and hasattr(plugin, "stub_broker"):
        plugin.stub_broker = _stub_broker_fixture()  # type: ignore[attr-defined]
        plugin.stub_worker = _stub_worker_fixture()  # type: ignore[attr-defined]
        plugin._supervisor_restore_broker = _restore_broker_fixture()  # type: ignore[attr-defined]
        for name, fixture in _stub_backends_fixtures().items():
            setattr(plugin, name, fixture)


# Deselected with --pipeline supervisor only: node id -> why.
SUPERVISOR_PIPELINE_EXCLUDED = {
    "tests/test_composition.py::test_messages_can_be_piped":
        "`message | message` is Dramatiq's Message.__or__, which builds dramatiq's own pipeline class",
}


def _excluded() -> dict[str, str]:
    extra = SUPERVISOR_PIPELINE_EXCLUDED if os.environ.get(PIPELINE_ENV) == "supervisor" else {}
    return {**EXCLUDED, **extra}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    common = sys.modules.get("tests.common")
    if common is not None:  # the helper a few tests build their own worker with
        common.Worker = _worker_class()  # type: ignore[attr-defined]
    kept, dropped = [], []
    for item in items:
        params = set(getattr(getattr(item, "callspec", None), "params", {}).values())
        servers = [name for name in getattr(item, "fixturenames", ()) if name.startswith(SERVER_FIXTURES)]
        excluded = any(item.nodeid.startswith(p) for p in _excluded()) or params & BACKEND_PARAMS or servers
        (dropped if excluded else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    worker = _worker_class()
    write(f"executor: {worker.__module__}.{worker.__qualname__}")
    write(f"pipeline: {'supervisor.pipeline' if os.environ.get(PIPELINE_ENV) == 'supervisor' else 'dramatiq.pipeline'}")
    write("deselected by bench/dramatiq_suite.py:")
    for prefix, why in _excluded().items():
        write(f"  {prefix}: {why}")
    write(f"  tests with a {', '.join(SERVER_FIXTURES)} fixture or a {', '.join(sorted(BACKEND_PARAMS))} backend"
          " parameter: other brokers' and backends' servers")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dramatiq", required=True, type=Path, help="a checkout of Dramatiq (its tests/ folder)")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--executor", choices=("dramatiq", "own"), default="dramatiq",
                        help="the worker of the stub_worker fixture: dramatiq.Worker, or supervisor's own")
    parser.add_argument("--pipeline", choices=("dramatiq", "supervisor"), default="dramatiq",
                        help="the pipeline class the tests build: Dramatiq's, or supervisor.pipeline (a drop-in)")
    args, pytest_args = parser.parse_known_args()
    if not (args.dramatiq / "tests" / "conftest.py").is_file():
        print(f"error: {args.dramatiq} is not a Dramatiq checkout (no tests/conftest.py)", file=sys.stderr)
        return 2
    env = {**os.environ, "SUPERVISOR_TEST_DATABASE_URL": args.database_url, EXECUTOR_ENV: args.executor,
           PIPELINE_ENV: args.pipeline,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-p", "supervisor.testing", "-p", "dramatiq_suite",
               "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rfEs", *pytest_args]
    return subprocess.run(command, cwd=args.dramatiq, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
