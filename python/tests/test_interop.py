"""A Rust worker and a Python worker on the same units at once, on one Redis.

The Rust worker is the example `examples/shared_units.rs` (its path in
``IDEMPOTASK_SHARED_UNITS``; scripts/test-python.sh builds it). It settles orders 1..N in
ascending order, this test's Python worker settles the same orders in descending order, both at
once and several at a time, with the same task name, key template and fingerprint. Each
settlement pushes ``<side>:<order>`` onto a Redis list, the side effect nobody takes back; each
answers a value with an integer above 2^100, text beyond ASCII and nested objects.

Every order is settled exactly once overall, each side executed some and was answered the
other's for others (both ways), and every replayed value is the one the other side computed.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Set, Tuple

import redis

from idempotask import idempotent_task

ORDERS = 200
THREADS = 8
LEDGER = "ledger:settlements"

_ledger_client: Dict[str, redis.Redis] = {}
_settled_here: Set[int] = set()
_settled_lock = threading.Lock()


def _ledger() -> redis.Redis:
    # One client for every thread: its pool hands each thread a connection of its own.
    return _ledger_client["client"]


# The Rust worker's task: the same name, key template and fingerprint list.
@idempotent_task(key="order-settle-{order_id}", fingerprint=["amount_cents"], lock_ttl=10)
def settle_order(order_id: int, amount_cents: int) -> Dict[str, Any]:
    time.sleep(0.005)  # the settlement's own time, so that the other side meets units in flight
    _ledger().rpush(LEDGER, f"python:{order_id}")
    with _settled_lock:
        _settled_here.add(order_id)
    return {
        "order_id": order_id,
        "settled_by": "python",
        "total": 2**100 + order_id * amount_cents,
        "note": f"reçu ✓ 注文 {order_id} 🚀",
        "lines": [{"sku": "A-1", "quantity": 2, "price": 12.5}, {"sku": "Ω", "quantity": 1, "price": 0.1}],
        "meta": {"flags": [True, False], "coupon": None},
    }


def _amount_cents(order_id: int) -> int:
    return order_id * 100 + 99


def _rust_worker() -> str:
    path = os.environ.get("IDEMPOTASK_SHARED_UNITS")
    if not path:
        raise RuntimeError(
            "IDEMPOTASK_SHARED_UNITS is not set: run through scripts/test-python.sh, which builds "
            "the example shared_units and sets it to the binary's path"
        )
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"IDEMPOTASK_SHARED_UNITS={path} is not an executable")
    return path


def _parse(lines: List[str]) -> Tuple[Dict[int, Tuple[str, Any]], Dict[str, int]]:
    """The Rust worker's lines: per order, how it went and the value; and its totals."""
    per_order: Dict[int, Tuple[str, Any]] = {}
    totals: Dict[str, int] = {}
    for line in lines:
        if line.startswith("order "):
            head, how_value = line[len("order "):].split(": ", 1)
            how, value = how_value.split(" ", 1)
            assert int(head) not in per_order, f"order {head} answered twice: {line}"
            per_order[int(head)] = (how, json.loads(value))
        elif ": " in line:
            label, number = line.split(": ", 1)
            totals[label] = int(number)
    return per_order, totals


def test_a_rust_and_a_python_worker_share_units_both_ways(store: Any, redis_server: Any, redis_client: redis.Redis) -> None:
    _ledger_client["client"] = redis_client
    _settled_here.clear()
    rust = subprocess.Popen(
        [_rust_worker()],
        env={**os.environ, "REDIS_URL": redis_server.url, "ORDERS": str(ORDERS), "CONCURRENCY": str(THREADS)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
    )
    try:
        assert rust.stdout is not None and rust.stdin is not None
        first = rust.stdout.readline()
        assert first == "ready\n", f"the Rust worker did not start: {first!r} {rust.stderr.read() if rust.stderr else ''}"
        # The Rust worker's lines are read as they come, so that it never blocks on a full pipe.
        rust_lines: List[str] = []
        reader = threading.Thread(target=lambda: rust_lines.extend(line.rstrip("\n") for line in rust.stdout))
        reader.start()
        # Both start now: the Rust worker on its line of input, the Python threads at once.
        rust.stdin.write("go\n")
        rust.stdin.flush()
        orders = list(range(ORDERS, 0, -1))
        with ThreadPoolExecutor(THREADS) as pool:
            python_values = dict(zip(orders, pool.map(lambda o: settle_order(o, _amount_cents(o)), orders)))
        assert rust.wait(timeout=120) == 0, rust.stderr.read() if rust.stderr else ""
        reader.join()
    finally:
        if rust.poll() is None:
            rust.kill()
            rust.wait()
    rust_answers, rust_totals = _parse(rust_lines)

    # Every order settled exactly once overall, by the side that says it executed it.
    ledger = [entry.decode() for entry in redis_client.lrange(LEDGER, 0, -1)]
    settled_by: Dict[int, List[str]] = {}
    for entry in ledger:
        side, order = entry.split(":")
        settled_by.setdefault(int(order), []).append(side)
    rust_executed = {order for order, (how, _) in rust_answers.items() if how == "executed"}
    python_executed = set(_settled_here)
    ran_twice = sorted(order for order, sides in settled_by.items() if len(sides) > 1)
    print(
        f"\ninterop: units {ORDERS}, executed by Rust {len(rust_executed)}, by Python {len(python_executed)}, "
        f"replayed in Rust {ORDERS - len(rust_executed)}, in Python {ORDERS - len(python_executed)}, "
        f"side effects {len(ledger)}, ran twice {len(ran_twice)}"
    )
    assert ran_twice == []
    assert sorted(settled_by) == list(range(1, ORDERS + 1))
    assert len(ledger) == ORDERS
    assert rust_executed == {o for o, sides in settled_by.items() if sides == ["rust"]}
    assert python_executed == {o for o, sides in settled_by.items() if sides == ["python"]}
    assert rust_executed.isdisjoint(python_executed)

    # Each side answered every order, and the Rust worker's totals agree with its lines.
    assert sorted(rust_answers) == list(range(1, ORDERS + 1))
    assert sorted(python_values) == list(range(1, ORDERS + 1))
    assert rust_totals == {"executed": len(rust_executed), "replayed": ORDERS - len(rust_executed)}

    # Both ways: each side was answered units the other executed, with the other's value.
    replayed_in_python = rust_executed
    replayed_in_rust = python_executed
    assert replayed_in_python and replayed_in_rust, "each side must replay some of the other's units"
    for order in replayed_in_python:
        value = python_values[order]
        assert value == rust_answers[order][1]
        assert value["settled_by"] == "rust"
        assert value["total"] == 2**100 + order * _amount_cents(order) and isinstance(value["total"], int)
        assert value["note"] == f"reçu ✓ 注文 {order} 🚀"
    for order in replayed_in_rust:
        how, value = rust_answers[order]
        assert how == "replayed"
        assert value == python_values[order]
        assert value["settled_by"] == "python"
        assert value["total"] == 2**100 + order * _amount_cents(order)
        assert value["lines"][1] == {"sku": "Ω", "quantity": 1, "price": 0.1}
