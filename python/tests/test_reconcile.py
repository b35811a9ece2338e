"""``reconcile=``: a unit in doubt (a worker killed between its side effect and its result) is
first reconciled with the downstream system, on a real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, List

import pytest
import redis

import idempotask
from idempotask import Reconciled, TaskContext, idempotent_task


def _killed_mid_body(deliver: Callable[[int], Any]) -> None:
    """Runs ``deliver(write_fd)`` in a forked child and kills the child (SIGKILL) once its body
    wrote to the pipe: a worker killed after its side effect and before its result, whose
    lock then runs out with the unit in doubt."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            deliver(write)
        finally:
            os._exit(1)
    os.close(write)
    assert os.read(read, 1) == b"x", "the child's body started"
    os.close(read)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _killed_worker(signal_fd: Any) -> None:
    """The killed worker's body: its side effect, then a gateway call that never returns."""
    os.write(signal_fd, b"x")
    threading.Event().wait(60)


def test_reconciled_done_stores_the_value_and_the_body_does_not_run(store: Any, name: str) -> None:
    ran: List[int] = []
    asked: List[TaskContext] = []

    def charge_known_to_provider(ctx: TaskContext) -> Reconciled[Any]:
        asked.append(ctx)
        return Reconciled.done({"charge": f"ch_{ctx.key}", "amount": 2**70})

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=charge_known_to_provider)
    def charge(n: int, signal_fd: Any = None) -> Any:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(n)
        return {"charge": "a second charge"}

    _killed_mid_body(lambda fd: charge(1, fd))
    expected = {"charge": "ch_charge-1", "amount": 2**70}
    assert charge(1) == expected
    (ctx,) = asked
    assert (ctx.task, ctx.key) == (name, "charge-1")
    assert ctx.attempt >= 1  # counts the lock requests, the waits on the dead worker's lock too
    assert ctx.in_doubt is not None and ctx.in_doubt >= 0
    # Stored as the body's result would be: replayed, neither function runs again.
    assert charge(1) == expected
    assert ran == [] and len(asked) == 1


def test_reconciled_done_is_the_marker_a_rust_worker_reads(store: Any, name: str, redis_client: redis.Redis) -> None:
    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10,
                     reconcile=lambda ctx: Reconciled.done("ch_found"))
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        return "ch_again"

    _killed_mid_body(lambda fd: charge(1, fd))
    assert charge(1) == "ch_found"
    # The marker holds the reconciled result as a body's would be (a Rust worker replays it).
    markers = [redis_client.get(k) for k in redis_client.keys(f"idempotask:v2:default:{name}:*")]
    assert [m for m in markers if m is not None and m.endswith(b'|"ch_found"')], markers


@dataclass
class Charge:
    id: str
    amount_cents: int


def test_a_reconciled_dataclass_replays_as_its_type_and_only_replays_call_the_hook(store: Any, name: str) -> None:
    # #55: the reconcile function's answer goes through the task's result serializer, as the
    # body's would; its call is no replay, so `on_replay` waits for the next duplicate.
    replays: List[Any] = []

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10,
                     reconcile=lambda ctx: Reconciled.done(Charge("ch_found", 1200)),
                     on_replay=lambda value, record: replays.append(value))
    def charge(n: int, signal_fd: Any = None) -> Charge:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        return Charge("ch_again", 1200)

    _killed_mid_body(lambda fd: charge(1, fd))
    assert charge(1) == Charge("ch_found", 1200)
    assert replays == []
    again = charge(1)
    assert type(again) is Charge and again == Charge("ch_found", 1200)
    assert replays == [again]


def test_not_done_runs_the_body_once(store: Any, name: str) -> None:
    ran: List[Any] = []
    asked: List[Any] = []

    def not_known(ctx: TaskContext) -> Reconciled[str]:
        asked.append(ctx.in_doubt)
        return Reconciled.NOT_DONE

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=not_known)
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(idempotask.context().in_doubt)
        return f"ch_{n}"

    _killed_mid_body(lambda fd: charge(1, fd))
    assert charge(1) == "ch_1"
    assert charge(1) == "ch_1"
    assert len(asked) == 1 and asked[0] is not None
    # The body that runs after NOT_DONE is still told the unit was in doubt.
    assert len(ran) == 1 and ran[0] is not None


def test_a_raising_reconcile_propagates_and_leaves_the_unit_in_doubt(store: Any, name: str) -> None:
    ran: List[Any] = []
    asked: List[Any] = []
    failure = ConnectionError("the provider is down")
    answers: List[Any] = [failure, Reconciled.NOT_DONE]

    def provider_lookup(ctx: TaskContext) -> Reconciled[str]:
        asked.append(ctx.in_doubt)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=provider_lookup)
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(idempotask.context().in_doubt)
        return "ch"

    _killed_mid_body(lambda fd: charge(1, fd))
    with pytest.raises(ConnectionError) as raised:
        charge(1)
    assert raised.value is failure  # unchanged, the same object
    assert ran == [] and len(asked) == 1
    # Nothing was cached: the next delivery is told the unit is in doubt and reconciles again.
    assert charge(1) == "ch"
    assert len(asked) == 2 and all(doubt is not None for doubt in asked)
    assert len(ran) == 1 and ran[0] is not None


def test_a_reconcile_that_returns_no_answer_is_a_type_error_and_leaves_the_unit_in_doubt(
    store: Any, name: str
) -> None:
    answers: List[Any] = ["done", Reconciled.done("ch_found")]

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=lambda ctx: answers.pop(0))
    def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        return "ch_again"

    _killed_mid_body(lambda fd: charge(1, fd))
    with pytest.raises(TypeError, match="returned str, not Reconciled"):
        charge(1)
    assert charge(1) == "ch_found"
    assert answers == []


def test_a_free_unit_never_calls_reconcile(store: Any, name: str) -> None:
    asked: List[Any] = []

    def lookup(ctx: TaskContext) -> Reconciled[str]:
        asked.append(ctx)
        return Reconciled.done("from reconcile")

    @idempotent_task(key="charge-{n}", name=name, reconcile=lookup)
    def charge(n: int) -> str:
        return f"ch_{n}"

    assert charge(1) == "ch_1"
    assert charge(1) == "ch_1"
    assert charge(2) == "ch_2"
    assert asked == []


def test_a_released_unit_after_an_exception_never_calls_reconcile(store: Any, name: str) -> None:
    asked: List[Any] = []
    runs: List[int] = []

    @idempotent_task(key="charge-{n}", name=name, reconcile=lambda ctx: asked.append(ctx) or Reconciled.NOT_DONE)
    def charge(n: int) -> str:
        runs.append(n)
        if len(runs) == 1:
            raise ValueError("declined")
        return "ch"

    with pytest.raises(ValueError):
        charge(1)
    assert charge(1) == "ch"
    assert asked == [] and runs == [1, 1]


def _async_killed_worker(charge: Any) -> Callable[[int], Any]:
    return lambda fd: asyncio.run(charge(1, fd))


def test_async_reconciled_done(store: Any, name: str) -> None:
    ran: List[int] = []
    asked: List[Any] = []

    async def lookup(ctx: TaskContext) -> Reconciled[str]:
        await asyncio.sleep(0)
        asked.append(ctx.in_doubt)
        return Reconciled.done(f"ch_{ctx.key}")

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=lookup)
    async def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(n)
        return "ch_again"

    _killed_mid_body(_async_killed_worker(charge))
    assert asyncio.run(charge(1)) == "ch_charge-1"
    assert asyncio.run(charge(1)) == "ch_charge-1"
    assert ran == [] and len(asked) == 1 and asked[0] is not None


def test_async_reconcile_raising_then_not_done(store: Any, name: str) -> None:
    ran: List[int] = []
    failure = TimeoutError("the provider timed out")
    answers: List[Any] = [failure, Reconciled.NOT_DONE]

    async def lookup(ctx: TaskContext) -> Reconciled[str]:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=lookup)
    async def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(n)
        return "ch"

    _killed_mid_body(_async_killed_worker(charge))
    with pytest.raises(TimeoutError) as raised:
        asyncio.run(charge(1))
    assert raised.value is failure
    assert ran == []
    assert asyncio.run(charge(1)) == "ch"
    assert asyncio.run(charge(1)) == "ch"
    assert ran == [1] and answers == []


def test_a_call_cancelled_while_it_reconciles_leaves_the_unit_in_doubt(store: Any, name: str) -> None:
    ran: List[Any] = []
    asked: List[Any] = []
    reached: List[asyncio.Event] = []

    async def lookup(ctx: TaskContext) -> Reconciled[str]:
        asked.append(ctx.in_doubt)
        if len(asked) == 1:
            reached[0].set()
            await asyncio.Event().wait()  # a provider that never answers
        return Reconciled.NOT_DONE

    @idempotent_task(key="charge-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=lookup)
    async def charge(n: int, signal_fd: Any = None) -> str:
        if signal_fd is not None:
            _killed_worker(signal_fd)
        ran.append(idempotask.context().in_doubt)
        return "ch"

    async def cancelled_once_asked() -> None:
        reached.append(asyncio.Event())
        call = asyncio.ensure_future(charge(1))
        await reached[0].wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    _killed_mid_body(_async_killed_worker(charge))
    asyncio.run(cancelled_once_asked())
    assert ran == []
    # The cancelled call stored nothing: the next delivery finds the unit still in doubt.
    assert asyncio.run(charge(1)) == "ch"
    assert len(asked) == 2 and asked[1] is not None
    assert len(ran) == 1 and ran[0] is not None


# Checked when the decorator is applied.


def _body(n: int) -> str:
    return "ch"


async def _async_body(n: int) -> str:
    return "ch"


def test_reconcile_with_in_doubt_hold_is_a_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="in_doubt=\"hold\" never runs"):
        idempotent_task(key="charge-{n}", name=name, in_doubt="hold", reconcile=lambda ctx: Reconciled.NOT_DONE)(_body)


@pytest.mark.parametrize("reconcile", ["lookup", 1, Reconciled.NOT_DONE])
def test_a_reconcile_that_is_not_callable_is_a_type_error(name: str, reconcile: Any) -> None:
    with pytest.raises(TypeError, match="reconcile must be a function"):
        idempotent_task(key="charge-{n}", name=name, reconcile=reconcile)(_body)


def test_reconcile_must_match_the_task_plain_or_async(name: str) -> None:
    async def async_lookup(ctx: TaskContext) -> Reconciled[str]:
        return Reconciled.NOT_DONE

    with pytest.raises(TypeError, match="must be a plain function"):
        idempotent_task(key="charge-{n}", name=name, reconcile=async_lookup)(_body)
    with pytest.raises(TypeError, match="must be an `async def` function"):
        idempotent_task(key="charge-{n}", name=name + "_async", reconcile=lambda ctx: Reconciled.NOT_DONE)(_async_body)


def test_the_reconciled_values() -> None:
    done = Reconciled.done({"charge": "ch_1"})
    assert done.is_done and done.value == {"charge": "ch_1"}
    assert done == Reconciled.done({"charge": "ch_1"}) and done != Reconciled.done("other")
    assert repr(done) == "Reconciled.done({'charge': 'ch_1'})"
    assert Reconciled.done(None).is_done and Reconciled.done(None).value is None
    assert not Reconciled.NOT_DONE.is_done and Reconciled.NOT_DONE != Reconciled.done(None)
    assert repr(Reconciled.NOT_DONE) == "Reconciled.NOT_DONE"
    with pytest.raises(ValueError):
        Reconciled.NOT_DONE.value
    with pytest.raises(TypeError):
        Reconciled("ch")
    with pytest.raises(AttributeError):
        done._value = "changed"  # type: ignore[misc]
