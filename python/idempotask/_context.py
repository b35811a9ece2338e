"""``idempotask.context()``: what a running body knows of its unit, and its steps.

A step is one side effect of a body, recorded in its unit's journal once it finished, so that a
rerun of the body (after a crash, an exception, a lost lock) gets the recorded value back
without running the effect again and goes on at the first step that did not finish. The journal,
its records and the replay are the Rust core's (``TaskContext::step``): the binding asks the
call running on idempotask's runtime to run the step, runs the Python function when the core
says so, and hands its value's JSON back to be recorded.
"""

from __future__ import annotations

import asyncio
import inspect
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Optional, Tuple, TypeVar, Union

from . import _native
from ._keys import placeholder_text
from ._reconcile import Reconciled
from ._results import ResultCodec, UnfitResult, result_codec

__all__ = ["StepName", "TaskContext", "context", "resolve", "settle_failed", "settle_failed_async"]

T = TypeVar("T")

StepName = Union[str, Tuple[str, Any]]
"""A step's name: a fixed word (``"charge"``), or a word and a key part for a step that runs once
per item (``("mail", recipient)``), as the Rust core's ``StepName``."""


@dataclass(frozen=True)
class TaskContext:
    """What a running body can know of its unit (``idempotask.context()`` inside it), and its
    steps (``step``, ``step_or_hold``, ``step_or_reconcile``; ``…_async`` in an ``async def``
    task)."""

    task: str
    key: str
    fencing_token: Optional[int]
    attempt: int
    in_doubt: Optional[float]
    """For a unit taken over in doubt, how long (seconds) the earlier delivery's lock had been
    expired: its side effect may have happened. ``None`` for a unit that was free."""
    # The running body's call and whether its task is `async def`, set by `context()`: not
    # fields, so that `dataclasses.asdict` (which copies every field) and `replace` see the five
    # values only.
    _call: ClassVar[Any] = None
    _is_async: ClassVar[bool] = False

    def step(self, name: StepName, function: Callable[[], T], *, serializer: Any = None) -> T:
        """Runs ``function()`` as the step ``name`` of this body, once: its value is recorded in
        the unit's journal when it returns, and a rerun of the body gets the recorded value back
        without calling ``function``, then goes on at the first step that did not finish.

        Steps run one at a time, in the same order on every run; name a step that runs once per
        item with a key part, ``("mail", recipient)``. The value is stored as JSON, as the task's
        result is: ``function``'s return annotation (or ``serializer``, as the decorator's
        ``result_serializer``) says how a rerun rebuilds it; without one, a rerun gets what
        ``json.loads`` makes of it. An exception in ``function`` records nothing and propagates.

        ``StepError`` when the step cannot run or be replayed (``kind``: ``order_changed``,
        ``too_many``, ``overlapping``, ``unsupported``, ``unrecorded``); ``LockNotHeld`` when
        this delivery's lock was taken over (``function`` does not run); ``CodecError`` for a
        recorded value that does not fit the annotation. A plain task's body only: an
        ``async def`` one awaits ``step_async``."""
        return _step(self, name, function, "rerun", None, serializer)

    def step_or_hold(self, name: StepName, function: Callable[[], T], *, serializer: Any = None) -> T:
        """``step`` for an effect that must never run twice: when this step is the one in doubt
        (the unit was taken over from a delivery whose lock ran out, and this is the first step
        its journal lacks, so that delivery may have started it), ``function`` does not run and
        the step raises ``InDoubt``; the unit stays in doubt for an operator. Otherwise as
        ``step``."""
        return _step(self, name, function, "hold", None, serializer)

    def step_or_reconcile(
        self, name: StepName, reconcile: Callable[[], Reconciled[T]], function: Callable[[], T], *,
        serializer: Any = None,
    ) -> T:
        """``step`` with a way to ask the downstream system first: when this step is the one in
        doubt (see ``step_or_hold``), ``reconcile()`` runs before ``function``;
        ``Reconciled.done(value)`` records ``value`` as the step's without calling ``function``,
        ``Reconciled.NOT_DONE`` calls it. A step that is not in doubt never calls ``reconcile``.
        An exception in ``reconcile`` records nothing and propagates."""
        return _step(self, name, function, "reconcile", reconcile, serializer)

    async def step_async(
        self, name: StepName, function: Callable[[], Union[T, Awaitable[T]]], *, serializer: Any = None
    ) -> T:
        """``step`` for an ``async def`` body: ``function`` is an ``async def`` function (or a
        plain one), awaited while the event loop goes on."""
        return await _step_async(self, name, function, "rerun", None, serializer)

    async def step_or_hold_async(
        self, name: StepName, function: Callable[[], Union[T, Awaitable[T]]], *, serializer: Any = None
    ) -> T:
        """``step_or_hold`` for an ``async def`` body."""
        return await _step_async(self, name, function, "hold", None, serializer)

    async def step_or_reconcile_async(
        self, name: StepName, reconcile: Callable[[], Union[Reconciled[T], Awaitable[Reconciled[T]]]],
        function: Callable[[], Union[T, Awaitable[T]]], *, serializer: Any = None,
    ) -> T:
        """``step_or_reconcile`` for an ``async def`` body; either function may be ``async def``."""
        return await _step_async(self, name, function, "reconcile", reconcile, serializer)


# The running body's task name, key, "run" event, its call and whether the task is `async def`;
# `context()` builds the `TaskContext` of them when asked, so that a body that never asks does
# not pay for it.
Running = Tuple[str, str, Tuple[Any, ...], Any, bool]
running: ContextVar[Optional[Running]] = ContextVar("idempotask_context", default=None)


def context() -> Optional[TaskContext]:
    """The running unit's context, inside an idempotent task's body; ``None`` elsewhere."""
    now = running.get()
    if now is None:
        return None
    name, key, (_, fencing_token, attempt, in_doubt), call, is_async = now
    ctx = TaskContext(name, key, fencing_token, attempt, in_doubt)
    object.__setattr__(ctx, "_call", call)
    object.__setattr__(ctx, "_is_async", is_async)
    return ctx


def resolve(future: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    """Completes an event's future on its loop (called through ``call_soon_threadsafe``), after
    handing what the call logged on idempotask's runtime to ``logging``, on the loop's thread.
    A handler's ``KeyboardInterrupt`` goes on through the loop, the future completed."""
    try:
        _native.flush_logs()
    finally:
        if not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


class _Step:
    """One step as the binding sends it: the core's name and key part, how it is shown, and the
    codec of its value."""

    def __init__(self, ctx: TaskContext, name: StepName, function: Callable[..., Any], serializer: Any,
                 reconcile: Optional[Callable[..., Any]], policy: str) -> None:
        if ctx._call is None:
            raise RuntimeError("this TaskContext is not a running body's: call idempotask.context() inside the task")
        if not callable(function):
            raise TypeError(f"a step's function is a function of no arguments, not {type(function).__name__}")
        # Checked now: the reconcile function is called only for the step in doubt, rarely.
        if policy == "reconcile" and not callable(reconcile):
            raise TypeError(
                f"a step's reconcile function is a function of no arguments returning a Reconciled, not {type(reconcile).__name__}"
            )
        self.task = ctx.task
        self.name, self.part = _name_of(name)
        self.shown = self.name if self.part is None else f"{self.name}[{self.part}]"
        qualname = getattr(function, "__qualname__", None) or repr(function)
        self.codec: ResultCodec = result_codec(function, serializer, f"step `{self.shown}` ({qualname})")

    def start(self, ctx: TaskContext, policy: str) -> "_native.StepCall":
        return ctx._call.step(self.name, self.part, policy)  # type: ignore[no-any-return]

    def replayed(self, json: str) -> Any:
        """The recorded value, rebuilt by the step's codec."""
        return self.codec.decode(json, self.task, step=self.shown)

    def answer(self, call: "_native.StepCall", value: Any, reconciled: bool = False) -> None:
        """Hands the value to the step, its JSON or why it has none. The effect happened: an
        encoding that fails records the step as unstorable, never as not run."""
        try:
            text = self.codec.encode(value)
            # A lone surrogate has no UTF-8 form.
            text.encode("utf-8")
        except BaseException as err:  # noqa: B036 - an interrupt while encoding too
            reason = str(err) if isinstance(err, UnfitResult) else f"the step's value has no JSON form: {err!r}"
            (call.reconciled_unstorable if reconciled else call.unstorable)(reason)
            if not isinstance(err, Exception):
                raise
        else:
            (call.reconciled if reconciled else call.finish)(text)


def _name_of(name: Any) -> Tuple[str, Optional[str]]:
    """A step's name and key part, the part as a Rust ``Display`` writes the same value."""
    if isinstance(name, str):
        return name, None
    if isinstance(name, tuple) and len(name) == 2 and isinstance(name[0], str):
        word, part = name
        try:
            return word, placeholder_text(part, "part")
        except TypeError:
            raise TypeError(
                f"the key part of step {word!r} is {type(part).__name__!s} {part!r}, which has no stable text; give a str, a number or a field of it"
            ) from None
    raise TypeError(
        f"a step's name is a str or a (str, key part) tuple like (\"mail\", recipient), not {type(name).__name__}"
    )


def _ended(event: Tuple[Any, ...]) -> None:
    """The step's last event after a value was answered: recorded (an error raises in ``wait``)."""
    if event[0] != "recorded":
        raise RuntimeError(f"unexpected step event {event[0]!r}")


def _checked(reconcile: Callable[..., Any], answer: Any) -> Reconciled[Any]:
    if isinstance(answer, Reconciled):
        return answer
    raise TypeError(
        f"the reconcile function {getattr(reconcile, '__qualname__', reconcile)!s} returned {type(answer).__name__}, not Reconciled.done(value) or Reconciled.NOT_DONE"
    )


def _refuse_awaitable(function: Callable[..., Any], value: Any) -> None:
    """A plain task's step function that returned an awaitable did not do its work."""
    if not inspect.isawaitable(value):
        return
    close = getattr(value, "close", None)
    if close is not None:
        close()  # no "never awaited" warning: it is refused, not forgotten
    raise TypeError(
        f"{getattr(function, '__qualname__', function)!s} returned an awaitable: in an `async def` task, await ctx.step_async(...)"
    )


def _step(ctx: TaskContext, name: StepName, function: Callable[[], Any], policy: str,
          reconcile: Optional[Callable[[], Any]], serializer: Any) -> Any:
    if ctx._is_async:
        raise TypeError(
            "in an `async def` task, a step is awaited: `await ctx.step_async(...)` (a plain step would block the event loop)"
        )
    step = _Step(ctx, name, function, serializer, reconcile, policy)
    call = step.start(ctx, policy)
    try:
        event = call.wait()
        if event[0] == "reconcile":
            try:
                answer = reconcile()  # type: ignore[misc]
                _refuse_awaitable(reconcile, answer)  # type: ignore[arg-type]
                answer = _checked(reconcile, answer)  # type: ignore[arg-type]
            except BaseException:
                settle_failed(call)
                raise
            if answer.is_done:
                step.answer(call, answer.value, reconciled=True)
                _ended(call.wait())
                return answer.value
            call.not_done()
            event = call.wait()
        if event[0] == "replayed":
            return step.replayed(event[1])
        try:
            value = function()
            _refuse_awaitable(function, value)
        except BaseException:
            settle_failed(call)
            raise
        step.answer(call, value)
        _ended(call.wait())
        return value
    finally:
        # A question left unanswered (an interrupt while waiting) is a raise.
        call.cancel()


async def _step_async(ctx: TaskContext, name: StepName, function: Callable[[], Any], policy: str,
                      reconcile: Optional[Callable[[], Any]], serializer: Any) -> Any:
    step = _Step(ctx, name, function, serializer, reconcile, policy)
    call = step.start(ctx, policy)
    loop = asyncio.get_running_loop()
    try:
        event = await call.wait_async(loop, resolve)
        if event[0] == "reconcile":
            try:
                answer = reconcile()  # type: ignore[misc]
                if inspect.isawaitable(answer):
                    answer = await answer
                answer = _checked(reconcile, answer)  # type: ignore[arg-type]
            except Exception:
                await settle_failed_async(call, loop)
                raise
            except BaseException:
                call.fail()
                raise
            if answer.is_done:
                step.answer(call, answer.value, reconciled=True)
                _ended(await call.wait_async(loop, resolve))
                return answer.value
            call.not_done()
            event = await call.wait_async(loop, resolve)
        if event[0] == "replayed":
            return step.replayed(event[1])
        try:
            value = function()
            if inspect.isawaitable(value):
                value = await value
        except Exception:
            await settle_failed_async(call, loop)
            raise
        except BaseException:
            # Cancelled: the step ends on idempotask's runtime, not awaited here.
            call.fail()
            raise
        step.answer(call, value)
        _ended(await call.wait_async(loop, resolve))
        return value
    finally:
        call.cancel()


def settle_failed(call: Union["_native.Pending", "_native.StepCall"]) -> None:
    """The function raised (a body, a reconcile function, a step's function): its call is told
    so (a body's call releases the lock or leaves a unit in doubt as it was; a step records
    nothing), and that end is waited for before the exception goes on, so that the body's next
    step does not find this one still running. Whatever the end says is not the caller's news:
    the exception is."""
    call.fail()
    try:
        call.wait()
    except Exception:
        pass


async def settle_failed_async(
    call: Union["_native.Pending", "_native.StepCall"], loop: "asyncio.AbstractEventLoop"
) -> None:
    """``settle_failed`` in an ``async def`` task: the end awaited on ``loop``."""
    call.fail()
    try:
        await call.wait_async(loop, resolve)
    except Exception:
        pass
