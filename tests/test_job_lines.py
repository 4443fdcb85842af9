"""The per-job log line written off the job's thread (supervisor/worker/lines.py): the
same records a direct ``log.info`` makes, in the order noted, one write per batch for a
plain stream handler, the logger's and handlers' levels and filters kept, nothing lost
at stop. The line's fields in a real worker: tests/test_ops.py."""

from __future__ import annotations

import io
import json
import logging
import threading

from supervisor.logs import JsonFormatter, SecondStamps
from supervisor.worker.lines import LineWriter


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def make(logger: logging.Logger):
    def record(noted: tuple[float, int]) -> logging.LogRecord:
        at, n = noted
        r = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "job %d", (n,), None, extra={"n": n})
        r.created = at
        return r
    return record


def fresh_logger(name: str, *handlers: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = list(handlers)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_a_batch_is_one_write_in_the_order_noted_with_the_note_s_time() -> None:
    stream = CountingStream()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = fresh_logger("test.lines.batch", handler)
    writer = LineWriter(logger, make(logger))
    noters = [threading.Thread(target=lambda k=k: [writer.put((1_700_000_000.0 + k, k * 100 + i))
                                                    for i in range(100)]) for k in range(4)]
    for t in noters:
        t.start()
    for t in noters:
        t.join()
    writer.stop()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 400
    got = [json.loads(line) for line in lines]
    for k in range(4):  # each thread's lines in its order, each with its own time
        mine = [g for g in got if g["n"] // 100 == k]
        assert [g["n"] for g in mine] == [k * 100 + i for i in range(100)]
        assert {g["ts"] for g in mine} == {handler.formatter.formatTime(logging.makeLogRecord(
            {"created": 1_700_000_000.0 + k}), "%Y-%m-%dT%H:%M:%S")}
    assert stream.writes <= 2  # the batch the thread wrote (if it woke in time), and stop's


def test_levels_filters_and_other_handlers_are_kept() -> None:
    stream = CountingStream()
    plain = logging.StreamHandler(stream)
    plain.addFilter(lambda r: r.n % 2 == 0)  # type: ignore[attr-defined]
    quiet = logging.StreamHandler(io.StringIO())
    quiet.setLevel(logging.WARNING)
    seen: list[logging.LogRecord] = []

    class Keeper(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = fresh_logger("test.lines.handlers", plain, quiet, Keeper())
    writer = LineWriter(logger, make(logger))
    for n in range(10):
        writer.put((0.0, n))
    writer.stop()
    assert stream.getvalue().splitlines() == [f"job {n}" for n in range(0, 10, 2)]
    assert quiet.stream.getvalue() == ""
    assert [r.n for r in seen] == list(range(10))  # type: ignore[attr-defined]
    writer.put((0.0, 10))  # after stop: written at once, never lost
    assert [r.n for r in seen][-1] == 10  # type: ignore[attr-defined]


def test_the_second_stamped_formatter_writes_what_logging_s_own_does() -> None:
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    ours, theirs = SecondStamps(fmt), logging.Formatter(fmt)
    for at in (1_700_000_000.123, 1_700_000_000.999, 1_700_000_001.0, 1_700_000_000.5):
        record = logging.makeLogRecord({"msg": "x", "created": at, "msecs": int((at - int(at)) * 1000) + 0.0,
                                        "levelname": "INFO", "name": "n"})
        assert ours.format(record) == theirs.format(record)
        assert ours.formatTime(record, "%Y-%m-%dT%H:%M:%S") == theirs.formatTime(record, "%Y-%m-%dT%H:%M:%S")
