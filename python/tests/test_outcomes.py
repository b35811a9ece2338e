"""A Python caller sees what a Rust caller sees: every call's outcome (``run_reported``), the
core's log events as records of the ``idempotask`` logger, and a result the store did not record
as a warning, or with ``on_unrecorded="raise"`` an exception, never in silence."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import select
import signal
import threading
import time
import warnings
from typing import Any, Callable, Iterator, List

import pytest
from celery import Celery

import idempotask
from idempotask import (
    MemoryStore,
    _native,
    Outcome,
    Reconciled,
    Report,
    ResultNotRecorded,
    UnrecordedResultWarning,
    idempotent_task,
)

from test_reconcile import _killed_mid_body, _killed_worker

# The shortest lock a task takes; a body that sleeps past it finishes without its lock.
SHORT_TTL = 0.1


@pytest.fixture
def memory() -> Iterator[MemoryStore]:
    store = MemoryStore()
    previous = idempotask.install(store)
    yield store
    if previous is not None:
        idempotask.install(previous)


@pytest.fixture
def doomed_redis(redis_server: Any) -> Iterator[Any]:
    """A redis-server of the test's own, which the test kills mid-body: another of the class
    that started the session's (conftest's ``RedisServer``, whose module name another
    ``conftest`` of the suite shadows)."""
    server = type(redis_server)()
    yield server
    server.stop()


def _outlives_its_lock() -> None:
    # The lock's expiry is the event: nothing signals it but the time passing.
    time.sleep(SHORT_TTL * 3)


def _unrecorded_records(caplog: pytest.LogCaptureFixture, name: str) -> List[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if record.name == "idempotask"
        and record.levelno == logging.WARNING
        and getattr(record, "idempotask", {}).get("task") == name
        and ("could not be recorded" in record.getMessage() or "lock expired" in record.getMessage())
    ]


def test_run_reported_says_executed_then_replayed(memory: MemoryStore, name: str) -> None:
    @idempotent_task(key="order-{order_id}", name=name, fencing=True)
    def charge(order_id: int) -> str:
        return f"ch_{order_id}"

    first = charge.run_reported(7)
    assert isinstance(first, Report)
    assert first.value == "ch_7"
    assert first.outcome == Outcome.EXECUTED
    assert first.outcome.recorded and first.outcome.marker_written
    assert first.fencing_token is not None
    again = charge.run_reported(order_id=7)
    assert again == Report("ch_7", Outcome.REPLAYED, first.fencing_token)


def test_run_reported_of_an_async_task(memory: MemoryStore, name: str) -> None:
    @idempotent_task(key="order-{order_id}", name=name)
    async def charge(order_id: int) -> str:
        return f"ch_{order_id}"

    async def scenario() -> List[Report[Any]]:
        return [await charge.run_reported(1), await charge.run_reported(1)]

    first, second = asyncio.run(scenario())
    assert (first.value, first.outcome) == ("ch_1", Outcome.EXECUTED)
    assert (second.value, second.outcome) == ("ch_1", Outcome.REPLAYED)


def test_run_reported_says_reconciled(store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=1, max_wait=10,
                     reconcile=lambda ctx: Reconciled.done("ch_found"))
    def charge(order_id: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(order_id)
        return "ch_ran"

    # A worker killed mid-body: its lock runs out and the unit is in doubt.
    _killed_mid_body(lambda fd: charge(1, fd))
    assert charge.run_reported(1) == Report("ch_found", Outcome.RECONCILED, None)
    assert charge.run_reported(1) == Report("ch_found", Outcome.REPLAYED, None)
    assert ran == []


def test_an_executed_call_warns_of_nothing(memory: MemoryStore, name: str) -> None:
    @idempotent_task(key="order-{order_id}", name=name)
    def charge(order_id: int) -> str:
        return "ch"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert charge(1) == "ch"
        assert charge(1) == "ch"


def test_a_lock_lost_under_the_body_warns_and_logs(memory: MemoryStore, name: str, caplog: pytest.LogCaptureFixture) -> None:
    ran: List[int] = []

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL)
    def charge(order_id: int) -> str:
        ran.append(order_id)
        _outlives_its_lock()
        return "ch"

    caplog.set_level(logging.DEBUG, logger="idempotask")
    with pytest.warns(UnrecordedResultWarning, match=f"task '{name}' with key 'order-1'.*lock had expired"):
        assert charge(1) == "ch"
    (record,) = _unrecorded_records(caplog, name)
    assert record.idempotask["key"] == "order-1"
    assert record.idempotask["marker_written"] is True
    assert "marker_written=true" in record.getMessage()
    # The memory store kept the result: a duplicate replays it.
    assert charge.run_reported(1).outcome == Outcome.REPLAYED
    assert ran == [1]


def test_run_reported_says_lock_lost_and_does_not_warn(memory: MemoryStore, name: str) -> None:
    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL, on_unrecorded="raise")
    def charge(order_id: int) -> str:
        _outlives_its_lock()
        return "ch"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = charge.run_reported(1)
    assert report.value == "ch"
    assert report.outcome == Outcome.lock_lost(marker_written=True)
    assert not report.outcome.recorded


def test_a_store_that_refuses_the_finish_warns_logs_and_raises(
    doomed_redis: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The body succeeded, then the store went away before the completion marker: the value is
    returned with an UnrecordedResultWarning and a WARN record, and with on_unrecorded="raise"
    a ResultNotRecorded carries it."""
    store = idempotask.RedisStore(doomed_redis.url, connection_timeout=0.2, response_timeout=0.2)
    side_effects: List[str] = []

    def task(on_unrecorded: str, suffix: str) -> Any:
        @idempotent_task(key="order-{order_id}", name=name + suffix, lock_ttl=1, store=store, on_unrecorded=on_unrecorded)
        def charge(order_id: int) -> str:
            side_effects.append(suffix)
            if suffix == "_raise":
                doomed_redis.stop()
            return f"ch_{order_id}"

        return charge

    warn, raising = task("warn", "_warn"), task("raise", "_raise")
    caplog.set_level(logging.DEBUG, logger="idempotask")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn(1) == "ch_1"  # executed: no warning
    # The store refuses the next finish: its server is gone by the time the body returns.
    with pytest.raises(ResultNotRecorded) as refused:
        raising(2)
    assert refused.value.value == "ch_2"
    assert refused.value.outcome == Outcome.MARKER_NOT_WRITTEN
    assert (refused.value.task, refused.value.key) == (name + "_raise", "order-2")
    assert isinstance(refused.value, idempotask.IdempotaskError)
    (record,) = _unrecorded_records(caplog, name + "_raise")
    assert record.idempotask["key"] == "order-2"
    assert "error" in record.idempotask
    assert side_effects == ["_warn", "_raise"]


def test_a_store_that_refuses_the_finish_warns_by_default(
    doomed_redis: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = idempotask.RedisStore(doomed_redis.url, connection_timeout=0.2, response_timeout=0.2)

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=1, store=store)
    def charge(order_id: int) -> str:
        doomed_redis.stop()
        return "ch"

    caplog.set_level(logging.WARNING, logger="idempotask")
    with pytest.warns(UnrecordedResultWarning, match="the store did not record its result") as warned:
        assert charge(3) == "ch"
    assert warned[0].filename == __file__
    (record,) = _unrecorded_records(caplog, name)
    assert "could not be recorded" in record.getMessage()


def test_a_lost_lock_raises_in_an_async_task(memory: MemoryStore, name: str) -> None:
    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL, on_unrecorded="raise", log_key="hash")
    async def charge(order_id: int) -> str:
        await asyncio.sleep(SHORT_TTL * 3)
        return "ch"

    with pytest.raises(ResultNotRecorded) as refused:
        asyncio.run(charge(5))
    assert refused.value.value == "ch"
    # `log_key="hash"` holds for the exception too: the key's digest, never the key.
    assert "order-5" not in str(refused.value) and refused.value.key != "order-5"


def test_the_log_level_of_the_logger_filters_the_records(memory: MemoryStore, name: str, caplog: pytest.LogCaptureFixture) -> None:
    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL)
    def charge(order_id: int) -> str:
        _outlives_its_lock()
        return "ch"

    caplog.set_level(logging.ERROR, logger="idempotask")
    with pytest.warns(UnrecordedResultWarning):
        charge(1)
    assert [r for r in caplog.records if r.name == "idempotask"] == []


def test_on_unrecorded_is_checked_when_decorated(name: str) -> None:
    with pytest.raises(ValueError, match=r"on_unrecorded must be one of 'warn', 'raise', not 'ignore'"):

        @idempotent_task(key="order-{order_id}", name=name, on_unrecorded="ignore")
        def charge(order_id: int) -> str:
            return "ch"


def test_run_reported_from_a_celery_task(memory: MemoryStore, name: str) -> None:
    app = Celery("outcomes", broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True

    @idempotent_task(key="order-{order_id}", name=name)
    def charge(order_id: int) -> str:
        return f"ch_{order_id}"

    @app.task(bind=True, acks_late=True)
    def charge_message(self: Any, order_id: int) -> Any:
        report = charge.run_reported(order_id)
        return [report.value, report.outcome.kind]

    assert charge_message.apply(args=(4,)).get() == ["ch_4", "executed"]
    assert charge_message.apply(args=(4,)).get() == ["ch_4", "replayed"]


def test_the_log_records_reach_logging_in_a_forked_child(memory: MemoryStore, name: str) -> None:
    """Celery's prefork pool: the parent made calls (its runtime and the bridge's queue exist)
    before the fork; the child's own records reach the child's `logging`."""

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL)
    def charge(order_id: int) -> str:
        _outlives_its_lock()
        return "ch"

    with pytest.warns(UnrecordedResultWarning):
        charge(1)
    # The child's own call, and none of the parent's records again.
    assert _logged_in_a_forked_child(charge) == f"{name}:order-2"


def _logged_in_a_forked_child(charge: Callable[[int], Any]) -> str:
    """Forks a child that calls ``charge(2)`` and answers with the ``task:key`` of each
    ``idempotask`` record its `logging` got (WARNING and above); a child that hangs is killed
    and fails the test."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns of a fork with threads running; a test forks so on purpose.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            records: List[logging.LogRecord] = []
            handler = logging.Handler()
            handler.emit = records.append  # type: ignore[method-assign]
            logger = logging.getLogger("idempotask")
            logger.addHandler(handler)
            logger.setLevel(logging.WARNING)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                charge(2)
            tasks = sorted({f"{r.idempotask['task']}:{r.idempotask['key']}" for r in records})
            os.write(write, ",".join(tasks).encode())
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 60)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(read, "rb") as answer:
        told = answer.read()
    os.waitpid(pid, 0)
    assert ready, "the forked child hung"
    return told.decode()


def _until_records_are_queued() -> None:
    """Waits until the core queued a record no call has handed to `logging` yet (a renewal's
    warning, on a runtime thread); nothing signals it but the queue itself."""
    deadline = time.monotonic() + 30
    while _native.queued_records() == 0:
        assert time.monotonic() < deadline, "no record was queued"
        time.sleep(0.01)


def _renewing_on(doomed_redis: Any, name: str, body: Callable[[], None]) -> Any:
    """A task that renews its lock on ``doomed_redis``, whose body stops the server and waits
    until a renewal's warning is queued, then runs ``body``."""
    store = idempotask.RedisStore(doomed_redis.url, connection_timeout=0.2, response_timeout=0.2)

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=1, renew=True, store=store)
    def charge(order_id: int) -> str:
        doomed_redis.stop()
        _until_records_are_queued()
        body()
        return "ch"

    return charge


def test_a_child_forked_while_records_are_queued_logs_only_its_own(
    memory: MemoryStore, doomed_redis: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery's prefork pool forks while a call on another thread has records queued (a
    renewal's warnings): the child logs none of them, and does not hang on the queue."""
    queued, forked = threading.Event(), threading.Event()

    def hold() -> None:
        queued.set()
        forked.wait(30)

    renewing = _renewing_on(doomed_redis, name + "_renewing", hold)

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL)
    def charge(order_id: int) -> str:
        _outlives_its_lock()
        return "ch"

    caplog.set_level(logging.WARNING, logger="idempotask")
    reports: List[Report[Any]] = []
    thread = threading.Thread(target=lambda: reports.append(renewing.run_reported(1)))
    thread.start()
    try:
        assert queued.wait(30)
        told = _logged_in_a_forked_child(charge)
    finally:
        forked.set()
        thread.join()
    assert told == f"{name}:order-2"
    # The parent handed its own records to `logging` itself.
    assert any(
        r.idempotask.get("task") == name + "_renewing" and "renew" in r.getMessage()
        for r in caplog.records
        if r.name == "idempotask"
    )
    assert reports and not reports[0].outcome.recorded


def test_a_keyboard_interrupt_in_a_handler_reaches_the_caller(memory: MemoryStore, name: str) -> None:
    """Ctrl-C while a handler writes the core's records: the caller gets the KeyboardInterrupt,
    as it would anywhere else in its code."""

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=SHORT_TTL)
    def charge(order_id: int) -> str:
        _outlives_its_lock()
        return "ch"

    class Interrupted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise KeyboardInterrupt

    logger = logging.getLogger("idempotask")
    handler, level = Interrupted(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(), pytest.raises(KeyboardInterrupt):
            warnings.simplefilter("ignore")
            charge(1)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_failing_filter_loses_no_other_record(
    doomed_redis: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A filter that raises for one record: that record is reported on stderr as `logging`
    reports a handler's error, and the other records of the hand-over still go out."""
    charge = _renewing_on(doomed_redis, name, lambda: None)
    seen: List[str] = []
    delivered: List[str] = []

    def refuse_the_first(record: logging.LogRecord) -> bool:
        seen.append(record.getMessage())
        if len(seen) == 1:
            raise ValueError("a broken filter")
        return True

    handler = logging.Handler()
    handler.emit = lambda record: delivered.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("idempotask")
    level = logger.level
    logger.addHandler(handler)
    logger.addFilter(refuse_the_first)
    logger.setLevel(logging.WARNING)
    try:
        report = charge.run_reported(1)
    finally:
        logger.removeFilter(refuse_the_first)
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert not report.outcome.recorded
    # The renewal's warning and the unrecorded result's, at least.
    assert len(seen) >= 2
    assert delivered == seen[1:]
    err = capsys.readouterr().err
    assert "--- Logging error" in err and "a broken filter" in err


def test_a_reconciled_result_not_recorded_says_the_reconcile_function_answered(
    doomed_redis: Any, name: str
) -> None:
    store = idempotask.RedisStore(doomed_redis.url, connection_timeout=0.2, response_timeout=0.2)

    def found(ctx: Any) -> Reconciled[Any]:
        doomed_redis.stop()
        return Reconciled.done("ch_found")

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=1, max_wait=10, store=store, reconcile=found)
    def charge(order_id: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        return "ch_ran"

    _killed_mid_body(lambda fd: charge(1, fd))
    with pytest.warns(UnrecordedResultWarning, match="its reconcile function answered, but the store did not record"):
        assert charge(1) == "ch_found"


def test_run_reported_binds_self_on_a_method(memory: MemoryStore, name: str) -> None:
    class Orders:
        def __init__(self) -> None:
            self.charged: List[int] = []

        @idempotent_task(key="order-{order_id}", name=name)
        def charge(self, order_id: int) -> str:
            self.charged.append(order_id)
            return f"ch_{order_id}"

        @idempotent_task(key="order-{order_id}", name=name + "_async")
        async def refund(self, order_id: int) -> str:
            self.charged.append(-order_id)
            return f"re_{order_id}"

    orders = Orders()
    assert orders.charge.run_reported(1) == Report("ch_1", Outcome.EXECUTED, None)
    assert orders.charge(1) == "ch_1"
    assert Orders.charge.run_reported(orders, 1) == Report("ch_1", Outcome.REPLAYED, None)
    assert orders.charge.idempotask_unit(1) == ("order-1", None)
    assert orders.charge.idempotask_name == name
    assert asyncio.run(orders.refund.run_reported(2)) == Report("re_2", Outcome.EXECUTED, None)
    assert asyncio.run(orders.refund(2)) == "re_2"
    assert asyncio.iscoroutinefunction(Orders.refund) and asyncio.iscoroutinefunction(orders.refund)
    assert orders.charged == [1, -2]


def test_the_trace_level_has_a_name() -> None:
    assert logging.getLevelName(5) == "TRACE"


def test_an_outcome_this_build_does_not_know_is_not_recorded() -> None:
    # The decorator warns of it, so `recorded` must not call it recorded.
    assert not Outcome("a_later_variant", False).recorded
    assert Outcome.EXECUTED.recorded and Outcome.REPLAYED.recorded and Outcome.RECONCILED.recorded


def test_result_not_recorded_survives_pickling() -> None:
    """Celery's result backends and multiprocessing pickle a task's exception."""
    raised = ResultNotRecorded("task 't': not recorded", {"charge": "ch"}, Outcome.MARKER_NOT_WRITTEN, "t", "order-1")
    again = pickle.loads(pickle.dumps(raised))
    assert (str(again), again.value, again.outcome, again.task, again.key) == (
        str(raised), raised.value, raised.outcome, raised.task, raised.key
    )
