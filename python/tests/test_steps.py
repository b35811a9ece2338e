"""Steps of a Python body (``idempotask.context().step(...)``), through the Rust core's
``TaskContext::step``: a rerun replays the recorded steps without running them and runs the
rest once, plain and ``async def``, on a ``MemoryStore`` and on Redis; values through the task's
codec; what the core refuses, as typed exceptions."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, List, Tuple

import pytest

import idempotask
from idempotask import CodecError, LockNotHeld, Serializer, StepError, idempotent_task


class Boom(Exception):
    """The body's failure after some of its steps."""


def test_a_rerun_replays_the_recorded_steps_and_runs_the_rest_once(any_store: Any, name: str) -> None:
    effects: List[str] = []
    fail_after_ledger = [True]

    @idempotent_task(key="order-{n}", name=name, store=any_store)
    def checkout(n: int) -> List[Any]:
        ctx = idempotask.context()
        assert ctx is not None
        charge = ctx.step("charge", lambda: effects.append("charge") or {"id": f"ch_{n}", "cents": 2**70})
        ledger = ctx.step("ledger", lambda: effects.append("ledger") or [n, charge["id"]])
        if fail_after_ledger[0]:
            raise Boom("the mailer is down")
        receipt = ctx.step("receipt", lambda: effects.append("receipt") or f"receipt for {charge['id']}")
        return [charge, ledger, receipt]

    with pytest.raises(Boom):
        checkout(7)
    assert effects == ["charge", "ledger"]
    fail_after_ledger[0] = False
    expected = [{"id": "ch_7", "cents": 2**70}, [7, "ch_7"], "receipt for ch_7"]
    # The rerun gets the charge and the ledger row back as recorded, and runs the receipt once.
    assert checkout(7) == expected
    assert effects == ["charge", "ledger", "receipt"]
    # Then the unit is done: replayed whole, no step runs.
    assert checkout(7) == expected
    assert effects == ["charge", "ledger", "receipt"]


def test_an_async_rerun_replays_the_recorded_steps_and_runs_the_rest_once(any_store: Any, name: str) -> None:
    effects: List[str] = []
    fail_after_charge = [True]

    @idempotent_task(key="order-{n}", name=name, store=any_store)
    async def checkout(n: int) -> List[Any]:
        ctx = idempotask.context()
        assert ctx is not None

        async def charge() -> str:
            await asyncio.sleep(0)
            effects.append("charge")
            return f"ch_{n}"

        charge_id = await ctx.step_async("charge", charge)
        if fail_after_charge[0]:
            raise Boom("the ledger is down")
        # A plain function is a step of an `async def` body too.
        row = await ctx.step_async("ledger", lambda: effects.append("ledger") or {"order": n, "charge": charge_id})
        return [charge_id, row]

    with pytest.raises(Boom):
        asyncio.run(checkout(3))
    fail_after_charge[0] = False
    assert asyncio.run(checkout(3)) == ["ch_3", {"order": 3, "charge": "ch_3"}]
    assert asyncio.run(checkout(3)) == ["ch_3", {"order": 3, "charge": "ch_3"}]
    assert effects == ["charge", "ledger"]


def test_a_step_per_item_is_named_with_a_key_part(any_store: Any, name: str) -> None:
    sent: List[str] = []
    down = {"bob@example.com"}

    def send(recipient: str) -> str:
        if recipient in down:
            raise ConnectionError(f"no route to {recipient}")
        sent.append(recipient)
        return f"sent to {recipient}"

    @idempotent_task(key="newsletter-{n}", name=name, store=any_store)
    def newsletter(n: int, recipients: Tuple[str, ...]) -> List[str]:
        ctx = idempotask.context()
        assert ctx is not None
        return [ctx.step(("mail", recipient), lambda: send(recipient)) for recipient in recipients]

    recipients = ("ada@example.com", "bob@example.com", "cy@example.com")
    with pytest.raises(ConnectionError):
        newsletter(1, recipients)
    down.clear()
    assert newsletter(1, recipients) == [f"sent to {r}" for r in recipients]
    # Ada's mail was recorded before Bob's failed: replayed, not sent again.
    assert sent == list(recipients)


def test_an_exception_in_a_step_records_nothing_and_propagates(any_store: Any, name: str) -> None:
    calls: List[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("the provider did not answer")
        return "ok"

    @idempotent_task(key="k-{n}", name=name, store=any_store)
    def body(n: int) -> Tuple[str, str]:
        ctx = idempotask.context()
        assert ctx is not None
        try:
            first = ctx.step("call", flaky)
        except TimeoutError:
            # Caught in the body: nothing was recorded, so the same step runs again, at once.
            first = ctx.step("call", flaky)
        return first, ctx.step("after", lambda: "after")

    assert body(1) == ("ok", "after")
    assert len(calls) == 2


@dataclass
class Charge:
    id: str
    amount_cents: int


def test_step_values_go_through_the_codec_of_their_annotation(any_store: Any, name: str) -> None:
    ran: List[str] = []
    fail = [True]

    def charge() -> Charge:
        ran.append("charge")
        return Charge("ch_1", 1200)

    @idempotent_task(key="k-{n}", name=name, store=any_store)
    def body(n: int) -> Any:
        ctx = idempotask.context()
        assert ctx is not None
        charged = ctx.step("charge", charge)
        pair = ctx.step("pair", lambda: ran.append("pair") or (1, "a"))
        money = ctx.step("money", lambda: ran.append("money") or Charge("ch_2", 5),
                         serializer=Serializer(dump=lambda c: [c.id, c.amount_cents], load=lambda v: Charge(*v)))
        if fail[0]:
            raise Boom("after the steps")
        return [charged, pair, money]

    with pytest.raises(Boom):
        body(1)
    fail[0] = False
    charged, pair, money = body(1)
    assert ran == ["charge", "pair", "money"]
    # The annotation rebuilds the dataclass; a lambda has none, so its tuple comes back as
    # `json.loads` makes it; `serializer=` is the decorator's `result_serializer` for a step.
    assert type(charged) is Charge and charged == Charge("ch_1", 1200)
    assert pair == [1, "a"]
    assert type(money) is Charge and money == Charge("ch_2", 5)


def test_a_recorded_value_that_does_not_fit_the_annotation_is_a_codec_error(any_store: Any, name: str) -> None:
    fail = [True]

    def typed() -> Charge:
        raise AssertionError("a recorded step does not run again")

    @idempotent_task(key="k-{n}", name=name, store=any_store)
    def body(n: int) -> Any:
        ctx = idempotask.context()
        assert ctx is not None
        if fail[0]:
            ctx.step("charge", lambda: {"id": "ch_1"})
            raise Boom("after the charge")
        return ctx.step("charge", typed)

    with pytest.raises(Boom):
        body(1)
    fail[0] = False
    with pytest.raises(CodecError) as raised:
        body(1)
    assert raised.value.kind == "undecodable"
    assert "step `charge`" in str(raised.value)


def test_a_value_without_json_runs_once_and_its_rerun_gets_a_codec_error(any_store: Any, name: str) -> None:
    ran: List[int] = []
    fail = [True]

    @idempotent_task(key="k-{n}", name=name, store=any_store)
    def body(n: int) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        ctx.step("opaque", lambda: ran.append(1) or object())
        if fail[0]:
            raise Boom("after the step")
        return "done"

    with pytest.raises(Boom):
        body(1)
    fail[0] = False
    with pytest.raises(CodecError) as raised:
        body(1)
    assert raised.value.kind == "unstorable"
    assert ran == [1]


def test_a_body_that_changed_its_step_order_is_refused_and_held(any_store: Any, name: str) -> None:
    ran: List[str] = []
    order = [("a", "b")]
    doubts: List[Any] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store, lock_ttl=1, max_wait=10)
    def body(n: int) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        doubts.append(ctx.in_doubt)
        for step in order[0]:
            ctx.step(step, lambda step=step: ran.append(step) or step)
        raise Boom("after the steps")

    with pytest.raises(Boom):
        body(1)
    order[0] = ("b", "a")
    with pytest.raises(StepError) as raised:
        body(1)
    assert raised.value.kind == "order_changed"
    assert "`a`" in str(raised.value)
    assert ran == ["a", "b"]
    # Held, not released: the next delivery waits for the lock to lapse, finds the unit in
    # doubt, and is refused the same way without running a step.
    with pytest.raises(StepError) as again:
        body(1)
    assert again.value.kind == "order_changed"
    assert ran == ["a", "b"]
    assert doubts[:2] == [None, None] and doubts[2] is not None, doubts


def test_a_step_whose_record_the_store_never_confirms_is_unrecorded(name: str, redis_server: Any) -> None:
    # A server of its own, stopped while the step's effect runs: the effect happened, and no
    # attempt to record it can reach the store. Of the session server's class: another conftest
    # of the suite shadows the module name `conftest`.
    server = type(redis_server)()
    ran: List[str] = []
    try:
        store = idempotask.RedisStore(server.url, connection_timeout=1, response_timeout=1)

        @idempotent_task(key="order-{n}", name=name, store=store)
        def checkout(n: int) -> str:
            ctx = idempotask.context()
            assert ctx is not None

            def charge() -> str:
                ran.append("charge")
                server.stop()
                return "ch_1"

            ctx.step("charge", charge)
            ran.append("after the step")
            return "done"

        with pytest.raises(StepError) as raised:
            checkout(1)
    finally:
        server.stop()
    assert raised.value.kind == "unrecorded"
    message = str(raised.value)
    assert "step `charge`" in message and "not confirmed" in message, message
    assert name in message and "order-1" in message, message
    # The body saw the error at the step, and went no further.
    assert ran == ["charge"]


def test_more_steps_than_max_steps_are_refused(any_store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store, max_steps=2)
    def body(n: int) -> None:
        ctx = idempotask.context()
        assert ctx is not None
        for i in range(3):
            ctx.step(("item", i), lambda i=i: ran.append(i))

    with pytest.raises(StepError) as raised:
        body(1)
    assert raised.value.kind == "too_many"
    assert ran == [0, 1]


def test_two_steps_at_once_are_refused(any_store: Any, name: str) -> None:
    ran: List[str] = []

    @idempotent_task(key="k-{n}", name=name, store=any_store)
    async def body(n: int) -> List[Any]:
        ctx = idempotask.context()
        assert ctx is not None
        return await asyncio.gather(
            ctx.step_async("a", lambda: ran.append("a") or "a"),
            ctx.step_async("b", lambda: ran.append("b") or "b"),
            return_exceptions=True,
        )

    results = asyncio.run(body(1))
    refused = [r for r in results if isinstance(r, StepError)]
    assert len(refused) == 1 and refused[0].kind == "overlapping", results
    assert len(ran) == 1 and ran[0] in results


def test_a_delivery_whose_lock_was_taken_over_is_refused_at_its_next_step(store: Any, name: str) -> None:
    effects: List[Tuple[str, str]] = []
    first_done, taken_over = threading.Event(), threading.Event()
    refused: List[BaseException] = []

    @idempotent_task(key="k-{n}", name=name, lock_ttl=0.3, max_wait=10)
    def body(n: int, who: str) -> str:
        ctx = idempotask.context()
        assert ctx is not None
        ctx.step("first", lambda: effects.append(("first", who)))
        if who == "zombie":
            first_done.set()
            # Paused past its lock, while another delivery takes the unit over and finishes it.
            assert taken_over.wait(30)
        ctx.step("second", lambda: effects.append(("second", who)))
        return who

    def zombie() -> None:
        try:
            body(1, "zombie")
        except BaseException as err:  # noqa: B036 - recorded for the assertion
            refused.append(err)

    paused = threading.Thread(target=zombie)
    paused.start()
    assert first_done.wait(30)
    # Waits for the paused delivery's lock to run out, takes the unit over in doubt, replays
    # the first step and runs the second.
    assert body(1, "taker") == "taker"
    taken_over.set()
    paused.join(30)
    (err,) = refused
    assert isinstance(err, LockNotHeld), err
    assert effects == [("first", "zombie"), ("second", "taker")]


def test_steps_are_refused_where_none_can_run(name: str) -> None:
    store = idempotask.MemoryStore()
    kept: List[Any] = []

    @idempotent_task(key="k-{n}", name=name, store=store)
    async def body(n: int) -> None:
        ctx = idempotask.context()
        assert ctx is not None
        kept.append(ctx)
        # A plain step would block the event loop.
        with pytest.raises(TypeError, match="step_async"):
            ctx.step("plain", lambda: 1)
        with pytest.raises(TypeError, match="a step's name is a str"):
            await ctx.step_async(["not", "a", "name"], lambda: 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="no stable text"):
            await ctx.step_async(("mail", None), lambda: 1)
        with pytest.raises(TypeError, match="reconcile function"):
            await ctx.step_or_reconcile_async("charge", None, lambda: 1)  # type: ignore[arg-type]

    asyncio.run(body(1))
    # After the body ended, its context runs no step.
    with pytest.raises(RuntimeError, match="inside its task's body"):
        asyncio.run(kept[0].step_async("late", lambda: 1))


def test_the_context_that_runs_steps_is_still_its_five_values(name: str) -> None:
    # Its call is no field: `asdict` copies every field, and a call cannot be copied.
    @idempotent_task(key="k-{n}", name=name, store=idempotask.MemoryStore())
    def body(n: int) -> Any:
        ctx = idempotask.context()
        assert ctx is not None
        return ctx.step("fields", lambda: dataclasses.asdict(ctx))

    assert body(1) == {"task": name, "key": "k-1", "fencing_token": None, "attempt": 1, "in_doubt": None}
