"""The core's runner-level conformance checks (the crate `idempotask-conformance`), run through
the Python package on the in-memory store and on Redis.

Each test names the core check it follows. Through the binding, a check observes what a Python
caller can: how often the body ran, what each call returned or raised, and what the body read
from ``idempotask.context()``. The subset, and what does not apply to a Python caller, is listed
in docs/python.md ("Conformance through the binding"). Checks that tests/test_tasks.py already
makes as Celery users write them are not repeated here; the table in docs/python.md points
at them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
import redis

import idempotask
from idempotask import Contended, IdempotaskError, InDoubt, KeyReuse, _native, idempotent_task


class _Holder:
    """A delivery that holds a unit through the binding (the native call under the decorator)
    until it is told to finish: another worker's body in flight."""

    def __init__(self, store: Any, name: str, key: str, **options: Any) -> None:
        self.pending = _native.Task(name, **options).start(store, key, None, True)
        event = self.pending.wait()
        assert event[0] == "run", event
        self.fencing_token: Optional[int] = event[1]

    def finish(self, json_text: str) -> Any:
        self.pending.finish(json_text)
        return self.pending.wait()


# runner::a_duplicate_gets_the_stored_result_without_running
def test_a_duplicate_gets_the_stored_result(any_store: Any, name: str) -> None:
    runs: List[int] = []

    @idempotent_task(key="order-{order_id}", name=name, store=any_store)
    def charge(order_id: int, amount: int) -> str:
        runs.append(amount)
        return f"ch_{amount}"

    assert charge(9, 1200) == "ch_1200"
    # A duplicate with other arguments outside the key still gets the first result.
    assert [charge(9, 9999) for _ in range(3)] == ["ch_1200"] * 3
    assert runs == [1200]


# runner::errors_are_not_cached_and_free_the_lock; runner::a_panic_frees_the_lock_and_resumes
@pytest.mark.parametrize("raised", [ValueError("declined"), KeyboardInterrupt()], ids=["exception", "base_exception"])
def test_errors_are_not_cached_and_free_the_lock(any_store: Any, name: str, raised: BaseException) -> None:
    runs: List[Optional[float]] = []

    # on_busy="raise": a lock still held after the failure would be `Contended` at once.
    @idempotent_task(key="k-{n}", name=name, store=any_store, on_busy="raise", lock_ttl=30)
    def flaky(n: int) -> int:
        runs.append(idempotask.context().in_doubt)
        if len(runs) == 1:
            raise raised
        return 7

    with pytest.raises(type(raised)):
        flaky(1)
    assert flaky(1) == 7
    assert flaky(1) == 7
    # Released, so the next delivery was not in doubt.
    assert runs == [None, None]


# runner::a_dropped_call_frees_the_lock (an asyncio task cancelled mid-body)
def test_a_cancelled_call_frees_the_lock(any_store: Any, name: str) -> None:
    runs: List[Optional[float]] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store, lock_ttl=30, max_wait=20)
    async def job(n: int, hang: bool = False) -> str:
        runs.append(idempotask.context().in_doubt)
        if hang:
            await asyncio.Event().wait()
        return "done"

    async def scenario() -> str:
        hung = asyncio.ensure_future(job(1, hang=True))
        while not runs:
            await asyncio.sleep(0)  # until its body runs; nothing else to wait on in one loop
        hung.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hung
        started = time.monotonic()
        answer = await job(1)
        # The release went on on the runtime; the next delivery waited for it, not for the
        # 30 s lock.
        assert time.monotonic() - started < 10
        return answer

    assert asyncio.run(scenario()) == "done"
    assert runs == [None, None]


# runner::concurrent_deliveries_run_the_body_once (threads)
def test_concurrent_deliveries_in_threads_run_once(any_store: Any, name: str) -> None:
    threads, units = 16, 5
    runs: Dict[int, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(threads)

    @idempotent_task(key="k-{n}", name=name, store=any_store, initial_backoff=0.002)
    def job(n: int) -> List[int]:
        with lock:
            runs[n] = runs.get(n, 0) + 1
        time.sleep(0.01)  # the work itself, long enough for the others to find the unit busy
        return [n, threading.get_ident()]

    answers: List[List[Any]] = [[] for _ in range(threads)]

    def deliver(i: int) -> None:
        start.wait()
        order = list(range(units))
        random.Random(i).shuffle(order)
        answers[i] = sorted((job(n) for n in order), key=lambda answer: answer[0])

    workers = [threading.Thread(target=deliver, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert runs == {n: 1 for n in range(units)}
    assert all(answer == answers[0] for answer in answers)


def _deliver_units(url: str, name: str, units: int, seed: int, barrier: Any, results: Any) -> None:
    # A forked process of its own, which builds its store and task as a worker module does.
    counter = redis.Redis.from_url(url)

    @idempotent_task(key="k-{n}", name=name, store=idempotask.RedisStore(url), initial_backoff=0.002)
    def job(n: int) -> str:
        count = counter.incr(f"runs:{n}")
        time.sleep(0.005)  # the work itself
        return f"{os.getpid()}-{n}-{count}"

    order = list(range(units))
    random.Random(seed).shuffle(order)
    barrier.wait()
    results.put({n: job(n) for n in order})


# runner::concurrent_deliveries_run_the_body_once (processes; the in-memory store is per process)
def test_concurrent_deliveries_in_processes_run_once(redis_server: Any, redis_client: redis.Redis, name: str) -> None:
    context = multiprocessing.get_context("fork")
    processes, units = 4, 30
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=_deliver_units, args=(redis_server.url, name, units, seed, barrier, results))
        for seed in range(processes)
    ]
    for worker in workers:
        worker.start()
    answers = [results.get(timeout=120) for _ in range(processes)]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert [int(redis_client.get(f"runs:{n}")) for n in range(units)] == [1] * units
    assert all(answer == answers[0] for answer in answers)
    # Every process executed some of the units, or the run proved little.
    executors = {value.split("-")[0] for value in answers[0].values()}
    assert len(executors) > 1, answers[0]


# runner::a_waiter_gives_up_with_contended; Contended's lock_ttl_remaining is the holder's remaining time
def test_a_busy_unit_gives_up_with_busy(any_store: Any, name: str) -> None:
    holder = _Holder(any_store, name, "k-1", lock_ttl=30)

    @idempotent_task(key="k-{n}", name=name, store=any_store, on_busy="raise", lock_ttl=30)
    def job(n: int) -> str:
        raise AssertionError("a busy unit's body ran")

    with pytest.raises(Contended) as busy:
        job(1)
    assert busy.value.attempts == 1
    assert busy.value.lock_ttl_remaining is not None and 20 < busy.value.lock_ttl_remaining <= 30

    waiter = _native.Task(name, lock_ttl=30, max_attempts=3, initial_backoff=0.001).start(any_store, "k-1", None, True)
    with pytest.raises(Contended) as gave_up:
        waiter.wait()
    assert gave_up.value.attempts == 3
    assert 20 < gave_up.value.lock_ttl_remaining <= 30

    assert holder.finish('"held"')[:3] == ("done", '"held"', "executed")
    assert job(1) == "held"


# runner::the_body_sees_its_context; store::fencing_tokens_increase_across_grants_and_expiry
def test_the_body_sees_its_context_and_fencing_tokens_increase(any_store: Any, name: str) -> None:
    seen: List[Any] = []

    @idempotent_task(key="order:{{{n}}}", name=name, store=any_store, fencing=True)
    def fenced(n: int, fail: bool) -> Any:
        ctx = idempotask.context()
        seen.append((ctx.task, ctx.key, ctx.fencing_token, ctx.attempt))
        if fail:
            raise RuntimeError("again")
        return ctx.fencing_token

    assert idempotask.context() is None
    for _ in range(2):
        with pytest.raises(RuntimeError):
            fenced(11, True)
    token = fenced(11, False)
    assert fenced(11, True) == token  # a replay: the body does not run
    assert [s[:2] for s in seen] == [(name, "order:{11}")] * 3
    tokens = [s[2] for s in seen]
    assert all(isinstance(t, int) for t in tokens) and tokens == sorted(set(tokens)), tokens
    assert token == tokens[-1]
    assert idempotask.context() is None

    @idempotent_task(key="plain-{n}", name=name + "_plain", store=any_store)
    def plain(n: int) -> Any:
        return idempotask.context().fencing_token

    assert plain(1) is None, "a task without fencing gets no made-up token"


def _expired_holder(function: Any, started: threading.Event, release: threading.Event) -> threading.Thread:
    """A delivery of ``function(1, hold=…)`` whose body outlives its lock: it blocks until
    ``release`` is set, far past its lock TTL, without renewal."""
    thread = threading.Thread(target=function, args=(1,), kwargs={"hold": (started, release)})
    thread.start()
    assert started.wait(30)
    return thread


# doubt::a_lock_that_ran_out_is_taken_over_in_doubt; overruns::a_double_run_…_is_reported_as_lost;
# store::fencing_tokens_increase_across_grants_and_expiry
def test_an_expired_lock_is_taken_over_in_doubt(any_store: Any, name: str) -> None:
    seen: List[Any] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store, lock_ttl=1, fencing=True, max_wait=10)
    def charge(n: int, hold: Any = None) -> str:
        ctx = idempotask.context()
        seen.append((ctx.in_doubt, ctx.fencing_token))
        if hold is not None:
            hold[0].set()
            hold[1].wait(30)
            return "holder"
        return "taker"

    release = threading.Event()
    holder = _expired_holder(charge, threading.Event(), release)
    # The second delivery waits on the holder's lock until it runs out, then takes the unit
    # over and is told it is in doubt.
    assert charge(1) == "taker"
    release.set()
    holder.join()
    (free, holder_token), (in_doubt, taker_token) = seen
    assert free is None
    assert in_doubt is not None and in_doubt >= 0
    assert taker_token > holder_token
    # The taker's result is the one kept; the holder's late finish did not replace it.
    assert charge(1) == "taker"
    assert len(seen) == 2


# doubt::hold_keeps_every_delivery_of_a_unit_in_doubt_from_running; store::a_late_finish_keeps_…
def test_an_expired_lock_held_in_doubt_refuses_every_delivery(any_store: Any, name: str) -> None:
    runs: List[str] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store, lock_ttl=0.3, in_doubt="hold", max_wait=10)
    def send(n: int, hold: Any = None) -> str:
        if hold is not None:
            hold[0].set()
            hold[1].wait(30)
            runs.append("holder")
            return "holder"
        runs.append("other")
        return "other"

    release = threading.Event()
    holder = _expired_holder(send, threading.Event(), release)
    for _ in range(2):
        with pytest.raises(InDoubt) as doubt:
            send(1)
        assert doubt.value.expired_for >= 0
    # Nobody took it over: the holder's late result is still recorded, and replayed.
    release.set()
    holder.join()
    assert send(1) == "holder"
    assert runs == ["holder"]


# doubt::a_lock_that_ran_out_is_taken_over_in_doubt, with a worker killed (SIGKILL) mid-body;
# fencing tokens go past the dead holder's. (A memory store is the process's own.)
def test_a_killed_holders_unit_is_taken_over_with_a_greater_token(store: Any, name: str) -> None:
    seen: List[Any] = []

    @idempotent_task(key="k-{n}", name=name, lock_ttl=1, fencing=True, max_wait=10)
    def charge(n: int, fd: Any = None) -> str:
        ctx = idempotask.context()
        if fd is not None:
            os.write(fd, str(ctx.fencing_token).encode() + b"\n")
            threading.Event().wait(60)
        seen.append((ctx.in_doubt, ctx.fencing_token))
        return "charged"

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            charge(1, write)
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read) as child:
        dead_token = int(child.readline())
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert charge(1) == "charged"
    ((in_doubt, token),) = seen
    assert in_doubt is not None and token > dead_token


# runner::renewal_keeps_a_short_lock_through_a_long_body (the body blocks in Python; the
# renewal runs on the runtime)
def test_renewal_keeps_a_short_lock_through_a_long_python_body(any_store: Any, name: str) -> None:
    halfway, resume = threading.Event(), threading.Event()

    @idempotent_task(key="k-{n}", name=name, store=any_store, lock_ttl=0.3, renew=True)
    def long_job(n: int) -> str:
        time.sleep(0.9)  # the work itself: three lock TTLs, with the thread blocked
        halfway.set()
        resume.wait(30)
        return "kept"

    holder = threading.Thread(target=long_job, args=(1,))
    holder.start()
    assert halfway.wait(30)
    intruder = _native.Task(name, lock_ttl=0.3).start(any_store, "k-1", None, False)
    with pytest.raises(Contended):
        intruder.wait()
    resume.set()
    holder.join()
    assert long_job(1) == "kept"


# refusals::a_reused_key_with_other_arguments_is_rejected
@pytest.mark.parametrize("fingerprint", [["amount", "currency"], True], ids=["listed", "all"])
def test_a_reused_key_with_other_arguments_is_refused(any_store: Any, name: str, fingerprint: Any) -> None:
    runs: List[int] = []

    @idempotent_task(key="order-{order_id}", name=name, store=any_store, fingerprint=fingerprint)
    def charge(order_id: int, amount: int, currency: str) -> str:
        runs.append(amount)
        return f"ch_{amount}_{currency}"

    assert charge(1, 100, "EUR") == "ch_100_EUR"
    for amount, currency in [(200, "EUR"), (100, "USD")]:
        with pytest.raises(KeyReuse):
            charge(1, amount, currency)
    # The refusal left the stored result alone, and the same arguments still replay it.
    assert charge(1, 100, "EUR") == "ch_100_EUR"
    assert runs == [100]


# refusals::invalid_keys_are_rejected_before_the_store
def test_invalid_keys_are_refused_before_the_store(any_store: Any, name: str) -> None:
    runs: List[str] = []

    @idempotent_task(key="{ref}", name=name, store=any_store)
    def job(ref: str) -> str:
        runs.append(ref)
        return ref

    for key in ["", "x" * 1025]:
        with pytest.raises(IdempotaskError, match="key") as refused:
            job(key)
        assert type(refused.value) is IdempotaskError
    assert job("x" * 1024) == "x" * 1024
    assert runs == ["x" * 1024]


# store::markers_expire_after_the_result_ttl
def test_a_result_runs_again_once_its_result_ttl_passed(any_store: Any, name: str) -> None:
    runs: List[int] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store, lock_ttl=0.1, result_ttl=0.3)
    def job(n: int) -> int:
        runs.append(n)
        return len(runs)

    assert job(1) == 1
    assert job(1) == 1
    time.sleep(0.6)  # the result's TTL passing is what is checked; nothing signals it
    assert job(1) == 2
    assert job(1) == 2
    assert runs == [1, 1]
