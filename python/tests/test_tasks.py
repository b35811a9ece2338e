"""The decorator as Celery users' own tests exercise it, on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
from typing import Any, List

import celery
import pytest
import redis

import idempotask
from idempotask import Contended, CodecError, InDoubt, KeyReuse, idempotent_task


def test_applied_twice_with_one_key_runs_once_and_replays(store: Any, name: str) -> None:
    gateway: List[int] = []

    @idempotent_task(key="order-charge-{order_id}", lock_ttl=30, name=name)
    def charge_customer(order_id: int, amount_cents: int) -> str:
        gateway.append(order_id)
        return f"ch_{order_id}_{amount_cents}_{len(gateway)}"

    first = charge_customer(42, 1200)
    second = charge_customer(42, 1200)
    assert gateway == [42]
    assert second == first == "ch_42_1200_1"
    assert charge_customer(43, 1200) == "ch_43_1200_2"


def test_fired_from_threads_at_once_runs_once(store: Any, name: str) -> None:
    gateway: List[int] = []
    threads = 8
    start = threading.Barrier(threads)

    @idempotent_task(key="order-charge-{order_id}", name=name, initial_backoff=0.005)
    def charge_customer(order_id: int) -> str:
        gateway.append(order_id)
        return f"ch_{order_id}"

    results: List[Any] = [None] * threads

    def deliver(i: int) -> None:
        start.wait()
        results[i] = charge_customer(7)

    workers = [threading.Thread(target=deliver, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert gateway == [7]
    assert results == ["ch_7"] * threads


def _deliver_in_process(url: str, name: str, barrier: Any, results: Any) -> None:
    # A process of its own (forked): the store and the task are built here, as a Celery
    # worker module builds them at import.
    idempotask.install(idempotask.RedisStore(url))

    @idempotent_task(key="order-charge-{order_id}", name=name, initial_backoff=0.005)
    def charge_customer(order_id: int) -> str:
        count = redis.Redis.from_url(url).incr(f"gateway:{order_id}")
        return f"ch_{order_id}_{count}"

    barrier.wait()
    results.put(charge_customer(9))


def test_fired_from_processes_at_once_runs_once(redis_server: Any, redis_client: redis.Redis, name: str) -> None:
    context = multiprocessing.get_context("fork")
    processes = 4
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=_deliver_in_process, args=(redis_server.url, name, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    answers = [results.get(timeout=60) for _ in range(processes)]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert redis_client.get("gateway:9") == b"1"
    assert answers == ["ch_9_1"] * processes


def test_an_exception_is_not_cached_and_propagates_unchanged(store: Any, name: str) -> None:
    attempts: List[int] = []
    declined = ValueError("card declined")

    @idempotent_task(key="order-charge-{order_id}", name=name)
    def charge_customer(order_id: int) -> str:
        attempts.append(order_id)
        if len(attempts) == 1:
            raise declined
        return "ch_ok"

    with pytest.raises(ValueError) as raised:
        charge_customer(5)
    assert raised.value is declined
    # Released, not cached: the next delivery runs, and its result is kept.
    assert charge_customer(5) == "ch_ok"
    assert charge_customer(5) == "ch_ok"
    assert attempts == [5, 5]


def test_async_def_runs_once_and_replays(store: Any, name: str) -> None:
    gateway: List[int] = []

    @idempotent_task(key="receipt-{order_id}", name=name, initial_backoff=0.005)
    async def send_receipt(order_id: int) -> dict:
        gateway.append(order_id)
        await asyncio.sleep(0.05)  # the work itself; the other deliveries wait on its lock
        return {"order": order_id, "sent": True}

    async def deliveries() -> List[dict]:
        return await asyncio.gather(*(send_receipt(3) for _ in range(5)))

    results = asyncio.run(deliveries())
    assert results == [{"order": 3, "sent": True}] * 5
    assert gateway == [3]
    assert asyncio.run(send_receipt(3)) == {"order": 3, "sent": True}
    assert gateway == [3]


def test_async_def_exception_is_not_cached(store: Any, name: str) -> None:
    attempts: List[int] = []

    @idempotent_task(key="receipt-{order_id}", name=name)
    async def send_receipt(order_id: int) -> str:
        attempts.append(order_id)
        if len(attempts) == 1:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError, match="smtp down"):
        asyncio.run(send_receipt(1))
    assert asyncio.run(send_receipt(1)) == "sent"
    assert attempts == [1, 1]


def test_a_big_integer_result_round_trips_exactly(store: Any, name: str, redis_client: redis.Redis) -> None:
    ran: List[int] = []

    @idempotent_task(key="ledger-{account}", name=name)
    def ledger_total(account: str) -> Any:
        ran.append(1)
        return {"total": 2**100 + 1, "negative": -(2**80), "ratio": 0.1, "name": "é✓"}

    first = ledger_total("acc-1")
    replayed = ledger_total("acc-1")
    assert ran == [1]
    assert replayed == first
    assert replayed["total"] == 2**100 + 1 and isinstance(replayed["total"], int)
    # Stored as the JSON text Rust's serde_json would write: compact, not ASCII-escaped.
    (redis_key,) = redis_client.keys(f"idempotask:v2:default:{name}:*")
    marker = redis_client.get(redis_key)
    assert marker.endswith('|{"total":1267650600228229401496703205377,"negative":-1208925819614629174706176,"ratio":0.1,"name":"é✓"}'.encode())


def test_a_busy_unit_raises_busy_with_the_holders_remaining_time(store: Any, name: str) -> None:
    entered, finish = threading.Event(), threading.Event()

    @idempotent_task(key="export-{job}", name=name, lock_ttl=20, on_busy="raise")
    def export(job: int) -> str:
        entered.set()
        finish.wait(30)
        return "done"

    holder = threading.Thread(target=export, args=(1,))
    holder.start()
    assert entered.wait(30)
    with pytest.raises(Contended) as busy:
        export(1)
    assert busy.value.lock_ttl_remaining is not None and 15 < busy.value.lock_ttl_remaining <= 20
    assert busy.value.attempts == 1
    assert isinstance(busy.value, idempotask.Contended)
    finish.set()
    holder.join()
    assert export(1) == "done"


class _FakeCeleryTask:
    """What the decorator looks at in a bound Celery task: `retry` and `request`."""

    class Retry(Exception):
        pass

    def __init__(self) -> None:
        self.request = object()
        self.retries: List[dict] = []

    def retry(self, exc: BaseException, countdown: float) -> BaseException:
        self.retries.append({"exc": exc, "countdown": countdown})
        return self.Retry()


def test_a_busy_bound_celery_task_retries_in_the_holders_remaining_time(store: Any, name: str) -> None:
    entered, finish = threading.Event(), threading.Event()
    ran: List[int] = []

    @idempotent_task(key="order-charge-{order_id}", name=name, lock_ttl=20)
    def charge_customer(self: Any, order_id: int) -> str:
        ran.append(order_id)
        entered.set()
        finish.wait(30)
        return "ch_1"

    holder = threading.Thread(target=charge_customer, args=(_FakeCeleryTask(), 1))
    holder.start()
    assert entered.wait(30)
    task = _FakeCeleryTask()
    with pytest.raises(_FakeCeleryTask.Retry):
        charge_customer(task, 1)
    (retry,) = task.retries
    assert isinstance(retry["exc"], Contended)
    assert 15 < retry["countdown"] <= 20
    finish.set()
    holder.join()
    assert charge_customer(task, 1) == "ch_1"
    assert ran == [1]


def test_a_real_bound_celery_task(store: Any, name: str) -> None:
    app = celery.Celery("tests", broker="memory://", backend="cache+memory://")
    gateway: List[int] = []

    @app.task(bind=True, acks_late=True, name=name)
    @idempotent_task(key="order-charge-{order_id}", name=name)
    def charge_customer(self: Any, order_id: int, amount_cents: int) -> str:
        gateway.append(order_id)
        return f"ch_{order_id}_{amount_cents}_{self.request.id is not None}"

    first = charge_customer.apply(args=(42, 1200)).get()
    second = charge_customer.apply(kwargs={"order_id": 42, "amount_cents": 1200}).get()
    assert first == second == "ch_42_1200_True"
    assert gateway == [42]


def test_the_fingerprint_refuses_a_reused_key(store: Any, name: str) -> None:
    @idempotent_task(key="order-charge-{order_id}", name=name, fingerprint=["amount_cents"])
    def charge_customer(order_id: int, amount_cents: int) -> str:
        return "ch"

    assert charge_customer(1, 100) == "ch"
    assert charge_customer(1, 100) == "ch"
    with pytest.raises(KeyReuse):
        charge_customer(1, 200)


def test_a_result_without_json_form_runs_once_and_duplicates_get_an_error(store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="k-{n}", name=name)
    def task(n: int) -> Any:
        ran.append(n)
        return {1, 2}

    assert task(1) == {1, 2}
    with pytest.raises(CodecError) as error:
        task(1)
    assert error.value.kind == "unstorable"
    assert ran == [1]


def test_no_store_installed_is_an_error(name: str) -> None:
    previous = idempotask.installed()
    idempotask._decorator._installed = None
    try:

        @idempotent_task(key="k-{n}", name=name)
        def task(n: int) -> int:
            return n

        with pytest.raises(idempotask.IdempotaskError, match="no idempotency store is installed"):
            task(1)
    finally:
        idempotask._decorator._installed = previous


def test_the_body_reads_its_context(store: Any, name: str) -> None:
    @idempotent_task(key="settle-{invoice}", name=name, fencing=True)
    def settle(invoice: str) -> Any:
        ctx = idempotask.context()
        assert ctx is not None
        return [ctx.task, ctx.key, ctx.fencing_token is not None, ctx.attempt]

    assert settle("inv-9") == [name, "settle-inv-9", True, 1]
    assert idempotask.context() is None


def test_a_store_built_in_the_parent_works_in_a_forked_child(store: Any, name: str, redis_client: redis.Redis) -> None:
    @idempotent_task(key="job-{n}", name=name)
    def job(n: int) -> str:
        return f"{os.getpid()}-{n}"

    parent = job(1)  # the parent's runtime and connection exist before the fork
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            replayed = job(1)
            fresh = job(2)
            code = 0 if replayed == parent and fresh == f"{os.getpid()}-2" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's runtime and connection still serve it.
    assert job(2) == f"{pid}-2"
    assert job(3) == f"{os.getpid()}-3"


def test_a_memory_store_works_in_threads_and_after_a_fork(name: str) -> None:
    store = idempotask.MemoryStore()
    ran: List[int] = []

    @idempotent_task(key="job-{n}", name=name, store=store)
    def job(n: int) -> int:
        ran.append(n)
        return n * 2

    assert job(1) == job(1) == 2
    assert ran == [1]
    pid = os.fork()
    if pid == 0:
        # A child's memory store is its own, empty one.
        os._exit(0 if job(1) == 2 and ran == [1, 1] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _killed_mid_body(function: Any) -> None:
    """Runs ``function(1)`` in a forked child and kills the child (SIGKILL) once its body
    runs: a worker killed after its side effect and before its marker."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            function(1, write)
        finally:
            os._exit(1)
    os.close(write)
    assert os.read(read, 1) == b"x", "the child's body started"
    os.close(read)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_in_doubt_hold_refuses_a_unit_whose_worker_was_killed(store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=0.3, in_doubt="hold", max_wait=10)
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            os.write(signal_fd, b"x")
            threading.Event().wait(60)  # the killed worker's gateway call, never returning
        ran.append(n)
        return "ch"

    _killed_mid_body(charge)
    # The call waits on the dead worker's lock until it runs out, then finds the unit in doubt.
    with pytest.raises(InDoubt) as doubt:
        charge(1)
    assert doubt.value.expired_for >= 0
    with pytest.raises(InDoubt):
        charge(1)
    assert ran == []


def test_a_unit_held_past_hold_alert_after_is_logged_as_an_error(
    store: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    @idempotent_task(key="charge-{n}", name=name, lock_ttl=0.3, in_doubt="hold", hold_alert_after=0.2, max_wait=10)
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            os.write(signal_fd, b"x")
            threading.Event().wait(60)
        return "ch"

    _killed_mid_body(charge)
    caplog.set_level(logging.WARNING, logger="idempotask")
    # Each delivery reports how long the unit has been held: the signal to deliver again on.
    held_for = 0.0
    while held_for < 0.2:
        caplog.clear()
        with pytest.raises(InDoubt) as doubt:
            charge(1)
        held_for = doubt.value.expired_for
        levels = [record.levelno for record in caplog.records if record.name == "idempotask"]
        expected = logging.ERROR if held_for >= 0.2 else logging.WARNING
        assert expected in levels, (held_for, levels)
    assert any("hold_alert_after" in record.getMessage() for record in caplog.records)


def test_hold_alert_after_without_hold_is_refused_when_decorated(name: str) -> None:
    with pytest.raises(ValueError, match="only in_doubt=\"hold\" holds units"):
        @idempotent_task(key="charge-{n}", name=name, hold_alert_after=3600)
        def charge(n: int) -> str:
            return "ch"


def test_in_doubt_rerun_tells_the_body(store: Any, name: str) -> None:
    seen: List[Any] = []

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10)
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            os.write(signal_fd, b"x")
            threading.Event().wait(60)
        seen.append(idempotask.context().in_doubt)
        return "ch"

    _killed_mid_body(charge)
    assert charge(1) == "ch"
    (in_doubt,) = seen
    assert in_doubt is not None and in_doubt >= 0
