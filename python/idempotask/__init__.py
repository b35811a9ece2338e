"""idempotask for Python: functions run at most once per unit of work under at-least-once
delivery (Celery with ``acks_late``, any queue), on idempotask's Rust core and its stores.

    from idempotask import idempotent_task, RedisStore, install

    install(RedisStore("redis://127.0.0.1:6379/2"))

    @idempotent_task(key="order-charge-{order_id}", lock_ttl=30)
    def charge_customer(order_id: int, amount_cents: int) -> str:
        ...

Units, keys, fingerprints and completion markers are the Rust core's: a Python worker and a Rust
worker running tasks of the same name share their units. See docs/python.md.
"""

from ._context import StepName, TaskContext, context
from ._decorator import UnitRecord, idempotent_task, install, installed
from ._reconcile import Reconciled
from ._report import Outcome, Report, ResultNotRecorded, UnrecordedResultWarning
from ._results import Serializer
from ._native import (
    Contended,
    CodecError,
    IdempotaskError,
    InDoubt,
    KeyReuse,
    LocalResultCache,
    LockNotHeld,
    MemoryStore,
    PostgresStore,
    RedisClusterStore,
    RedisStore,
    StepError,
    StoreError,
)

__all__ = [
    "CodecError",
    "Contended",
    "IdempotaskError",
    "InDoubt",
    "KeyReuse",
    "LocalResultCache",
    "LockNotHeld",
    "MemoryStore",
    "Outcome",
    "PostgresStore",
    "RedisClusterStore",
    "Reconciled",
    "RedisStore",
    "Report",
    "ResultNotRecorded",
    "Serializer",
    "StepError",
    "StepName",
    "StoreError",
    "TaskContext",
    "UnitRecord",
    "UnrecordedResultWarning",
    "context",
    "idempotent_task",
    "install",
    "installed",
]
