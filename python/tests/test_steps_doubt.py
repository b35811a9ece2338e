"""The step in doubt, from Python: a worker killed (SIGKILL, a forked child) inside a step's
function leaves that step's effect unrecorded; the delivery that takes the unit over replays the
steps before it, and the killed step is the one in doubt: ``step`` runs it again,
``step_or_hold`` raises ``InDoubt`` and leaves the unit held, ``step_or_reconcile`` asks the
reconcile function first. Effects go to a Redis list, which the kill cannot take back."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional

import pytest
import redis

import idempotask
from idempotask import InDoubt, Reconciled, idempotent_task
from test_reconcile import _killed_mid_body, _killed_worker


def _stop_here(signal_fd: Optional[int]) -> None:
    """The killed worker's kill point, in the delivery that has one."""
    if signal_fd is not None:
        _killed_worker(signal_fd)


def _effects(client: redis.Redis) -> List[str]:
    return [item.decode() for item in client.lrange("effects", 0, -1)]


def test_step_runs_the_step_in_doubt_again(store: Any, name: str, redis_client: redis.Redis) -> None:
    @idempotent_task(key="order-{n}", name=name, lock_ttl=1, max_wait=10)
    def checkout(n: int, signal_fd: Optional[int] = None) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        charge = ctx.step("charge", lambda: redis_client.rpush("effects", "charge") and f"ch_{n}")

        def mail() -> str:
            redis_client.rpush("effects", "mail")
            _stop_here(signal_fd)
            return "mailed"

        return ctx.step("mail", mail) + " " + charge

    _killed_mid_body(lambda fd: checkout(1, fd))
    assert checkout(1) == "mailed ch_1"
    # The default policy reruns the step in doubt: the mail went out twice, the charge once.
    assert _effects(redis_client) == ["charge", "mail", "mail"]


def test_step_or_hold_refuses_the_step_in_doubt_and_keeps_the_unit_held(
        store: Any, name: str, redis_client: redis.Redis) -> None:
    @idempotent_task(key="order-{n}", name=name, lock_ttl=1, max_wait=10)
    def checkout(n: int, signal_fd: Optional[int] = None) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        ctx.step("charge", lambda: redis_client.rpush("effects", "charge"))

        def mail() -> str:
            redis_client.rpush("effects", "mail")
            _stop_here(signal_fd)
            return "mailed"

        return ctx.step_or_hold("mail", mail)

    _killed_mid_body(lambda fd: checkout(1, fd))
    with pytest.raises(InDoubt) as held:
        checkout(1)
    assert held.value.expired_for >= 0
    # Held for an operator: every later delivery is refused the same way, and runs nothing.
    with pytest.raises(InDoubt):
        checkout(1)
    assert _effects(redis_client) == ["charge", "mail"]


@pytest.mark.parametrize("mailed", [True, False], ids=["found", "not-found"])
def test_step_or_reconcile_asks_before_running_the_step_in_doubt(
        store: Any, name: str, redis_client: redis.Redis, mailed: bool) -> None:
    asked: List[str] = []

    def mail_known_to_provider(step: str) -> Callable[[], Reconciled[str]]:
        def reconcile() -> Reconciled[str]:
            asked.append(step)
            return Reconciled.done("found") if step in _effects(redis_client) else Reconciled.NOT_DONE
        return reconcile

    @idempotent_task(key="order-{n}", name=name, lock_ttl=1, max_wait=10)
    def checkout(n: int, signal_fd: Optional[int] = None) -> List[Any]:
        ctx = idempotask.context()
        assert ctx is not None
        charge = ctx.step_or_reconcile("charge", mail_known_to_provider("charge"),
                                       lambda: redis_client.rpush("effects", "charge") and "charged")

        def mail() -> str:
            if mailed or signal_fd is None:
                redis_client.rpush("effects", "mail")
            _stop_here(signal_fd)
            return "mailed"

        sent = ctx.step_or_reconcile("mail", mail_known_to_provider("mail"), mail)
        receipt = ctx.step_or_reconcile("receipt", mail_known_to_provider("receipt"),
                                        lambda: redis_client.rpush("effects", "receipt") and "receipt")
        return [charge, sent, receipt]

    _killed_mid_body(lambda fd: checkout(1, fd))
    expected = ["charged", "found" if mailed else "mailed", "receipt"]
    assert checkout(1) == expected
    # Only the step in doubt asked; the reconciled value is recorded as the step's, so the
    # replay returns it too.
    assert asked == ["mail"]
    assert checkout(1) == expected
    assert _effects(redis_client) == ["charge", "mail", "receipt"]


def test_step_or_reconcile_async_awaits_both_functions(store: Any, name: str, redis_client: redis.Redis) -> None:
    asked: List[str] = []

    async def found() -> Reconciled[str]:
        await asyncio.sleep(0)
        asked.append("mail")
        return Reconciled.done("found") if "mail" in _effects(redis_client) else Reconciled.NOT_DONE

    @idempotent_task(key="order-{n}", name=name, lock_ttl=1, max_wait=10)
    async def checkout(n: int, signal_fd: Optional[int] = None) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        await ctx.step_async("charge", lambda: redis_client.rpush("effects", "charge"))

        async def mail() -> str:
            redis_client.rpush("effects", "mail")
            _stop_here(signal_fd)
            return "mailed"

        return await ctx.step_or_reconcile_async("mail", found, mail)

    _killed_mid_body(lambda fd: asyncio.run(checkout(1, fd)))
    assert asyncio.run(checkout(1)) == "found"
    assert asked == ["mail"]
    assert _effects(redis_client) == ["charge", "mail"]


def test_a_tasks_reconcile_function_runs_no_step(store: Any, name: str, redis_client: redis.Redis) -> None:
    refused: List[BaseException] = []

    def reconcile(ctx: idempotask.TaskContext) -> Reconciled[str]:
        # The body's steps are the body's: the task's reconcile function runs before it.
        try:
            ctx.step("lookup", lambda: "found")
        except RuntimeError as err:
            refused.append(err)
        return Reconciled.NOT_DONE

    @idempotent_task(key="order-{n}", name=name, lock_ttl=1, max_wait=10, reconcile=reconcile)
    def checkout(n: int, signal_fd: Optional[int] = None) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        return ctx.step("charge", lambda: _stop_here(signal_fd) or "charged")

    _killed_mid_body(lambda fd: checkout(1, fd))
    assert checkout(1) == "charged"
    (err,) = refused
    assert "inside its task's body" in str(err)
