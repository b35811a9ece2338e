"""Every failure to fingerprint, encode or read back a Python value is a ``CodecError`` with a
``kind``, as the Rust core's ``Error::Codec`` has one: one test per kind a Python caller meets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List

import pytest
import redis

import idempotask
from idempotask import CodecError, MemoryStore, idempotent_task


@dataclass
class Payment:
    amount_cents: int


@dataclass
class Basket:
    skus: Any


class Opaque:
    """An object of no known structure: neither a dataclass nor a pydantic model."""


@pytest.fixture
def memory() -> Any:
    store = MemoryStore()
    previous = idempotask.install(store)
    yield store
    if previous is not None:
        idempotask.install(previous)


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _charge_task(name: str, ran: List[Any]) -> Any:
    @idempotent_task(key="order-{order_id}", name=name, fingerprint=["payment"])
    def charge(order_id: int, payment: Any) -> str:
        ran.append(order_id)
        return "ch"

    return charge


@pytest.mark.parametrize(
    "payment",
    [
        # A dataclass is fingerprinted as its fields (#55): one whose field has no JSON text
        # is refused as that field would be.
        pytest.param(Basket({1, 2}), id="dataclass_holding_a_set"),
        pytest.param(Opaque(), id="object"),
        pytest.param({1, 2}, id="set"),
        pytest.param({(1, 2): "a tuple as a name"}, id="dict_key"),
        pytest.param(_deep(200), id="deeper_than_the_core_reads"),
        pytest.param(_deep(100_000), id="deeper_than_json_writes"),
        pytest.param("\udc80", id="lone_surrogate"),
    ],
)
def test_fingerprinted_arguments_without_json_text_are_kind_fingerprint(memory: MemoryStore, name: str, payment: Any) -> None:
    ran: List[Any] = []
    charge = _charge_task(name, ran)
    with pytest.raises(CodecError) as refused:
        charge(1, payment)
    assert refused.value.kind == "fingerprint"
    assert isinstance(refused.value, idempotask.IdempotaskError)
    # The unit's fingerprint cannot be computed either: the same error, and nothing ran.
    with pytest.raises(CodecError) as unit:
        charge.idempotask_unit(1, payment)
    assert unit.value.kind == "fingerprint"
    assert ran == []


def test_a_cycle_in_fingerprinted_arguments_is_kind_fingerprint(memory: MemoryStore, name: str) -> None:
    cycle: List[Any] = []
    cycle.append(cycle)
    ran: List[Any] = []
    with pytest.raises(CodecError) as refused:
        _charge_task(name, ran)(1, cycle)
    assert refused.value.kind == "fingerprint"
    assert ran == []


def test_text_that_is_no_json_value_is_kind_fingerprint() -> None:
    with pytest.raises(CodecError) as refused:
        idempotask._native.fingerprint("[1,")
    assert refused.value.kind == "fingerprint"


def test_a_result_without_json_text_is_kind_unstorable_for_duplicates(memory: MemoryStore, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="order-{order_id}", name=name)
    def charge(order_id: int) -> Any:
        ran.append(order_id)
        return Payment(1200)

    assert charge(1) == Payment(1200)
    with pytest.raises(CodecError) as refused:
        charge(1)
    assert refused.value.kind == "unstorable"
    assert ran == [1]


def test_a_damaged_marker_is_kind_unreadable(store: Any, redis_client: redis.Redis, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="order-{order_id}", name=name)
    def charge(order_id: int) -> Any:
        ran.append(order_id)
        return {"charge": "ch"}

    assert charge(1) == {"charge": "ch"}
    (redis_key,) = redis_client.keys(f"idempotask:v2:default:{name}:*")
    marker = redis_client.get(redis_key)
    head, _, result = marker.rpartition(b"|")
    assert json.loads(result) == {"charge": "ch"}
    redis_client.set(redis_key, head + b"|{not json", keepttl=True)
    with pytest.raises(CodecError) as refused:
        charge(1)
    assert refused.value.kind == "unreadable"
    assert ran == [1]
