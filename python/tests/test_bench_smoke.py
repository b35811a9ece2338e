"""python/bench/bench.py runs: a few tasks of each of its modes on the tests' Redis, with the
counts of executions it checks itself (every fresh task ran once, no duplicate ran). Nothing
about speed is asserted here; scripts/bench-python.sh measures."""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import redis

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench" / "bench.py"


def test_the_bench_runs_each_mode(redis_server: Any, redis_client: redis.Redis, capsys: Any) -> None:
    spec = importlib.util.spec_from_file_location("idempotask_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--redis-url", redis_server.url, "--smoke", "--threads", "4"]) == 0
    out = capsys.readouterr().out
    for row in ["| fresh | 1 |", "| fresh | 4 |", "| duplicate | 1 |", "| duplicate | 4 |"]:
        assert row in out, out
    # Each mode's keys: the hand-written pattern's result keys, and idempotask's markers.
    assert redis_client.keys("handwritten:*:done")
    assert redis_client.keys("idempotask:v2:default:py_bench_task:*")
    assert not redis_client.keys("handwritten:*:lock"), "every hand-written lock was released"
