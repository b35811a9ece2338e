"""``@idempotent_task``: a Python function run at most once per unit, on the Rust core."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar, Union

from . import _native
from ._context import TaskContext, context, resolve as _resolve, running as _context
from ._context import settle_failed as _settle_failed, settle_failed_async as _settle_failed_async
from ._keys import KeyTemplate, MissingField, fingerprint_json, fingerprint_paths, key_parameters
from ._reconcile import Reconciled
from ._report import RECORDED_KINDS, Report, ResultNotRecorded, UnrecordedResultWarning, outcome_of
from ._results import UnfitResult, result_codec

__all__ = ["TaskContext", "UnitRecord", "context", "idempotent_task", "install", "installed"]

_log = logging.getLogger("idempotask")

if TYPE_CHECKING:
    # For type checkers only (`typing_extensions` ships with them): what `@idempotent_task`
    # makes of a function, so that `task.run_reported(...)` type-checks, on a method too.
    from typing import Coroutine, overload

    from typing_extensions import Concatenate, ParamSpec, Protocol

    P = ParamSpec("P")
    Q = ParamSpec("Q")
    R = TypeVar("R")
    S = TypeVar("S")

    class IdempotentTask(Protocol[P, R]):
        """A decorated plain function: called as the function, with ``run_reported``."""

        idempotask_name: str

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

        def run_reported(self, *args: P.args, **kwargs: P.kwargs) -> Report[R]: ...

        def idempotask_unit(self, *args: P.args, **kwargs: P.kwargs) -> Tuple[str, Optional[str]]: ...

        @overload
        def __get__(self, instance: None, owner: Any) -> IdempotentTask[P, R]: ...

        @overload
        def __get__(self: IdempotentTask[Concatenate[S, Q], R], instance: S, owner: Any) -> IdempotentTask[Q, R]: ...

    class AsyncIdempotentTask(Protocol[P, R]):
        """A decorated ``async def`` function: its call and ``run_reported`` are coroutines."""

        idempotask_name: str

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]: ...

        def run_reported(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, Report[R]]: ...

        def idempotask_unit(self, *args: P.args, **kwargs: P.kwargs) -> Tuple[str, Optional[str]]: ...

        @overload
        def __get__(self, instance: None, owner: Any) -> AsyncIdempotentTask[P, R]: ...

        @overload
        def __get__(
            self: AsyncIdempotentTask[Concatenate[S, Q], R], instance: S, owner: Any
        ) -> AsyncIdempotentTask[Q, R]: ...

    class Decorator(Protocol):
        """What ``idempotent_task(...)`` returns."""

        @overload
        def __call__(  # type: ignore[overload-overlap]  # an `async def` first
            self, function: Callable[P, Coroutine[Any, Any, R]]
        ) -> AsyncIdempotentTask[P, R]: ...

        @overload
        def __call__(self, function: Callable[P, R]) -> IdempotentTask[P, R]: ...
Store = Union[
    _native.MemoryStore, _native.RedisStore, _native.RedisClusterStore, _native.PostgresStore, _native.LocalResultCache
]

_ON_BUSY = ("retry", "wait", "raise")
_ON_UNRECORDED = ("warn", "raise")
_installed: Optional[Store] = None
_install_lock = threading.Lock()
# Task name -> the function that defined it: two functions with one name would share units.
_names: Dict[str, str] = {}


def install(store: Store) -> Optional[Store]:
    """Makes ``store`` the one every task without its own ``store=`` uses; returns the one it
    replaces. Call it once at start-up (in a Celery app module, at import: the store connects
    lazily in each worker process, never across a fork)."""
    global _installed
    _native_store(store)
    with _install_lock:
        previous, _installed = _installed, store
    return previous


def installed() -> Optional[Store]:
    """The installed store, if any."""
    return _installed


@dataclass(frozen=True)
class UnitRecord:
    """What the core knows of a replayed unit, handed to the ``on_replay`` hook with the
    value: its task, its key and the fencing token of the execution that stored the result.

    The marker's stored time and expiry are not here: the core's report of a replay does not
    carry them (yet), and reading them would cost the duplicate another store round trip."""

    task: str
    key: str
    """The unit's key as the template made it (never its digest, whatever ``log_key`` says:
    the hook runs in the caller's process, which has the arguments)."""
    fencing_token: Optional[int]
    """The fencing token of the execution whose result was replayed, for a task with
    ``fencing=True``; ``None`` otherwise."""


def _native_store(store: Any) -> Store:
    if not isinstance(
        store,
        (
            _native.MemoryStore, _native.RedisStore, _native.RedisClusterStore, _native.PostgresStore,
            _native.LocalResultCache,
        ),
    ):
        raise TypeError(
            f"expected an idempotask store (MemoryStore, RedisStore, RedisClusterStore, PostgresStore, LocalResultCache), got {type(store).__name__}"
        )
    return store


class _Spec:
    """One decorated function: its task, key template, fingerprint and busy policy."""

    def __init__(self, function: Callable[..., Any], key: str, name: Optional[str], fingerprint: Any,
                 on_busy: Optional[str], store: Optional[Store], options: Dict[str, Any],
                 reconcile: Optional[Callable[[TaskContext], Any]] = None,
                 on_unrecorded: str = "warn", result_serializer: Any = None,
                 on_replay: Optional[Callable[[Any, UnitRecord], Any]] = None) -> None:
        qualname = getattr(function, "__qualname__", repr(function))
        self.function = function
        self.is_async = inspect.iscoroutinefunction(function)
        self.reconcile = _reconcile_of(function, reconcile, qualname)
        self.on_replay = _on_replay_of(function, on_replay, qualname)
        self.result = result_codec(function, result_serializer, qualname)
        self.signature, parameters, self.bound = key_parameters(function)
        # A signature of plain parameters only (no `*args`, `**kwargs` or keyword-only ones):
        # a call that gives each by position binds them in order.
        kinds = [p.kind for p in self.signature.parameters.values()]
        plain = all(kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for kind in kinds)
        self.names = tuple(self.signature.parameters)
        self.positional = len(kinds) if plain else -1
        self.key = KeyTemplate(key, parameters, qualname)
        annotations = {
            name: parameter.annotation
            for name, parameter in self.signature.parameters.items()
            if parameter.annotation is not inspect.Parameter.empty
        }
        self.fingerprint = fingerprint_paths(
            fingerprint, parameters, self.key, annotations, getattr(function, "__globals__", {}), qualname
        )
        if on_busy is not None and on_busy not in _ON_BUSY:
            raise ValueError(f"{qualname}: on_busy must be one of {', '.join(map(repr, _ON_BUSY))}, not {on_busy!r}")
        self.on_busy = on_busy
        if on_unrecorded not in _ON_UNRECORDED:
            raise ValueError(
                f"{qualname}: on_unrecorded must be one of {', '.join(map(repr, _ON_UNRECORDED))}, not {on_unrecorded!r}"
            )
        self.on_unrecorded = on_unrecorded
        self.store = None if store is None else _native_store(store)
        self.name = name if name is not None else function.__name__
        try:
            self.task = _native.Task(self.name, reconcile=reconcile is not None, **options)
        except ValueError as err:
            raise ValueError(f"{qualname}: {err}") from None
        defined = f"{function.__module__}.{qualname}"
        taken = _names.setdefault(self.name, defined)
        if taken != defined:
            raise ValueError(
                f"{qualname}: task name {self.name!r} is taken by {taken}: the two would share their results; give one of them its own name=\"...\""
            )

    def unit(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[str, Optional[str], Any]:
        """The call's key, its fingerprinted arguments' JSON, and its ``self`` (or ``None``)."""
        if not kwargs and len(args) == self.positional:
            # Every parameter given by position, the common call: what `bind` would answer.
            arguments = dict(zip(self.names, args))
        else:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        this = arguments.pop("self") if self.bound else None
        key = self.key.render(arguments)
        if self.fingerprint is None:
            return key, None, this
        try:
            fingerprint = fingerprint_json(self.fingerprint, arguments)
            # A lone surrogate (from `json.loads` of a broken payload) has no UTF-8 form: the
            # native call would raise a bare UnicodeEncodeError.
            fingerprint.encode("utf-8")
        except MissingField as err:
            # A path the annotation could not check (a dict, an untyped parameter): nothing
            # ran, as for a value without JSON text.
            raise _codec_error("fingerprint", f"task {self.name!r}: {err}") from None
        except (TypeError, ValueError, RecursionError) as err:
            # No JSON text (an object, a cycle, a dict key that is no JSON name, nesting too
            # deep for `json`, a lone surrogate): nothing ran, as for the Rust attribute's
            # `Fingerprint` kind.
            raise _codec_error(
                "fingerprint", f"task {self.name!r}: the fingerprinted arguments have no JSON text: {err}"
            ) from err
        return key, fingerprint, this

    def mode(self, this: Any) -> str:
        """What a busy unit does for this call: a bound Celery task retries by default."""
        celery = this is not None and hasattr(this, "retry") and hasattr(this, "request")
        if self.on_busy is None:
            return "retry" if celery else "wait"
        if self.on_busy == "retry" and not celery:
            return "raise"
        return self.on_busy

    def start(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple["_native.Pending", str, str, Any]:
        key, fingerprint, this = self.unit(args, kwargs)
        store = self.store if self.store is not None else _installed
        if store is None:
            raise _native.IdempotaskError(
                "no idempotency store is installed; call `idempotask.install(store)` at start-up or give the task a `store`"
            )
        mode = self.mode(this)
        return self.task.start(store, key, fingerprint, mode == "wait"), key, mode, this

    def busy(self, mode: str, this: Any, busy: BaseException) -> BaseException:
        """The exception a busy unit raises: Celery's ``Retry`` in the holder's remaining lock
        time, or ``Contended`` itself."""
        if mode != "retry":
            return busy
        countdown = getattr(busy, "lock_ttl_remaining", None)
        if countdown is None:
            countdown = self.task.lock_ttl
        return this.retry(exc=busy, countdown=countdown)

    def context(self, key: str, event: Tuple[Any, ...], pending: "_native.Pending") -> Tuple[str, str, Tuple[Any, ...], Any, bool]:
        """What ``idempotask.context()`` builds the body's ``TaskContext`` of: its steps go
        through ``pending``."""
        return self.name, key, event, pending, self.is_async

    def replayed(self, event: Tuple[Any, ...]) -> Any:
        """The value of a call whose body did not run: the stored result, rebuilt as the task's
        serializer says (a ``CodecError`` of kind ``undecodable`` when it does not fit)."""
        return self.result.decode(event[1], self.name)

    def replay_record(self, event: Tuple[Any, ...], key: str) -> Optional[UnitRecord]:
        """The record the ``on_replay`` hook gets for a ``done`` event, if it is a replay and
        the task has a hook."""
        if self.on_replay is None or event[2] != "replayed":
            return None
        return UnitRecord(self.name, key, event[3])

    def hook_failed(self, key: str) -> None:
        """The ``on_replay`` hook raised: logged, and the replayed value returned all the
        same (the unit is done; failing its duplicate would only redeliver it to fail again)."""
        _log.warning(
            "the on_replay hook of task %r raised; the replayed result is returned as if it had not",
            self.name, exc_info=True, extra={"idempotask": {"task": self.name, "key": self.task.shown_key(key)}},
        )

    def end(self, value: Any, done: Tuple[Any, ...], key: str, reported: bool, reconciled: bool = False) -> Any:
        """What a call whose value is ``value`` (the reconcile function's answer when
        ``reconciled``) and whose end is the ``done`` event returns: a ``Report`` for
        ``run_reported``, else the value, after the warning (or the exception) of a result that
        is not recorded."""
        if reported:
            return Report(value, outcome_of(done[2], done[4]), done[3])
        if done[2] not in RECORDED_KINDS:
            self.unrecorded(value, done, key, reconciled)
        return value

    def unrecorded(self, value: Any, done: Tuple[Any, ...], key: str, reconciled: bool) -> None:
        """Warns of a result that is not recorded, or raises ``ResultNotRecorded``. The core
        has logged it already (a WARN record of the ``idempotask`` logger)."""
        outcome = outcome_of(done[2], done[4])
        shown = self.task.shown_key(key)
        if outcome.kind == "marker_not_written":
            what = "the store did not record its result (nor was it found when read back); a delivery after the lock expires may run the body again"
        elif outcome.kind == "lock_lost" and outcome.marker_written:
            what = "its lock had expired (or may have) before its result was recorded, so another delivery may have run it too (its result was stored)"
        elif outcome.kind == "lock_lost":
            what = "its lock had expired (or may have) before its result was recorded, so another delivery may have run it too, and its result was not stored"
        else:
            what = f"its outcome is {outcome.kind!r}"
        answered = "its reconcile function answered" if reconciled else "the body returned"
        message = f"task {self.name!r} with key {shown!r}: {answered}, but {what}"
        if self.on_unrecorded == "raise":
            raise ResultNotRecorded(message, value, outcome, self.name, shown)
        # Points at the task's caller: the wrapper, `call`, the runner, `end` and this are idempotask's.
        warnings.warn(message, UnrecordedResultWarning, stacklevel=6)


def _codec_error(kind: str, message: str) -> "_native.CodecError":
    """A ``CodecError`` of ``kind``, as the native module raises them."""
    error = _native.CodecError(message)
    error.kind = kind
    return error


def _reconcile_of(function: Callable[..., Any], reconcile: Any, qualname: str) -> Optional[Callable[..., Any]]:
    """The ``reconcile=`` function, checked: callable, and ``async def`` exactly when the task is."""
    if reconcile is None:
        return None
    if not callable(reconcile):
        raise TypeError(f"{qualname}: reconcile must be a function of the TaskContext, not {type(reconcile).__name__}")
    task_async = inspect.iscoroutinefunction(function)
    if inspect.iscoroutinefunction(reconcile) != task_async:
        raise TypeError(
            f"{qualname}: reconcile must be {'an `async def`' if task_async else 'a plain'} function, as the task is"
        )
    return reconcile  # type: ignore[no-any-return]


def _checked(spec: _Spec, answer: Any) -> Reconciled[Any]:
    if not isinstance(answer, Reconciled):
        refused = _not_awaited(spec.reconcile, answer)  # type: ignore[arg-type]
        if refused is not None:
            raise refused
        raise TypeError(
            f"the reconcile function of {spec.name!r} returned {type(answer).__name__}, not Reconciled.done(value) or Reconciled.NOT_DONE"
        )
    return answer


def _answer_reconciled(spec: _Spec, pending: "_native.Pending", answer: Reconciled[Any]) -> None:
    """Hands the reconcile function's answer to the call, a value as ``_answer`` does."""
    if not answer.is_done:
        pending.not_done()
        return
    try:
        text = spec.result.encode(answer.value)
        text.encode("utf-8")
    except BaseException as err:  # noqa: B036 - an interrupt while encoding too
        pending.reconciled_unstorable(_unstorable_reason(err))
        if not isinstance(err, Exception):
            raise
    else:
        pending.reconciled(text)


def _answer(spec: _Spec, pending: "_native.Pending", value: Any) -> None:
    """Hands the body's value to the call: its JSON, or why it has none. Once the body returned,
    its work is done: whatever the encoding raises, the unit is recorded (as unstorable at
    worst), never released for the work to run again."""
    try:
        text = spec.result.encode(value)
        # A lone surrogate (from `json.loads` of a broken payload) has no UTF-8 form.
        text.encode("utf-8")
    except BaseException as err:  # noqa: B036 - an interrupt while encoding too
        pending.unstorable(_unstorable_reason(err))
        if not isinstance(err, Exception):
            raise
    else:
        pending.finish(text)


def _unstorable_reason(err: BaseException) -> str:
    """Why a result is recorded as unstorable, as duplicates' ``CodecError`` says it."""
    if isinstance(err, UnfitResult):
        return str(err)
    return f"the result has no JSON form: {err!r}"


def _not_awaited(function: Callable[..., Any], value: Any) -> Optional[TypeError]:
    """Why a plain function's return value is no result: an awaitable (a coroutine function
    that `inspect` could not tell) means the work has not run."""
    if not inspect.isawaitable(value):
        return None
    close = getattr(value, "close", None)
    if close is not None:
        close()  # no "never awaited" warning: it is refused, not forgotten
    return TypeError(
        f"{getattr(function, '__qualname__', function)!s} returned an awaitable: decorate an `async def` function, or await the work inside it"
    )


def _on_replay_of(function: Callable[..., Any], on_replay: Any, qualname: str) -> Optional[Callable[..., Any]]:
    """The ``on_replay=`` hook, checked: callable, and a plain function for a plain task (an
    ``async def`` task takes either)."""
    if on_replay is None:
        return None
    if not callable(on_replay):
        raise TypeError(f"{qualname}: on_replay must be a function of the value and the UnitRecord, not {type(on_replay).__name__}")
    if inspect.iscoroutinefunction(on_replay) and not inspect.iscoroutinefunction(function):
        raise TypeError(f"{qualname}: on_replay is an `async def` function, but the task is not; give it a plain one")
    return on_replay  # type: ignore[no-any-return]


def _notify_sync(spec: _Spec, value: Any, event: Tuple[Any, ...], key: str) -> None:
    """Calls the ``on_replay`` hook of a replay; an ``Exception`` in it is logged, never the
    caller's."""
    record = spec.replay_record(event, key)
    if record is None:
        return
    try:
        returned = spec.on_replay(value, record)  # type: ignore[misc]
        refused = _not_awaited(spec.on_replay, returned)  # type: ignore[arg-type]
        if refused is not None:
            raise refused
    except Exception:
        spec.hook_failed(key)


async def _notify_async(spec: _Spec, value: Any, event: Tuple[Any, ...], key: str) -> None:
    """``_notify_sync`` for an ``async def`` task: an ``async def`` hook is awaited."""
    record = spec.replay_record(event, key)
    if record is None:
        return
    try:
        returned = spec.on_replay(value, record)  # type: ignore[misc]
        if inspect.isawaitable(returned):
            await returned
    except Exception:
        spec.hook_failed(key)


def _sync(spec: _Spec) -> Callable[..., Any]:
    function = spec.function

    def call(args: Tuple[Any, ...], kwargs: Dict[str, Any], reported: bool) -> Any:
        pending, key, mode, this = spec.start(args, kwargs)
        # Every way out cancels: a caller interrupted while it waits (Ctrl-C, a Celery time
        # limit) must not leave the call holding a lock for a body nobody runs.
        try:
            return _run_sync(spec, pending, key, mode, this, args, kwargs, reported)
        finally:
            pending.cancel()

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return call(args, kwargs, False)

    def run_reported(*args: Any, **kwargs: Any) -> Report[Any]:
        """Calls the task and returns its value with how the call ended, a ``Report``; an
        unrecorded result is reported there, neither warned of nor raised."""
        return call(args, kwargs, True)  # type: ignore[no-any-return]

    return _finished(spec, wrapper, run_reported)


def _run_sync(spec: _Spec, pending: "_native.Pending", key: str, mode: str, this: Any,
              args: Tuple[Any, ...], kwargs: Dict[str, Any], reported: bool) -> Any:
    function = spec.function
    try:
        event = pending.wait()
    except _native.Contended as busy:
        raise spec.busy(mode, this, busy) from None
    if event[0] == "reconcile":
        token = _context.set(spec.context(key, event, pending))
        try:
            answer = _checked(spec, spec.reconcile(context()))  # type: ignore[misc]
        except BaseException:
            _settle_failed(pending)
            raise
        finally:
            _context.reset(token)
        _answer_reconciled(spec, pending, answer)
        event = pending.wait()
        if answer.is_done:
            return spec.end(answer.value, event, key, reported, reconciled=True)
    if event[0] != "run":
        value = spec.replayed(event)
        _notify_sync(spec, value, event, key)
        return spec.end(value, event, key, reported)
    token = _context.set(spec.context(key, event, pending))
    try:
        value = function(*args, **kwargs)
        refused = _not_awaited(function, value)
        if refused is not None:
            raise refused
    except BaseException:
        _settle_failed(pending)
        raise
    finally:
        _context.reset(token)
    _answer(spec, pending, value)
    return spec.end(value, pending.wait(), key, reported)


def _async(spec: _Spec) -> Callable[..., Any]:
    function = spec.function

    async def call(args: Tuple[Any, ...], kwargs: Dict[str, Any], reported: bool) -> Any:
        pending, key, mode, this = spec.start(args, kwargs)
        # As in the plain wrapper: a cancelled coroutine cancels its call.
        try:
            return await _run_async(spec, pending, key, mode, this, args, kwargs, reported)
        finally:
            pending.cancel()

    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await call(args, kwargs, False)

    async def run_reported(*args: Any, **kwargs: Any) -> Report[Any]:
        """Calls the task and returns its value with how the call ended, a ``Report``; an
        unrecorded result is reported there, neither warned of nor raised."""
        return await call(args, kwargs, True)  # type: ignore[no-any-return]

    return _finished(spec, wrapper, run_reported)


def _finished(spec: _Spec, wrapper: Callable[..., Any], run_reported: Callable[..., Any]) -> Callable[..., Any]:
    """The decorated object: ``wrapper`` with ``run_reported``, ``idempotask_name`` and
    ``idempotask_unit``; for a method (a first parameter ``self``), a ``_Method`` that binds
    ``self`` for each of them."""
    wrapper.run_reported = run_reported  # type: ignore[attr-defined]
    wrapper.idempotask_name = spec.name  # type: ignore[attr-defined]
    wrapper.idempotask_unit = _unit_of(spec)  # type: ignore[attr-defined]
    if not spec.bound:
        return wrapper
    return _Method(wrapper)


class _Method:
    """A decorated method: called as the function is, and bound to an instance (``obj.task``)
    as a function is, ``run_reported`` and ``idempotask_unit`` included, which a plain function
    attribute would not be (``obj.task.run_reported(x)`` would lose ``self``). Celery's
    ``bind=True`` tasks are such methods: Celery binds them to the task."""

    def __init__(self, wrapper: Callable[..., Any]) -> None:
        functools.update_wrapper(self, wrapper)
        self.__wrapped__ = wrapper.__wrapped__  # type: ignore[attr-defined]
        self._wrapper = wrapper
        if inspect.iscoroutinefunction(wrapper):
            _mark_coroutine_function(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(*args, **kwargs)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return _BoundMethod(self._wrapper, instance)

    def __reduce__(self) -> str:
        # Pickled by name, as the function it replaces is.
        return self._wrapper.__qualname__

    def __repr__(self) -> str:
        return f"<idempotent task {self._wrapper.__qualname__}>"


class _BoundMethod:
    """A ``_Method`` bound to ``instance``: each of its calls gets ``instance`` first."""

    def __init__(self, wrapper: Callable[..., Any], instance: Any) -> None:
        # Not the wrapper's `__dict__`: its `run_reported` would hide this class's.
        functools.update_wrapper(self, wrapper, updated=())
        self.idempotask_name: str = wrapper.idempotask_name  # type: ignore[attr-defined]
        self.__wrapped__ = wrapper.__wrapped__  # type: ignore[attr-defined]
        self.__self__ = instance
        self._wrapper = wrapper
        if inspect.iscoroutinefunction(wrapper):
            _mark_coroutine_function(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(self.__self__, *args, **kwargs)

    def run_reported(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the task and returns its value with how the call ended, a ``Report``."""
        return self._wrapper.run_reported(self.__self__, *args, **kwargs)  # type: ignore[attr-defined]

    def idempotask_unit(self, *args: Any, **kwargs: Any) -> Tuple[str, Optional[str]]:
        """The key and the fingerprint (hex) a call with these arguments has; nothing runs."""
        return self._wrapper.idempotask_unit(self.__self__, *args, **kwargs)  # type: ignore[attr-defined, no-any-return]

    def __repr__(self) -> str:
        return f"<bound idempotent task {self._wrapper.__qualname__} of {self.__self__!r}>"


def _mark_coroutine_function(task: Any) -> None:
    """Makes ``inspect.iscoroutinefunction`` (3.12 and later) and
    ``asyncio.iscoroutinefunction`` say what the wrapped ``async def`` is."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:
        mark(task)
    marker = getattr(asyncio.coroutines, "_is_coroutine", None)
    if marker is not None:
        task._is_coroutine = marker


async def _run_async(spec: _Spec, pending: "_native.Pending", key: str, mode: str, this: Any,
                     args: Tuple[Any, ...], kwargs: Dict[str, Any], reported: bool) -> Any:
    loop = asyncio.get_running_loop()
    try:
        event = await pending.wait_async(loop, _resolve)
    except _native.Contended as busy:
        raise spec.busy(mode, this, busy) from None
    if event[0] == "reconcile":
        token = _context.set(spec.context(key, event, pending))
        try:
            answer = _checked(spec, await spec.reconcile(context()))  # type: ignore[misc]
        except Exception:
            await _settle_failed_async(pending, loop)
            raise
        except BaseException:
            # Cancelled: the call ends on idempotask's runtime, not awaited here.
            pending.fail()
            raise
        finally:
            _context.reset(token)
        _answer_reconciled(spec, pending, answer)
        event = await pending.wait_async(loop, _resolve)
        if answer.is_done:
            return spec.end(answer.value, event, key, reported, reconciled=True)
    if event[0] != "run":
        value = spec.replayed(event)
        await _notify_async(spec, value, event, key)
        return spec.end(value, event, key, reported)
    token = _context.set(spec.context(key, event, pending))
    try:
        value = await spec.function(*args, **kwargs)
    except Exception:
        await _settle_failed_async(pending, loop)
        raise
    except BaseException:
        # Cancelled: the release goes on on idempotask's runtime, not awaited here.
        pending.fail()
        raise
    finally:
        _context.reset(token)
    _answer(spec, pending, value)
    return spec.end(value, await pending.wait_async(loop, _resolve), key, reported)


def idempotent_task(
    *,
    key: str,
    name: Optional[str] = None,
    lock_ttl: Any = None,
    result_ttl: Any = None,
    renew: bool = False,
    fencing: bool = False,
    fingerprint: Union[bool, Sequence[str], None] = None,
    log_key: Optional[str] = None,
    in_doubt: Optional[str] = None,
    doubt_memory: Any = None,
    hold_alert_after: Any = None,
    max_attempts: Optional[int] = None,
    max_wait: Any = None,
    initial_backoff: Any = None,
    max_backoff: Any = None,
    max_steps: Optional[int] = None,
    max_step_bytes: Optional[int] = None,
    on_busy: Optional[str] = None,
    store: Optional[Store] = None,
    reconcile: Optional[Callable[[TaskContext], Any]] = None,
    on_unrecorded: str = "warn",
    result_serializer: Any = None,
    on_replay: Optional[Callable[[Any, UnitRecord], Any]] = None,
) -> Decorator:
    """Runs the decorated function at most once per unit of work (its task name and the key the
    template makes of its arguments); every later call gets the first one's result back.

    The key template and the options are checked here, when the decorator is applied: a
    placeholder that names no parameter is a ``ValueError`` at import time. See docs/python.md
    for every option; durations are seconds (``int``/``float``) or ``timedelta``.

    ``reconcile``: a function of the ``TaskContext`` (``async def`` for an ``async def`` task)
    called, before the body, on a unit *in doubt* (an earlier delivery's lock ran out without a
    result); it asks the downstream system and returns ``Reconciled.done(value)`` (stored as the
    result, the body does not run) or ``Reconciled.NOT_DONE`` (the body runs). An exception in
    it propagates unchanged and leaves the unit in doubt.

    ``on_unrecorded``: what a call does when the body returned but its result is not recorded
    as it should be (the store refused the completion marker, or the lock expired before it):
    ``"warn"`` (the default) returns the value after an ``UnrecordedResultWarning``;
    ``"raise"`` raises ``ResultNotRecorded``, which carries the value. Either way the
    ``idempotask`` logger gets a WARN record. ``task.run_reported(...)`` returns the value with
    its ``Outcome`` instead, and neither warns nor raises.

    ``fingerprint``: ``True``, or a list of parameters and paths of fields in them
    (``["order.amount", "currency"]``: the item of a dict, the field of a dataclass or of a
    pydantic model), fingerprinted as the JSON list of the selected values, as the Rust
    attribute's ``fingerprint = [order.amount, currency]``; a dataclass or a model as the JSON
    object of its fields. A path into a parameter annotated with a dataclass or a model is
    checked here; any other one when called (a ``CodecError`` of kind ``fingerprint``).

    ``result_serializer``: how a duplicate rebuilds the result; by default the return
    annotation says (a dataclass, a pydantic v2 model, an ``Enum``, a tuple, and lists, dicts
    and optionals of them; plain JSON values stay as ``json.loads`` gives them). A type here
    takes the annotation's place; ``Serializer(dump=..., load=...)`` gives two functions. An
    annotation that no serializer can rebuild is a ``TypeError`` here.

    ``hold_alert_after``: with ``in_doubt="hold"``, a unit held longer than this (seconds or a
    ``timedelta``) makes each delivery that meets it log an ERROR record on the ``idempotask``
    logger instead of the WARNING of every held unit, so that a held unit nobody resolved
    reaches an alert; ``idempotask list --held --older-than`` shows the same units.

    ``max_steps``, ``max_step_bytes``: how many steps (``idempotask.context().step(...)``) one
    body may record (100 unless set: one more is a ``StepError`` of kind ``too_many``), and how
    long one step's journal entry may be in bytes (64 KiB: a longer value is recorded as
    unstorable, and a rerun gets a ``CodecError`` for that step instead of running it again).

    ``on_replay``: a function of the replayed value and its ``UnitRecord`` (task, key, fencing
    token), called on each replay only, before the value is returned (an ``async def`` one is
    awaited, in an ``async def`` task). An ``Exception`` in it is logged (a WARNING of the
    ``idempotask`` logger, with the traceback) and the value returned all the same; what it
    returns is ignored.
    """

    def decorate(function: Callable[..., Any]) -> Any:
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            raise TypeError(
                f"{getattr(function, '__qualname__', function)!s} is a generator function: its call returns before any work runs, so there is no result to record; return a list instead"
            )
        options = dict(
            lock_ttl=lock_ttl, result_ttl=result_ttl, renew=renew, fencing=fencing, log_key=log_key,
            in_doubt=in_doubt, doubt_memory=doubt_memory, hold_alert_after=hold_alert_after,
            max_attempts=max_attempts, max_wait=max_wait,
            initial_backoff=initial_backoff, max_backoff=max_backoff,
            max_steps=max_steps, max_step_bytes=max_step_bytes,
        )
        spec = _Spec(
            function, key, name, fingerprint, on_busy, store, options, reconcile, on_unrecorded, result_serializer, on_replay
        )
        return _async(spec) if inspect.iscoroutinefunction(function) else _sync(spec)

    # `Decorator`'s overloads say what `decorate` makes of a function.
    return decorate


def _unit_of(spec: _Spec) -> Callable[..., Tuple[str, Optional[str]]]:
    def unit(*args: Any, **kwargs: Any) -> Tuple[str, Optional[str]]:
        """The key and the fingerprint (hex) a call with these arguments has; nothing runs."""
        key, fingerprint, _ = spec.unit(args, kwargs)
        return key, None if fingerprint is None else _native.fingerprint(fingerprint)

    return unit
