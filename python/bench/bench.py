"""The Python package against the hand-written redis-py pattern, on one Redis, in one run.

    python bench.py --redis-url redis://127.0.0.1:6379 [--tasks 5000] [--rounds 5] [--threads 16]
                    [--rust-bench target/release/bench] [--markdown out.md] [--json out.jsonl]

Modes, each with keys of its own (``{run}-{id}``) and a body that returns ``None`` (the
smallest marker, as the Rust bench's ``bench_task``):

- ``idempotask``: ``@idempotent_task(key="{run}-{id}")`` on a ``RedisStore``;
- ``handwritten``: the pattern users write with redis-py, the commands of the Rust bench's
  ``handwritten``: ``SET lock token NX EX 30``, ``GET`` the stored result, run and ``SET`` it
  with ``EX``, then a Lua compare-and-delete of the lock (``EVALSHA``, registered once). A
  duplicate skips the ``SET``: three commands, against idempotask's one.

``fresh`` runs new keys; ``duplicate`` runs keys whose result is stored (an untimed fresh pass
first). Each runs with 1 call in flight (a loop) and with ``--threads`` threads, rounds
interleaved, and the table gives each figure's min, median and max over the rounds, and each
ratio's median over the rounds (idempotask ÷ handwritten, in the same round).

The binding's own cost per call: the same task on a ``MemoryStore`` at 1 in flight (the call
through the binding and back, with no I/O), and, with ``--rust-bench``, the Rust bench's
``fresh`` and ``duplicate`` at 1 in flight on the same Redis in the same rounds: the difference
of the times per call is what the Python layer and the binding add to the Rust core.

``--smoke`` runs a few tasks of each mode and checks their counts, never their speed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import redis

import idempotask
from idempotask import idempotent_task

RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class Handwritten:
    """The hand-written pattern on redis-py: a lock with a random token, the result under a
    second key, a compare-and-delete release."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.release = client.register_script(RELEASE)
        self.executions = 0
        self._count = threading.Lock()

    def __call__(self, run: int, id: int) -> Any:
        lock, done = f"handwritten:{run}-{id}:lock", f"handwritten:{run}-{id}:done"
        token = os.urandom(16).hex()
        if not self.client.set(lock, token, nx=True, ex=30):
            raise RuntimeError(f"{lock} is busy")
        try:
            stored = self.client.get(done)
            if stored is not None:
                return json.loads(stored)
            with self._count:
                self.executions += 1
            value = None  # the body
            self.client.set(done, json.dumps(value), ex=86_400)
            return value
        finally:
            self.release(keys=[lock], args=[token])


class Counted:
    """``bench_task`` under the decorator, on one store, counting its executions."""

    def __init__(self, store: Any, name: str) -> None:
        self.executions = 0
        self._count = threading.Lock()

        @idempotent_task(key="{run}-{id}", name=name, store=store)
        def bench_task(run: int, id: int) -> None:
            with self._count:
                self.executions += 1

        self.task = bench_task

    def __call__(self, run: int, id: int) -> Any:
        return self.task(run, id)


def drive(call: Callable[[int, int], Any], run: int, tasks: int, threads: int) -> float:
    """Calls ``call(run, id)`` for ids ``0..tasks``, ``threads`` at a time; the seconds taken."""
    if threads == 1:
        started = time.perf_counter()
        for id in range(tasks):
            call(run, id)
        return time.perf_counter() - started
    start = threading.Barrier(threads + 1)
    errors: List[BaseException] = []

    def worker(first: int) -> None:
        start.wait()
        try:
            for id in range(first, tasks, threads):
                call(run, id)
        except BaseException as err:  # reported below: a failed call spoils the figure
            errors.append(err)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


class Bench:
    def __init__(self, url: str, threads: int, rust_bench: Optional[str]) -> None:
        self.url = url
        self.threads = threads
        self.rust_bench = rust_bench
        self.client = redis.Redis.from_url(url, max_connections=threads + 4)
        self.client.ping()
        store = idempotask.RedisStore(url)
        store.check()
        self.impls: Dict[str, Any] = {
            "idempotask": Counted(store, "py_bench_task"),
            "handwritten": Handwritten(self.client),
            "idempotask-memory": Counted(idempotask.MemoryStore(), "py_bench_task_memory"),
        }
        # Keys of their own on a Redis that earlier runs left results in, as the Rust bench.
        self.run = random.getrandbits(62)

    def measure(self, impl: str, kind: str, threads: int, tasks: int) -> Dict[str, Any]:
        self.run += 1
        call = self.impls[impl]
        if kind == "duplicate":
            drive(call, self.run, tasks, threads)
        before = call.executions
        elapsed = drive(call, self.run, tasks, threads)
        executions = call.executions - before
        expected = tasks if kind == "fresh" else 0
        if executions != expected:
            raise AssertionError(f"{impl} {kind}: {executions} executions for {tasks} tasks, expected {expected}")
        return {
            "impl": impl, "kind": kind, "threads": threads, "tasks": tasks,
            "tasks_per_sec": tasks / elapsed, "us_per_call": elapsed / tasks * 1e6, "executions": executions,
        }

    def measure_rust(self, kind: str, tasks: int) -> Dict[str, Any]:
        """The Rust bench's own mode at 1 in flight, on the same Redis."""
        assert self.rust_bench is not None
        out = subprocess.run(
            [self.rust_bench, "--redis-url", self.url, "--mode", kind, "--tasks", str(tasks), "--concurrency", "1"],
            check=True, capture_output=True, text=True,
        ).stdout
        line = json.loads(out.strip().splitlines()[-1])
        return {
            "impl": "rust-core", "kind": kind, "threads": 1, "tasks": tasks,
            "tasks_per_sec": line["tasks_per_sec"], "us_per_call": 1e6 / line["tasks_per_sec"],
            "executions": line["executions"],
        }


def plan(threads: int, rust: bool, swap: bool) -> List[Tuple[str, str, int]]:
    """One round's measurements: each idempotask figure next to its hand-written one (the
    hand-written one first when ``swap``), then the per-call figures."""
    steps = []
    for kind, t in itertools.product(["fresh", "duplicate"], [1, threads]):
        pair = [("idempotask", kind, t), ("handwritten", kind, t)]
        steps += pair[::-1] if swap else pair
    for kind in ["fresh", "duplicate"]:
        steps.append(("idempotask-memory", kind, 1))
        if rust:
            steps.append(("rust-core", kind, 1))
    return steps


def summary(results: List[Dict[str, Any]], threads: int) -> str:
    def figures(impl: str, kind: str, t: int) -> List[float]:
        return [r["tasks_per_sec"] for r in results if (r["impl"], r["kind"], r["threads"]) == (impl, kind, t)]

    def spread(values: List[float], digits: int = 0) -> str:
        if not values:
            return "—"
        fmt = f"{{:.{digits}f}}"
        return f"{fmt.format(min(values))} / **{fmt.format(statistics.median(values))}** / {fmt.format(max(values))}"

    lines = [
        "| mode | in flight | idempotask tasks/s (min / median / max) | handwritten redis-py tasks/s | ratio per round (min / median / max) | goal |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for kind, t in itertools.product(["fresh", "duplicate"], [1, threads]):
        ours, theirs = figures("idempotask", kind, t), figures("handwritten", kind, t)
        ratios = [a / b for a, b in zip(ours, theirs)]
        goal = 1.5 if kind == "fresh" else 2.0
        met = statistics.median(ratios) >= goal
        verdicts.append(met)
        lines.append(
            f"| {kind} | {t} | {spread(ours)} | {spread(theirs)} | {spread(ratios, 2)} | ≥ {goal} {'met' if met else '**missed**'} |"
        )
    lines += ["", "| the call at 1 in flight | fresh µs/call (median) | duplicate µs/call (median) |", "|---|---|---|"]

    def per_call(impl: str, kind: str) -> Optional[float]:
        values = figures(impl, kind, 1)
        return 1e6 / statistics.median(values) if values else None

    def cell(value: Optional[float]) -> str:
        return "—" if value is None else f"{value:.1f}"

    for impl, label in [
        ("idempotask-memory", "Python, `MemoryStore` (the binding alone, no I/O)"),
        ("idempotask", "Python, `RedisStore`"),
        ("rust-core", "Rust core (the `bench` crate), Redis"),
        ("handwritten", "hand-written redis-py, Redis"),
    ]:
        lines.append(f"| {label} | {cell(per_call(impl, 'fresh'))} | {cell(per_call(impl, 'duplicate'))} |")
    rust = [per_call("rust-core", k) for k in ("fresh", "duplicate")]
    if all(v is not None for v in rust):
        ours = [per_call("idempotask", k) for k in ("fresh", "duplicate")]
        lines.append(
            f"| the binding's own cost (Python on Redis − Rust on Redis) | {cell(ours[0] - rust[0])} | {cell(ours[1] - rust[1])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rust-bench", help="the Rust bench binary (target/release/bench)")
    parser.add_argument("--markdown", help="write the tables here")
    parser.add_argument("--json", help="write one JSON line per measurement here")
    parser.add_argument("--smoke", action="store_true", help="a few tasks of each mode, one round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.rounds = 20, 1
    bench = Bench(args.redis_url, args.threads, args.rust_bench)
    results: List[Dict[str, Any]] = []
    for round in range(1, args.rounds + 1):
        # Which of each pair goes first alternates, round by round.
        for impl, kind, t in plan(args.threads, args.rust_bench is not None, swap=round % 2 == 0):
            if impl == "rust-core":
                result = bench.measure_rust(kind, args.tasks)
            else:
                result = bench.measure(impl, kind, t, args.tasks)
            result["round"] = round
            results.append(result)
            print(json.dumps(result), flush=True)
    table = summary(results, args.threads)
    print(table)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(r) + "\n" for r in results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
