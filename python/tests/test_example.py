"""python/examples/celery_app.py, run the way its docstring tells a user to: a Celery worker
started with ``celery -A celery_app worker --concurrency 4`` from python/examples, and
``python celery_app.py 42 1200``, which sends the order three times. The order is charged
once, and every delivery answers with that one charge."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_celery_example_charges_an_order_sent_three_times_once(redis_server: Any) -> None:
    redis.Redis(port=redis_server.port).flushall()
    env = dict(os.environ, REDIS_URL=redis_server.url)
    with tempfile.TemporaryFile() as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--concurrency", "4",
             "--loglevel", "INFO"],
            cwd=EXAMPLES, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            # The sender waits for the three results itself (`result.get`); a worker that never
            # comes up makes it time out and fail.
            sender = subprocess.run(
                [sys.executable, "celery_app.py", "42", "1200"],
                cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=120,
            )
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.seek(0)
        worker_log = log.read().decode(errors="replace")

    assert sender.returncode == 0, f"{sender.stdout}\n{sender.stderr}\n{worker_log[-4000:]}"
    charges = re.findall(r"charges: \[(.*)\]", sender.stdout)
    assert len(charges) == 1 and charges[0].count("ch_42_") == 1, sender.stdout
    assert "3 deliveries" in sender.stdout, sender.stdout
    assert worker_log.count("charging order 42: 1200 cents") == 1, worker_log[-4000:]
