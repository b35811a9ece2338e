"""A Celery worker whose charge task runs once per order, however often its message is
delivered: the issue's seed, on idempotask.

    pip install ./python 'celery[redis]==5.*'
    redis-server --port 6379 &
    celery -A celery_app worker --concurrency 4 --loglevel INFO      # from python/examples
    python celery_app.py 42 1200                                     # sends the order 3 times

The worker prints `charging order 42` once; every delivery's result is the same charge id. The
deliveries that found the order busy retry when the first one's lock would have run out (up to
`lock_ttl`, 30 s: see "A busy unit" in docs/python.md), so the answer takes that long.
`REDIS_URL` chooses the server (broker, result backend and idempotask's store share it here;
use one database each in production).
"""

from __future__ import annotations

import os
import sys
import uuid

from celery import Celery

from idempotask import idempotent_task, install, RedisStore

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")

app = Celery("celery_app", broker=f"{REDIS_URL}/0", backend=f"{REDIS_URL}/1")
app.conf.update(
    task_acks_late=True,  # redelivered when a worker dies before the ack: at least once
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
)

# At import, in the parent: each forked worker process connects on its first call.
install(RedisStore(f"{REDIS_URL}/2"))


@app.task(bind=True, max_retries=20)
@idempotent_task(key="order-charge-{order_id}", lock_ttl=30, fingerprint=["amount_cents"])
def charge_customer(self, order_id: int, amount_cents: int) -> str:
    # The side effect that must not happen twice (a payment gateway call in real life).
    print(f"charging order {order_id}: {amount_cents} cents", flush=True)
    return f"ch_{order_id}_{uuid.uuid4().hex[:8]}"


if __name__ == "__main__":
    order_id, amount_cents = int(sys.argv[1]), int(sys.argv[2])
    results = [charge_customer.delay(order_id, amount_cents) for _ in range(3)]
    charges = {result.get(timeout=60) for result in results}
    print(f"{len(results)} deliveries, charges: {sorted(charges)}")
    assert len(charges) == 1
