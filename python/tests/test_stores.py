"""The core scenarios through the binding on the stores other than Redis: Valkey 8.1, a Redis
Cluster (3 masters, 3 replicas) and PostgreSQL, started by test-support's ``servers`` binary
(conftest's ``servers`` fixture). A store that cannot start fails the tests; none is skipped."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Iterator, List

import pytest

import idempotask
from idempotask import idempotent_task

_STORES: dict = {
    "valkey": lambda servers: idempotask.RedisStore(servers.valkey_url),
    "cluster": lambda servers: idempotask.RedisClusterStore(servers.cluster_urls),
    "postgres": lambda servers: idempotask.PostgresStore(servers.postgres_url, migrate=True),
}


@pytest.fixture(params=sorted(_STORES))
def other_store(request: pytest.FixtureRequest, servers: Any) -> Iterator[Any]:
    """Each store, installed for the test; units are kept apart by a fresh key prefix."""
    store = _STORES[request.param](servers)
    store.check()
    previous = idempotask.install(store)
    yield store
    if previous is not None:
        idempotask.install(previous)


@pytest.fixture
def prefix() -> str:
    return uuid.uuid4().hex[:12]


def test_fresh_then_duplicate_runs_once_and_replays(other_store: Any, name: str, prefix: str) -> None:
    gateway: List[int] = []

    @idempotent_task(key=prefix + "-order-{order_id}", name=name)
    def charge_customer(order_id: int, amount_cents: int) -> Any:
        gateway.append(order_id)
        return {"charge": f"ch_{order_id}", "amount": amount_cents, "big": 2**100}

    first = charge_customer(1, 500)
    assert charge_customer(1, 500) == first == {"charge": "ch_1", "amount": 500, "big": 2**100}
    assert charge_customer(2, 700)["charge"] == "ch_2"
    assert gateway == [1, 2]


def test_fired_from_threads_at_once_runs_once(other_store: Any, name: str, prefix: str) -> None:
    gateway: List[int] = []
    threads = 8
    start = threading.Barrier(threads)

    @idempotent_task(key=prefix + "-order-{order_id}", name=name, initial_backoff=0.005)
    def charge_customer(order_id: int) -> str:
        gateway.append(order_id)
        return f"ch_{order_id}"

    results: List[Any] = [None] * threads

    def deliver(i: int) -> None:
        start.wait()
        results[i] = charge_customer(7)

    workers = [threading.Thread(target=deliver, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert gateway == [7]
    assert results == ["ch_7"] * threads


def test_an_exception_releases_the_lock_and_is_not_cached(other_store: Any, name: str, prefix: str) -> None:
    attempts: List[int] = []
    declined = ValueError("card declined")

    # A lock far longer than the test: only a release lets the second delivery run at once.
    @idempotent_task(key=prefix + "-order-{order_id}", name=name, lock_ttl=600, on_busy="raise")
    def charge_customer(order_id: int) -> str:
        attempts.append(order_id)
        if len(attempts) == 1:
            raise declined
        return "ch_ok"

    with pytest.raises(ValueError) as raised:
        charge_customer(5)
    assert raised.value is declined
    assert charge_customer(5) == "ch_ok"
    assert charge_customer(5) == "ch_ok"
    assert attempts == [5, 5]
