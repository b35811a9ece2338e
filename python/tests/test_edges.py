"""The edges where a Python caller differs from a Rust one: a caller that stops waiting, values
that have no JSON text or no stable key text, and functions whose call is not their work."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from typing import Any, Iterator, List

import pytest

import idempotask
from idempotask import CodecError, idempotent_task


def test_a_cancelled_waiter_leaves_no_lock_behind(store: Any, name: str) -> None:
    """A delivery cancelled while it waits on a busy unit must stop asking for the lock: else,
    once the holder fails and releases, it takes the lock for a body nobody runs, and the next
    delivery waits until that lock runs out and takes the unit over in doubt."""
    ran: List[str] = []

    async def scenario() -> str:
        holding = asyncio.Event()
        give_up = asyncio.Event()

        # The first delivery holds the unit until told, then fails; later ones charge, and say
        # whether they took the unit over from a lock that ran out.
        @idempotent_task(key="order-{order_id}", name=name, lock_ttl=5, max_wait=30, initial_backoff=0.005, max_backoff=0.01)
        async def charge(order_id: int) -> str:
            if not holding.is_set():
                holding.set()
                await give_up.wait()
                raise RuntimeError("the gateway refused")
            ran.append(f"charged, in doubt: {idempotask.context().in_doubt is not None}")
            return "charged"

        first = asyncio.ensure_future(charge(1))
        await holding.wait()
        waiter = asyncio.ensure_future(charge(1))
        # Not a synchronisation (the assertion holds however far the waiter got): time for its
        # call to find the unit busy and wait, the case that left a lock behind.
        await asyncio.sleep(0.05)
        waiter.cancel()
        # Kept, as a logged or re-raised exception is: its traceback holds the cancelled
        # call's frames, and the call with them, so nothing is freed by its going away.
        with pytest.raises(asyncio.CancelledError) as cancelled:
            await waiter
        give_up.set()
        with pytest.raises(RuntimeError):
            await first
        # Time for a call left asking (every 10 ms at most) to take the lock first, if it can.
        await asyncio.sleep(0.1)
        charged = await charge(1)
        assert cancelled.value.__traceback__ is not None
        return charged

    assert asyncio.run(scenario()) == "charged"
    # Not after a lock that ran out: the cancelled delivery's call never held the unit.
    assert ran == ["charged, in doubt: False"]


def test_a_result_whose_text_is_no_utf8_is_recorded_not_run_again(store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="payload-{n}", name=name)
    def relay(n: int) -> Any:
        ran.append(n)
        # What `json.loads` makes of a payload with a broken escape: a lone surrogate.
        return json.loads('"\\ud800"')

    assert relay(1) == "\ud800"
    with pytest.raises(CodecError):
        relay(1)
    assert ran == [1]


def test_floats_json_cannot_carry_are_null_as_in_rust(store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="reading-{n}", name=name)
    def measure(n: int) -> Any:
        ran.append(n)
        return [float("nan"), float("inf"), 1.5e-5]

    first = measure(1)
    assert first[2] == 1.5e-5
    assert measure(1) == [None, None, 1.5e-5]
    assert ran == [1]


def test_a_generator_function_is_refused_when_decorated(name: str) -> None:
    with pytest.raises(TypeError, match="generator function"):

        @idempotent_task(key="batch-{n}", name=name)
        def batch(n: int) -> Iterator[int]:
            yield n


def test_a_plain_function_returning_a_coroutine_is_refused_and_not_recorded(store: Any, name: str) -> None:
    calls: List[int] = []

    async def work(n: int) -> int:  # pragma: no cover - refused, never awaited
        return n

    @idempotent_task(key="job-{n}", name=name)
    def job(n: int) -> Any:
        calls.append(n)
        return work(n)

    for _ in range(2):
        with pytest.raises(TypeError, match="returned an awaitable"):
            job(1)
    # Refused, not recorded: the second delivery ran the body again.
    assert calls == [1, 1]


class _Order:
    def __init__(self, order_id: int) -> None:
        self.id = order_id


def test_a_key_of_an_object_without_text_is_refused(store: Any, name: str) -> None:
    @idempotent_task(key="order-{order}", name=name)
    def ship(order: Any) -> str:
        return "shipped"

    with pytest.raises(TypeError, match="no stable text"):
        ship(_Order(7))
    with pytest.raises(TypeError, match="no stable text"):
        ship(b"7")


def test_a_key_of_a_field_of_an_object_is_its_text(store: Any, name: str) -> None:
    @idempotent_task(key="order-{order.id}", name=name)
    def ship(order: Any) -> str:
        return "shipped"

    assert ship.idempotask_unit(_Order(7)) == ("order-7", None)


class _SoftTimeLimit(Exception):
    """What Celery's soft time limit raises, from a signal handler, into the running task."""


def test_a_waiter_interrupted_by_a_signal_leaves_no_lock_behind(store: Any, name: str) -> None:
    """Ctrl-C or Celery's soft time limit while a delivery waits on a busy unit: the exception
    (kept, as a logged one is, with the call in its traceback's frames) must not leave the call
    asking for the lock, to take it, once the holder fails, for a body nobody runs."""
    holding = threading.Event()
    give_up = threading.Event()
    ran: List[str] = []

    @idempotent_task(key="order-{order_id}", name=name, lock_ttl=5, max_wait=30, initial_backoff=0.005, max_backoff=0.01)
    def charge(order_id: int) -> str:
        if not holding.is_set():
            holding.set()
            give_up.wait()
            raise RuntimeError("the gateway refused")
        ran.append(f"charged, in doubt: {idempotask.context().in_doubt is not None}")
        return "charged"

    def holder() -> None:
        with pytest.raises(RuntimeError):
            charge(1)

    first = threading.Thread(target=holder)
    first.start()
    holding.wait()

    def soft_time_limit(signum: int, frame: Any) -> None:
        raise _SoftTimeLimit()

    previous = signal.signal(signal.SIGALRM, soft_time_limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_SoftTimeLimit) as interrupted:
            charge(1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    give_up.set()
    first.join()
    # Time for a call left asking (every 10 ms at most) to take the lock first, if it can.
    time.sleep(0.1)
    assert charge(1) == "charged"
    assert ran == ["charged, in doubt: False"]
    assert interrupted.value.__traceback__ is not None
