"""The local result cache (#55): ``LocalResultCache(store, max_items=...)`` answers a duplicate
of a unit this process saw completed without the store (no command reaches Redis, counted by the
server's ``INFO commandstats``), keeps no lock or unit in progress, and refuses a size of 0."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List

import pytest
import redis

from idempotask import KeyReuse, LocalResultCache, MemoryStore, Outcome, RedisStore, idempotent_task



def _commands(client: redis.Redis) -> Dict[str, int]:
    """The data commands the server ran since the last reset, leaving out the measuring ones."""
    stats = client.info("commandstats")
    return {
        name[len("cmdstat_"):]: fields["calls"]
        for name, fields in stats.items()
        if not name.startswith(("cmdstat_config", "cmdstat_info"))
    }


@dataclass
class Charge:
    id: str
    amount_cents: int


def test_a_cached_duplicate_sends_redis_no_command(
    redis_server: Any, redis_client: redis.Redis, name: str
) -> None:
    ran: List[int] = []
    store = LocalResultCache(RedisStore(redis_server.url), max_items=100)

    @idempotent_task(key="order-{order_id}", name=name, store=store, fingerprint=["amount_cents"])
    def charge(order_id: int, amount_cents: int) -> Charge:
        ran.append(order_id)
        return Charge(f"ch_{order_id}", amount_cents)

    first = charge(1, 1200)
    redis_client.config_resetstat()
    for _ in range(10):
        again = charge.run_reported(1, 1200)
        assert again.outcome == Outcome.REPLAYED
        assert again.value == first and type(again.value) is Charge
    assert _commands(redis_client) == {}, "ten duplicates, no command"
    assert ran == [1]
    # The fingerprint is still checked against the cached result.
    with pytest.raises(KeyReuse):
        charge(1, 1300)
    assert _commands(redis_client) == {}

    # The same duplicates without the cache: one command each.
    @idempotent_task(key="order-{order_id}", name=f"{name}_uncached", store=RedisStore(redis_server.url),
                     fingerprint=["amount_cents"])
    def uncached(order_id: int, amount_cents: int) -> Charge:
        ran.append(order_id)
        return Charge(f"ch_{order_id}", amount_cents)

    uncached(1, 1200)
    redis_client.config_resetstat()
    for _ in range(10):
        assert uncached(1, 1200) == first
    assert sum(_commands(redis_client).values()) == 10
    assert ran == [1, 1]


def test_concurrent_fresh_deliveries_still_meet_at_the_lock(any_store: Any, name: str) -> None:
    ran: List[int] = []
    store = LocalResultCache(any_store, max_items=100)
    gate = threading.Barrier(8)

    @idempotent_task(key="order-{order_id}", name=name, store=store, max_wait=30)
    def charge(order_id: int) -> str:
        ran.append(order_id)
        return f"ch_{order_id}"

    answers: List[str] = []

    def deliver() -> None:
        gate.wait()
        answers.append(charge(1))

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ran == [1]
    assert answers == ["ch_1"] * 8


def test_bad_settings_are_refused_when_the_cache_is_made() -> None:
    with pytest.raises(ValueError, match="max_items must be at least 1"):
        LocalResultCache(MemoryStore(), max_items=0)
    with pytest.raises(ValueError, match="max_items must be at least 1"):
        LocalResultCache(MemoryStore(), max_items=-5)
    with pytest.raises(ValueError, match="max_marker_bytes"):
        LocalResultCache(MemoryStore(), max_items=10, max_marker_bytes=-1)
    with pytest.raises(TypeError, match="expected an idempotask store"):
        LocalResultCache("redis://127.0.0.1", max_items=10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LocalResultCache(MemoryStore())  # type: ignore[call-arg]


def test_its_repr_names_the_store_and_hides_passwords() -> None:
    cache = LocalResultCache(RedisStore("redis://user:secret@127.0.0.1:6379"), max_items=5, max_age=60)
    text = repr(cache)
    assert "secret" not in text
    assert text.startswith("LocalResultCache(RedisStore(") and "max_items=5" in text


def test_it_wraps_the_store_object_it_is_given(redis_server: Any, redis_client: redis.Redis) -> None:
    """The cache sits in front of that very store object's store in this process: wrapping a
    connected ``RedisStore`` opens no second connection to the server."""
    bare = RedisStore(redis_server.url)
    bare.check()
    connected = len(redis_client.client_list())
    cached = LocalResultCache(bare, max_items=10)
    cached.check()
    assert len(redis_client.client_list()) == connected, "the wrapped store's connection is reused"


def test_a_forked_child_starts_with_an_empty_cache(
    redis_server: Any, redis_client: redis.Redis, name: str
) -> None:
    """A child does not answer from the entries it inherited: its duplicate asks the store (and
    still replays), and the parent's entry keeps answering the parent without a command."""
    store = LocalResultCache(RedisStore(redis_server.url), max_items=10)

    @idempotent_task(key="job-{n}", name=name, store=store)
    def job(n: int) -> str:
        return f"{os.getpid()}-{n}"

    first = job(1)
    redis_client.config_resetstat()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if job.run_reported(1).value == first else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # Its connection's own commands (HELLO, CLIENT SETINFO...) left out: a unit's.
    asked = {command for command in _commands(redis_client) if command.split("|")[0] not in ("hello", "client", "ping", "select", "auth")}
    assert asked, "the child asked the store"
    redis_client.config_resetstat()
    again = job.run_reported(1)
    assert again.outcome == Outcome.REPLAYED and again.value == first
    assert _commands(redis_client) == {}, "the parent's entry still answers"
