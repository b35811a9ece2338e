"""The tests' own redis-server, on a free loopback port, as the Rust tests start theirs
(test-support's RedisServer): persistence off, stopped at the end. A missing redis-server fails
the tests and says what to install; nothing is skipped."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any, Iterator

import pytest
import redis

import idempotask


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    def __init__(self) -> None:
        program = shutil.which("redis-server")
        if program is None:
            raise RuntimeError(
                "redis-server is not installed; scripts/install-servers.sh (run by scripts/test.sh) installs it"
            )
        self.dir = tempfile.mkdtemp(prefix="idempotask-python-redis-")
        last = ""
        for _ in range(5):
            self.port = _free_port()
            self.process = subprocess.Popen(
                [program, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--protected-mode", "no", "--dir", self.dir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._answers():
                return
            self.process.kill()
            self.process.wait()
            last = f"exited with {self.process.returncode}"
        raise RuntimeError(f"redis-server did not come up: {last}")

    def _answers(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                time.sleep(0.01)  # polling a starting server: nothing to wait on but its port
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_server.port)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def store(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[idempotask.RedisStore]:
    """A Redis store, installed for the test and on a flushed server."""
    store = idempotask.RedisStore(redis_server.url)
    previous = idempotask.install(store)
    yield store
    if previous is not None:
        idempotask.install(previous)


@pytest.fixture(params=["memory", "redis"])
def any_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A test that takes it runs on a fresh in-memory store and on a flushed Redis."""
    if request.param == "memory":
        yield idempotask.MemoryStore()
        return
    server = request.getfixturevalue("redis_server")
    request.getfixturevalue("redis_client")  # flushes the server
    yield idempotask.RedisStore(server.url)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A task name of the test's own: task names are process-wide."""
    return "t_" + re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:90] + f"_{os.getpid()}"


class Servers:
    """Valkey 8.1, a Redis Cluster and PostgreSQL, started by test-support's ``servers`` binary
    (its path in ``IDEMPOTASK_SERVERS``; scripts/test-python.sh builds it and sets it), which
    prints ``name=value`` lines, then ``ready``, and stops them all when its standard input
    closes."""

    def __init__(self) -> None:
        path = os.environ.get("IDEMPOTASK_SERVERS")
        if not path:
            raise RuntimeError(
                "IDEMPOTASK_SERVERS is not set: run through scripts/test-python.sh, which builds "
                "test-support's `servers` binary and sets it to the binary's path"
            )
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"IDEMPOTASK_SERVERS={path} is not an executable")
        self.process = subprocess.Popen(
            [path, "valkey", "cluster", "postgres"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.values: dict = {}
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.strip()
            if line == "ready":
                return
            name, _, value = line.partition("=")
            self.values[name] = value
        code = self.process.wait()
        raise RuntimeError(f"`servers valkey cluster postgres` exited with {code} before it was ready")

    @property
    def valkey_url(self) -> str:
        return str(self.values["valkey_url"])

    @property
    def cluster_urls(self) -> list:
        return str(self.values["cluster_urls"]).split(",")

    @property
    def postgres_url(self) -> str:
        return str(self.values["postgres_url"])

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    started = Servers()
    yield started
    started.stop()
