"""Type stubs of ``idempotask._native``, the Rust extension module (PyO3)."""

from datetime import timedelta
from typing import Any, Callable, List, Optional, Tuple, Union

_Seconds = Union[int, float, timedelta]

class IdempotaskError(Exception):
    """Every error of idempotask's own (never the task's exceptions, which propagate as raised)."""

class Contended(IdempotaskError):
    """Another delivery holds the unit's lock: nothing ran."""

    lock_ttl_remaining: Optional[float]
    """The holder's remaining lock time in seconds, when the store said."""
    attempts: int
    """How many times this call asked for the lock."""

class InDoubt(IdempotaskError):
    """The unit is in doubt and the task holds such units (``in_doubt="hold"``): nothing ran."""

    expired_for: float
    fencing_token: Optional[int]

class KeyReuse(IdempotaskError):
    """The key was used before with different fingerprinted arguments: nothing ran."""

class StoreError(IdempotaskError):
    """The store could not be reached or did not answer in time."""

    ambiguous: bool
    kind: str

class CodecError(IdempotaskError):
    """A result could not be stored or read back, or the arguments could not be fingerprinted."""

    kind: str
    """``fingerprint`` (the fingerprinted arguments have no JSON text, or a fingerprint path
    names no field of them: nothing ran), ``unstorable`` (the first execution's result had
    none, or did not fit the task's result type), ``unreadable`` (a damaged marker) or
    ``undecodable`` (the stored result does not fit the task's result type: the body does not
    run again)."""

class LockNotHeld(IdempotaskError):
    """This delivery's lock was taken over by another delivery: the step did not run."""

class StepError(IdempotaskError):
    """A step could not run or be replayed."""

    kind: str
    """``order_changed``, ``too_many``, ``overlapping``, ``unsupported`` (nothing ran) or
    ``unrecorded`` (the effect happened, its record was not confirmed)."""

class MemoryStore:
    def __init__(self) -> None: ...
    def check(self) -> None: ...

class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        namespace: Optional[str] = None,
        connection_timeout: Optional[_Seconds] = None,
        response_timeout: Optional[_Seconds] = None,
    ) -> None: ...
    def check(self) -> None: ...

class RedisClusterStore:
    def __init__(
        self,
        urls: List[str],
        *,
        namespace: Optional[str] = None,
        connection_timeout: Optional[_Seconds] = None,
        response_timeout: Optional[_Seconds] = None,
    ) -> None: ...
    def check(self) -> None: ...

class PostgresStore:
    def __init__(self, url: str, *, table: Optional[str] = None, migrate: bool = False) -> None: ...
    def check(self) -> None: ...

class LocalResultCache:
    """Another store behind a bounded cache, in this process, of the results of the units it
    saw completed: a duplicate of one of them is answered without the store. A ``forget`` made
    through another process reaches its entries only when they expire (``max_age`` bounds
    that)."""

    def __init__(
        self,
        store: "_Store",
        *,
        max_items: int,
        max_age: Optional[_Seconds] = None,
        max_marker_bytes: Optional[int] = None,
    ) -> None: ...
    def check(self) -> None: ...

_Store = Union[MemoryStore, RedisStore, RedisClusterStore, PostgresStore, LocalResultCache]

class Pending:
    def wait(self) -> Tuple[Any, ...]: ...
    def wait_async(self, event_loop: Any, resolve: Callable[[Any, bool, Any], None]) -> Any: ...
    def finish(self, json: str) -> None: ...
    def unstorable(self, reason: str) -> None: ...
    def fail(self) -> None: ...
    def reconciled(self, json: str) -> None: ...
    def reconciled_unstorable(self, reason: str) -> None: ...
    def not_done(self) -> None: ...
    def step(self, name: str, part: Optional[str] = None, policy: str = "rerun") -> StepCall: ...
    def cancel(self) -> None: ...

class StepCall:
    def wait(self) -> Tuple[Any, ...]: ...
    def wait_async(self, event_loop: Any, resolve: Callable[[Any, bool, Any], None]) -> Any: ...
    def finish(self, json: str) -> None: ...
    def unstorable(self, reason: str) -> None: ...
    def fail(self) -> None: ...
    def reconciled(self, json: str) -> None: ...
    def reconciled_unstorable(self, reason: str) -> None: ...
    def not_done(self) -> None: ...
    def cancel(self) -> None: ...

class Task:
    def __init__(
        self,
        name: str,
        *,
        lock_ttl: Optional[_Seconds] = None,
        result_ttl: Optional[_Seconds] = None,
        renew: bool = False,
        fencing: bool = False,
        log_key: Optional[str] = None,
        in_doubt: Optional[str] = None,
        doubt_memory: Optional[_Seconds] = None,
        hold_alert_after: Optional[_Seconds] = None,
        max_attempts: Optional[int] = None,
        max_wait: Optional[_Seconds] = None,
        initial_backoff: Optional[_Seconds] = None,
        max_backoff: Optional[_Seconds] = None,
        reconcile: bool = False,
        max_steps: Optional[int] = None,
        max_step_bytes: Optional[int] = None,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def lock_ttl(self) -> float: ...
    def shown_key(self, key: str) -> str: ...
    def start(
        self, store: _Store, key: str, fingerprint: Optional[str] = None, wait: bool = True
    ) -> Pending: ...

def fingerprint(json: str) -> str: ...
def decode_marker(marker: bytes) -> Tuple[str, Optional[str], Optional[int], Optional[str]]: ...
def flush_logs() -> None: ...
def settle_handovers() -> None: ...
def queued_records() -> int: ...
