"""A call's outcome, as the Rust core's ``run_reported`` gives it: ``Report``, ``Outcome``, and
what an unrecorded result raises or warns (``ResultNotRecorded``, ``UnrecordedResultWarning``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Optional, TypeVar

from ._native import IdempotaskError

__all__ = ["Outcome", "Report", "ResultNotRecorded", "UnrecordedResultWarning"]

T = TypeVar("T")

_KINDS = ("executed", "replayed", "reconciled", "lock_lost", "marker_not_written")
# The kinds under which the body's result is recorded as the call's: any other one (a kind this
# build does not know too) is warned of, or raised with `on_unrecorded="raise"`.
RECORDED_KINDS = frozenset(("executed", "replayed", "reconciled"))


@dataclass(frozen=True)
class Outcome:
    """How one call ended, the Rust core's ``Outcome`` (``kind`` is its variant in snake case).

    - ``executed``: the body ran, its result was stored, and the lock was held until the store
      confirmed it: no other delivery could have run the body meanwhile.
    - ``replayed``: the unit was done; the stored result was returned, the body did not run.
    - ``reconciled``: the unit was in doubt and the reconcile function found the work done; its
      answer was stored, the body did not run.
    - ``lock_lost``: the body ran, but its lock had expired (or may have: the store's answer to
      the completion came after the lock's time) before its result was recorded: another
      delivery may have run it too. ``marker_written`` says whether this call's result was
      stored all the same (no other result existed).
    - ``marker_not_written``: the body ran, but the store did not confirm its result within the
      lock TTL, and reading the unit back did not find it: a delivery after the lock expires
      may run the body again.

    Compare with the constants (``report.outcome == Outcome.EXECUTED``) or match on the fields
    (``case Outcome(kind="lock_lost", marker_written=False)``).
    """

    kind: str
    marker_written: bool = True
    """Whether the unit's completion marker is in the store as far as this call knows: false
    for ``marker_not_written`` and for a ``lock_lost`` whose result was not stored."""

    EXECUTED: ClassVar["Outcome"]
    REPLAYED: ClassVar["Outcome"]
    RECONCILED: ClassVar["Outcome"]
    MARKER_NOT_WRITTEN: ClassVar["Outcome"]

    @staticmethod
    def lock_lost(marker_written: bool) -> "Outcome":
        """The ``lock_lost`` outcome."""
        return Outcome("lock_lost", marker_written)

    @property
    def recorded(self) -> bool:
        """Whether the body's result is recorded as this call's, under a lock it held through the
        end: false for ``lock_lost`` and ``marker_not_written``, the outcomes a caller is
        warned of (``UnrecordedResultWarning``)."""
        return self.kind in RECORDED_KINDS


Outcome.EXECUTED = Outcome("executed")
Outcome.REPLAYED = Outcome("replayed")
Outcome.RECONCILED = Outcome("reconciled")
Outcome.MARKER_NOT_WRITTEN = Outcome("marker_not_written", False)


def outcome_of(kind: str, marker_written: bool) -> Outcome:
    """The ``Outcome`` of a ``done`` event's outcome name and marker flag."""
    if kind not in _KINDS:
        # A variant this build does not know: said as it is, never as a success.
        return Outcome(kind, False)
    return Outcome(kind, marker_written)


@dataclass(frozen=True)
class Report(Generic[T]):
    """A call's value and how it ended (``task.run_reported(...)``), as the Rust core's
    ``Report``."""

    value: T
    """The body's value (``executed``, ``lock_lost``, ``marker_not_written``), the stored
    result (``replayed``) or the reconcile function's (``reconciled``)."""
    outcome: Outcome
    fencing_token: Optional[int] = None
    """The fencing token of the execution that produced the value, for a task with
    ``fencing=True``."""


class UnrecordedResultWarning(RuntimeWarning):
    """The body returned, but its result is not recorded as it should be (outcome ``lock_lost``
    or ``marker_not_written``): a redelivery may run the body again, or another delivery may have
    run it beside this one. A ``RuntimeWarning``: it reports what happened at run time (a store
    that refused or lost the write, a lock that lapsed), not a misuse of the API in the code."""


class ResultNotRecorded(IdempotaskError):
    """Raised instead of ``UnrecordedResultWarning`` by a task with ``on_unrecorded="raise"``:
    the body ran and returned ``value``, but ``outcome`` says its result is not recorded as it
    should be. The side effect happened: do not simply run the work again."""

    def __init__(self, message: str, value: Any, outcome: Outcome, task: str, key: str) -> None:
        super().__init__(message)
        self.value = value
        """The body's value."""
        self.outcome = outcome
        """How the call ended: ``lock_lost`` or ``marker_not_written``."""
        self.task = task
        """The task's name."""
        self.key = key
        """The key, as the task shows it (its digest with ``log_key="hash"``)."""

    def __reduce__(self) -> Any:
        # Pickled with every field (Celery's result backends, multiprocessing): the default
        # rebuilds an exception from its message alone, which this constructor refuses.
        return (type(self), (str(self), self.value, self.outcome, self.task, self.key))
