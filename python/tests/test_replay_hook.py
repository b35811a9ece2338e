"""The replay hook (#55): ``on_replay=`` is called with the replayed value and the unit's
``UnitRecord`` on replays only, once per duplicate; an exception in it is logged and the
duplicate still gets its value."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, List, Tuple

import pytest

from idempotask import CodecError, MemoryStore, Outcome, UnitRecord, idempotent_task


@dataclass
class Charge:
    id: str
    amount_cents: int


def test_the_hook_runs_once_per_duplicate_and_never_on_a_fresh_run(any_store: Any, name: str) -> None:
    replays: List[Tuple[Any, UnitRecord]] = []

    @idempotent_task(
        key="order-{order_id}", name=name, store=any_store, fencing=True,
        on_replay=lambda value, record: replays.append((value, record)),
    )
    def charge(order_id: int) -> Charge:
        return Charge(f"ch_{order_id}", 1200)

    first = charge.run_reported(1)
    assert first.outcome == Outcome.EXECUTED and replays == []
    charge(2)
    assert replays == []
    again = charge(1)
    assert replays == [(again, UnitRecord(name, "order-1", first.fencing_token))]
    assert type(replays[0][0]) is Charge  # the value as the duplicate gets it
    assert charge.run_reported(1).outcome == Outcome.REPLAYED
    assert len(replays) == 2
    assert first.fencing_token is not None


def test_a_hook_that_raises_is_logged_and_the_duplicate_gets_its_value(
    any_store: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: List[str] = []

    def broken(value: Any, record: UnitRecord) -> None:
        calls.append(value)
        raise RuntimeError("the metrics backend is down")

    @idempotent_task(key="order-{order_id}", name=name, store=any_store, on_replay=broken)
    def charge(order_id: int) -> str:
        return f"ch_{order_id}"

    charge(1)
    caplog.set_level(logging.WARNING, logger="idempotask")
    assert charge(1) == "ch_1"
    assert calls == ["ch_1"]
    (record,) = [r for r in caplog.records if "on_replay" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.name == "idempotask"
    assert record.exc_info is not None and "metrics backend" in str(record.exc_info[1])
    # The next duplicate calls it again: it is not switched off.
    assert charge(1) == "ch_1"
    assert len(calls) == 2


def test_a_hook_interrupt_is_the_callers(name: str) -> None:
    def interrupted(value: Any, record: UnitRecord) -> None:
        raise KeyboardInterrupt

    @idempotent_task(key="order-{order_id}", name=name, store=MemoryStore(), on_replay=interrupted)
    def charge(order_id: int) -> str:
        return "ch"

    charge(1)
    with pytest.raises(KeyboardInterrupt):
        charge(1)
    # The unit is done all the same.
    assert charge.run_reported(2).outcome == Outcome.EXECUTED


def test_an_async_task_awaits_an_async_hook(any_store: Any, name: str) -> None:
    replays: List[str] = []

    async def on_replay(value: str, record: UnitRecord) -> None:
        await asyncio.sleep(0)
        replays.append(f"{record.key}={value}")

    @idempotent_task(key="order-{order_id}", name=name, store=any_store, on_replay=on_replay)
    async def charge(order_id: int) -> str:
        return f"ch_{order_id}"

    async def scenario() -> None:
        await charge(1)
        assert replays == []
        await charge(1)

    asyncio.run(scenario())
    assert replays == ["order-1=ch_1"]


def test_no_hook_for_a_replay_that_has_no_value(name: str) -> None:
    replays: List[Any] = []

    @idempotent_task(key="order-{order_id}", name=name, store=MemoryStore(), on_replay=lambda *a: replays.append(a))
    def charge(order_id: int) -> Any:
        return {1, 2}  # no JSON form: duplicates get a CodecError

    charge(1)
    with pytest.raises(CodecError):
        charge(1)
    assert replays == []


def test_a_hook_that_cannot_work_is_refused_when_decorated(name: str) -> None:
    async def later(value: Any, record: UnitRecord) -> None:
        pass

    with pytest.raises(TypeError, match="on_replay is an `async def` function, but the task is not"):

        @idempotent_task(key="order-{order_id}", name=name, on_replay=later)
        def charge(order_id: int) -> str:
            return "ch"

    with pytest.raises(TypeError, match="on_replay must be a function"):

        @idempotent_task(key="order-{order_id}", name=name, on_replay="log")  # type: ignore[arg-type]
        def charge_again(order_id: int) -> str:
            return "ch"
