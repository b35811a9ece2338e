"""``Reconciled``: what a task's ``reconcile=`` function found out about a unit in doubt."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

__all__ = ["Reconciled"]

T = TypeVar("T")

_NOTHING: Any = object()


class Reconciled(Generic[T]):
    """The answer of a ``reconcile=`` function, the Rust core's ``Reconciled``:

    - ``Reconciled.done(value)``: the earlier delivery's work was done (the downstream system
      knows it); ``value`` is stored as the body's result would be, and the body does not run;
    - ``Reconciled.NOT_DONE``: the work was not done; the body runs.

    To leave the unit in doubt (the downstream system could not be asked), raise.
    """

    __slots__ = ("_value",)

    NOT_DONE: ClassVar["Reconciled[Any]"]
    """The work was not done: the body runs."""

    def __init__(self, value: Any = _NOTHING, *, _token: Any = None) -> None:
        if _token is not _NOTHING:
            raise TypeError("use Reconciled.done(value) or Reconciled.NOT_DONE")
        self._value = value

    @staticmethod
    def done(value: T) -> "Reconciled[T]":
        """The work was done, with this result (a value ``json.dumps`` takes, as a body's)."""
        return Reconciled(value, _token=_NOTHING)

    @property
    def is_done(self) -> bool:
        """Whether the work was done."""
        return self._value is not _NOTHING

    @property
    def value(self) -> T:
        """The result of work that was done; a ``ValueError`` for ``NOT_DONE``."""
        if self._value is _NOTHING:
            raise ValueError("Reconciled.NOT_DONE has no value")
        return self._value  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reconciled):
            return NotImplemented
        return self._value is other._value or (
            self._value is not _NOTHING and other._value is not _NOTHING and bool(self._value == other._value)
        )

    __hash__ = None  # type: ignore[assignment]

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, "_value"):
            raise AttributeError("Reconciled is immutable")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return "Reconciled.NOT_DONE" if self._value is _NOTHING else f"Reconciled.done({self._value!r})"


Reconciled.NOT_DONE = Reconciled(_token=_NOTHING)
