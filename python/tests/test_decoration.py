"""Mistakes found when the decorator is applied (at import), as the Rust attribute finds them
at compile time; and the keys and fingerprints it makes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from idempotask import idempotent_task


def _decorate(name: str, **options: Any) -> Any:
    def charge_customer(order_id: int, amount_cents: int) -> str:
        return "ch"

    return idempotent_task(name=name, **options)(charge_customer)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"key": "order-charge-{ordr_id}"}, "`ordr_id` is not a parameter of this function; did you mean `order_id`?"),
        ({"key": "order-charge"}, "names no parameter"),
        ({"key": "order-{}"}, "empty placeholder"),
        ({"key": "order-{order_id:>8}"}, "format spec"),
        ({"key": "order-{order_id!r}"}, "format spec or conversion"),
        ({"key": "order-{order_id"}, "literal brace"),
        ({"key": "order-{order_id}}"}, "literal brace"),
        ({"key": "order-{order_id[0]}"}, "not a parameter or a field of one"),
        ({"key": "order-{order_id}", "fingerprint": ["order_id"]}, "`order_id` is part of the key"),
        ({"key": "order-{order_id}", "fingerprint": ["amount"]}, "did you mean `amount_cents`?"),
        ({"key": "order-{order_id}", "lock_ttl": 0.05}, "lock_ttl must be at least 100 ms"),
        ({"key": "order-{order_id}", "lock_ttl": 60, "result_ttl": 30}, "result_ttl must be at least lock_ttl"),
        ({"key": "order-{order_id}", "in_doubt": "maybe"}, 'in_doubt must be "rerun" or "hold"'),
        ({"key": "order-{order_id}", "log_key": "secret"}, 'log_key must be "plain" or "hash"'),
        ({"key": "order-{order_id}", "on_busy": "later"}, "on_busy must be one of"),
        ({"key": "order-{order_id}", "name": "not a name!"}, "task name"),
    ],
)
def test_mistakes_are_errors_when_the_decorator_is_applied(name: str, options: Any, message: str) -> None:
    options.setdefault("name", name)
    with pytest.raises(ValueError) as error:
        idempotent_task(**options)(lambda order_id, amount_cents: None)
    assert message in str(error.value)


def test_self_is_not_a_parameter_of_the_key(name: str) -> None:
    with pytest.raises(ValueError, match="`self` is not a parameter"):

        @idempotent_task(key="order-{self}", name=name)
        def charge_customer(self: Any, order_id: int) -> str:
            return "ch"


def test_two_functions_with_one_task_name_are_refused(name: str) -> None:
    _decorate(name, key="order-{order_id}")
    with pytest.raises(ValueError, match="is taken by"):

        @idempotent_task(key="order-{order_id}", name=name)
        def other(order_id: int) -> None:
            pass


def test_the_default_name_is_the_function_name_as_in_rust() -> None:
    @idempotent_task(key="refund-{order_id}")
    def refund_order_for_name_test(order_id: int) -> None:
        pass

    assert refund_order_for_name_test.idempotask_name == "refund_order_for_name_test"


def test_keys_are_written_as_rust_displays_the_same_values(name: str) -> None:
    @idempotent_task(key="k-{a}-{b}-{c}-{d}-{e.id}-{{literal}}", name=name, lock_ttl=timedelta(seconds=5))
    def task(a: int, b: bool, c: float, d: str, e: Any) -> None:
        pass

    key, fingerprint = task.idempotask_unit(-7, True, 1.0, "x|y", {"id": 3})
    assert key == "k--7-true-1-x|y-3-{literal}"
    assert fingerprint is None
    assert task.idempotask_unit(0, False, 1e20, "", {"id": "é"})[0] == "k-0-false-100000000000000000000--é-{literal}"
    assert task.idempotask_unit(0, False, 0.1, "", {"id": 1})[0] == "k-0-false-0.1--1-{literal}"


def test_fingerprint_true_is_every_parameter_not_in_the_key(name: str) -> None:
    fingerprinted = _decorate(name, key="order-{order_id}", fingerprint=True)
    listed = _decorate(name + "_listed", key="order-{order_id}", fingerprint=["amount_cents"])
    assert fingerprinted.idempotask_unit(1, 100) == listed.idempotask_unit(1, 100)
    assert fingerprinted.idempotask_unit(1, 100) != fingerprinted.idempotask_unit(1, 101)
