"""The shared test vectors (tests/vectors/units.json, made and checked by the Rust core in
tests/vectors.rs): the decorator makes the same keys and fingerprints of the same arguments,
replays a marker a Rust worker wrote, and writes the markers Rust writes."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import pathlib
from typing import Any, Callable, Dict, List

import pytest
import redis

from idempotask import _native, idempotent_task

VECTORS = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "tests" / "vectors" / "units.json").read_text(encoding="utf-8")
)
RAN: List[str] = []


# The Rust cases' tasks, with the same names, templates, fingerprint lists and bodies.
@idempotent_task(key="order-charge-{order_id}", fingerprint=["amount_cents"])
def charge_customer(order_id: int, amount_cents: int) -> str:
    RAN.append("charge_customer")
    return f"ch_{order_id}_{amount_cents}"


@idempotent_task(key="ledger-{account}")
def ledger_total(account: str) -> int:
    RAN.append("ledger_total")
    return (1 << 100) + len(account.encode())


@dataclasses.dataclass
class Receipt:
    """The Rust task's result object as a dataclass (#55): Rust's marker replays as it, and its
    fields, in this order, are the bytes Rust writes."""

    lines: int
    nested: Dict[str, Any]
    note: str
    to: str


@idempotent_task(key="receipt-{order_id}-{resend}", fingerprint=["email", "items", "ratio"])
def send_receipt(order_id: int, resend: bool, email: str, items: List[Dict[str, Any]], ratio: float) -> Receipt:
    RAN.append("send_receipt")
    return Receipt(len(items), {"a": True, "b": [1, 2.5, None]}, "reçu ✓", email)


@idempotent_task(key="fx-{rate}-{flag}")
def convert(rate: float, flag: bool) -> None:
    RAN.append("convert")


@idempotent_task(key="sensor-{sensor}", fingerprint=["readings"])
def record_readings(sensor: int, readings: List[float]) -> List[float]:
    RAN.append("record_readings")
    return readings[::-1]


TASKS: Dict[str, Callable[..., Any]] = {
    "charge_customer": charge_customer,
    "ledger_total": ledger_total,
    "send_receipt": send_receipt,
    "convert": convert,
    "record_readings": record_readings,
}
CASES = VECTORS["units"]


def _made_of(case: Dict[str, Any]) -> Callable[..., Any]:
    """A task made of a case alone, for a task this file does not write by hand (fingerprint
    paths, #55, and any case added on the Rust side): the case's name, key template and
    fingerprint list as the decorator takes them (`"order.amount"` for Rust's `order.amount`),
    its arguments as parameters, and a body that returns its result."""

    def body(**arguments: Any) -> Any:
        RAN.append(case["task"])
        return json.loads(case["result_json"])

    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in case["arguments"]]
    body.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return idempotent_task(key=case["key_template"], name=case["task"], fingerprint=case["fingerprint"] or None)(body)


for _case in CASES:
    if _case["task"] not in TASKS:
        TASKS[_case["task"]] = _made_of(_case)


def _id(case: Dict[str, Any]) -> str:
    return case["key"]


def test_the_vectors_cover_every_hand_written_task() -> None:
    assert {case["task"] for case in CASES} >= {"charge_customer", "ledger_total", "send_receipt", "convert", "record_readings"}


def test_a_case_with_a_fingerprint_path_makes_its_task() -> None:
    # The shape of Rust's `fingerprint = [order.amount, currency]` case, before the vectors
    # hold it: the fingerprint is the list of the selected values.
    case = {
        "task": "vector_path_probe",
        "key_template": "price-{order.sku}",
        "fingerprint": ["order.amount", "currency"],
        "arguments": {"order": {"amount": 1200, "sku": "x"}, "currency": "EUR"},
        "result_json": "1",
    }
    task = _made_of(case)
    assert task.idempotask_unit(**case["arguments"]) == ("price-x", _native.fingerprint('[1200,"EUR"]'))


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_the_same_key_and_fingerprint_as_rust(case: Dict[str, Any]) -> None:
    task = TASKS[case["task"]]
    assert task.idempotask_name == case["task"]
    assert task.idempotask_unit(**case["arguments"]) == (case["key"], case["fingerprint_hex"])


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_rust_marker_decodes_to_its_result(case: Dict[str, Any]) -> None:
    key, fingerprint, _, result = _native.decode_marker(base64.b64decode(case["marker_base64"]))
    assert (key, fingerprint, result) == (case["key"], case["fingerprint_hex"], case["result_json"])


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_rust_marker_is_replayed_without_running(case: Dict[str, Any], store: Any, redis_client: redis.Redis) -> None:
    redis_client.set(case["redis_key"], base64.b64decode(case["marker_base64"]))
    RAN.clear()
    result = TASKS[case["task"]](**case["arguments"])
    assert RAN == []
    if case["task"] == "send_receipt":
        assert type(result) is Receipt
        result = dataclasses.asdict(result)
    assert result == json.loads(case["result_json"])


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_python_writes_the_marker_rust_writes(case: Dict[str, Any], store: Any, redis_client: redis.Redis) -> None:
    RAN.clear()
    TASKS[case["task"]](**case["arguments"])
    assert RAN == [case["task"]]
    stored = redis_client.get(case["redis_key"])
    assert stored is not None, "the unit's Redis key is Rust's"
    key, fingerprint, _, result = _native.decode_marker(stored)
    assert (key, fingerprint, result) == (case["key"], case["fingerprint_hex"], case["result_json"])
