"""Real Celery workers for the tests of this directory, and the figures they measure.

A ``Deployment`` is one test's: its own queue on the session's redis-server (flushed first),
the broker on database 0, the ledger (celery_test_app's payment gateway) on database 1 and
idempotask's store on database 2. It starts workers of ``celery_test_app`` as subprocesses
(``python -m celery``, the virtual environment's Celery, prefork pool of 4) and kills each one
(SIGKILL, with its pool) when the test ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List

import redis
from celery import Celery

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
# How long a test waits for a worker to start or for its jobs to end before it fails.
DEADLINE = 60.0

# Every scenario's figures, in the order they ran (conftest prints them).
figures_recorded: List[Dict[str, Any]] = []


class Worker:
    """A ``celery worker`` process (and its pool) in a session of its own, so that it can be
    killed as a whole."""

    def __init__(self, deployment: "Deployment", name: str) -> None:
        self.deployment = deployment
        self.hostname = f"{name}@{deployment.queue}"
        self.log_path = deployment.dir / f"{name}.log"
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_test_app", "worker", "--pool=prefork",
             "--concurrency=4", "-n", self.hostname, "--loglevel=INFO",
             # Gossip, mingle and heartbeats talk between workers; nothing here needs them, and
             # mingle makes each start wait for replies.
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=HERE, env=deployment.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()

    def wait_ready(self) -> None:
        """Until the worker consumes (its ``worker_ready`` signal, pushed to the ledger)."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.hostname} exited with {self.process.returncode}:\n{self.log()}")
            if self.deployment.ledger.blpop([f"ready:{self.hostname}"], timeout=1) is not None:
                return
        raise AssertionError(f"worker {self.hostname} not ready after {DEADLINE} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL to the worker and every process of its pool at once."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return text[-6000:]


class Deployment:
    """One test's queue, ledger, store and workers, and the figures of its run."""

    def __init__(self, server: Any, name: str) -> None:
        self.queue = f"q-{name}-{uuid.uuid4().hex[:6]}"
        self.dir = Path(tempfile.mkdtemp(prefix="idempotask-celery-"))
        self.visibility_timeout = 2.0
        base = server.url
        self.broker = redis.Redis(port=server.port, db=0)
        self.ledger = redis.Redis(port=server.port, db=1)
        self.broker.flushall()
        self.env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            IDEMPOTASK_TEST_BROKER=f"{base}/0",
            IDEMPOTASK_TEST_LEDGER=f"{base}/1",
            IDEMPOTASK_TEST_STORE=f"{base}/2",
            IDEMPOTASK_TEST_QUEUE=self.queue,
            IDEMPOTASK_TEST_VISIBILITY_TIMEOUT=str(self.visibility_timeout),
        )
        self.client = Celery("sender", broker=f"{base}/0", set_as_current=False)
        self.client.conf.update(task_default_queue=self.queue, broker_connection_retry_on_startup=True)
        self.workers: List[Worker] = []
        self.kills = 0
        self.started_at = time.monotonic()

    def worker(self, name: str, ready: bool = True) -> Worker:
        worker = Worker(self, name)
        self.workers.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    def send(self, task: str, order_id: int, amount_cents: int = 1200) -> None:
        """One message (one job): the caller publishes each job once."""
        self.client.send_task(task, args=(order_id, amount_cents))

    def plan(self, **plans: Any) -> None:
        """``kill_after_return=[orders]``, ``kill_in_body=[orders]``,
        ``kill_between_steps=[orders]``, ``wait_ended=N``."""
        for order in plans.get("kill_between_steps", []):
            self.ledger.sadd("kill-between-steps", order)
        for order in plans.get("kill_after_return", []):
            self.ledger.sadd("kill-after-return", order)
        for order in plans.get("kill_in_body", []):
            self.ledger.sadd("kill-in-body", order)
        if "wait_ended" in plans:
            self.ledger.set("wait-ended", plans["wait_ended"])

    def next_killpoint(self) -> Dict[str, Any]:
        """The next process that reached its kill point (it blocks there)."""
        popped = self.ledger.blpop(["killpoints"], timeout=DEADLINE)
        assert popped is not None, f"no kill point reached in {DEADLINE} s:\n{self.logs()}"
        return json.loads(popped[1])

    def kill_process(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        self.kills += 1

    def kill_worker(self, worker: Worker) -> None:
        worker.kill()
        self.kills += 1

    def wait_running(self, count: int) -> List[int]:
        """Until ``count`` bodies have made their charge (the ``running`` list)."""
        orders = []
        for _ in range(count):
            popped = self.ledger.blpop(["running"], timeout=DEADLINE)
            assert popped is not None, f"{len(orders)} of {count} bodies running after {DEADLINE} s:\n{self.logs()}"
            orders.append(int(popped[1]))
        return orders

    def in_flight(self, killed_in_body: int = 0) -> int:
        started = int(self.ledger.get("started") or 0)
        ended = int(self.ledger.get("ended") or 0)
        return started - ended - killed_in_body

    def settled(self, killed_in_body: int = 0) -> bool:
        """Nothing left to deliver: the queue is empty, no message is unacked (kombu's
        ``unacked`` hash holds every message a worker holds, an ETA retry's too), and every
        delivery that started has ended (or was killed in its body)."""
        return (self.broker.llen(self.queue) == 0 and self.broker.hlen("unacked") == 0
                and self.in_flight(killed_in_body) == 0)

    def wait_settled(self, done: Callable[[], bool], killed_in_body: int = 0) -> None:
        """Polls until ``done()`` and ``settled()`` hold twice in a row 0.3 s apart (a message
        is briefly in neither the queue nor ``unacked`` between kombu's BRPOP and its
        bookkeeping), or fails after the deadline."""
        deadline = time.monotonic() + DEADLINE
        streak = 0
        while time.monotonic() < deadline:
            if done() and self.settled(killed_in_body):
                streak += 1
                if streak == 2:
                    return
                time.sleep(0.3)
            else:
                streak = 0
                time.sleep(0.05)
        raise AssertionError(
            f"jobs not settled after {DEADLINE} s: queue {self.broker.llen(self.queue)}, unacked {self.broker.hlen('unacked')}, "
            f"in flight {self.in_flight(killed_in_body)}, deliveries {self.deliveries_by_order()}, charges {self.charges()}\n{self.logs()}"
        )

    def charges(self) -> Dict[int, int]:
        return {int(k): int(v) for k, v in self.ledger.hgetall("charges").items()}

    def shipments(self) -> Dict[int, int]:
        return {int(k): int(v) for k, v in self.ledger.hgetall("shipments").items()}

    def deliveries(self, order: int) -> int:
        return int(self.ledger.get(f"deliveries:{order}") or 0)

    def deliveries_by_order(self) -> Dict[int, int]:
        return {int(key.split(b":")[1]): int(self.ledger.get(key) or 0) for key in self.ledger.keys("deliveries:*")}

    def outcomes(self, order: int) -> List[Dict[str, Any]]:
        return [json.loads(item) for item in self.ledger.lrange(f"outcomes:{order}", 0, -1)]

    def first_body_seconds(self) -> Dict[int, float]:
        """How long the first body of each order that waited ran."""
        return {int(k): float(v) for k, v in self.ledger.hgetall("first-body-seconds").items()}

    def delivered_by(self, order: int) -> List[str]:
        return [host.decode() for host in self.ledger.lrange(f"delivered-by:{order}", 0, -1)]

    def figures(self, scenario: str, task: str, jobs: List[int]) -> Dict[str, Any]:
        """The run's figures, recorded for the summary."""
        charges = self.charges()
        in_doubt = sum(1 for order in jobs for outcome in self.outcomes(order) if outcome["value"] == "InDoubt")
        figures = {
            "scenario": scenario,
            "task": task,
            "jobs": len(jobs),
            "deliveries": int(self.ledger.get("started") or 0),
            "side_effects": sum(charges.values()),
            "charged_twice": sum(1 for order in jobs if charges.get(order, 0) >= 2),
            "never_charged": sum(1 for order in jobs if charges.get(order, 0) == 0),
            "kills": self.kills,
            "in_doubt": in_doubt,
            "workers": len(self.workers),
            "seconds": round(time.monotonic() - self.started_at, 1),
        }
        figures_recorded.append(figures)
        return figures

    def logs(self) -> str:
        return "\n".join(f"--- {worker.hostname}\n{worker.log()}" for worker in self.workers)

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.client.close()
        self.broker.close()
        self.ledger.close()
        shutil.rmtree(self.dir, ignore_errors=True)
