"""The shared test vectors (tests/vectors/units.json, made and checked by the Rust core in
tests/vectors.rs): the decorator makes the same keys and fingerprints of the same arguments,
replays a marker a Rust worker wrote, and writes the markers Rust writes."""

from __future__ import annotations

import base64
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


@idempotent_task(key="receipt-{order_id}-{resend}", fingerprint=["email", "items", "ratio"])
def send_receipt(order_id: int, resend: bool, email: str, items: List[Dict[str, Any]], ratio: float) -> Any:
    RAN.append("send_receipt")
    return {"lines": len(items), "nested": {"a": True, "b": [1, 2.5, None]}, "note": "reçu ✓", "to": email}


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


def _id(case: Dict[str, Any]) -> str:
    return case["key"]


def test_the_vectors_cover_every_task() -> None:
    assert {case["task"] for case in CASES} == set(TASKS)


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
