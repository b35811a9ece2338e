"""The Celery app that the worker tests start real workers of (``celery -A celery_test_app
worker``), configured by environment variables:

- ``IDEMPOTASK_TEST_BROKER``: the Redis broker's URL;
- ``IDEMPOTASK_TEST_LEDGER``: the ledger's Redis URL (another database of the same server);
- ``IDEMPOTASK_TEST_STORE``: idempotask's store (a third database);
- ``IDEMPOTASK_TEST_QUEUE``: the queue, one per test;
- ``IDEMPOTASK_TEST_VISIBILITY_TIMEOUT``: the broker's ``visibility_timeout``, in seconds.

The charge task is the issue's seed, once with ``@idempotent_task`` (``charge``) and once
without (``charge_plain``, its undecorated twin). Its side effect goes to the *ledger*, a
payment gateway that records every charge in Redis (``HINCRBY charges <order>``) at the moment
it happens, so that a worker killed afterwards cannot take it back and the tests never read a
killed worker's output. The ledger also records each delivery (``task_prerun``), each end of a
delivery (``task_postrun``) and what the delivery returned or raised.

A test plans what a job does through the ledger, before sending it:

- ``wait-ended`` = N: the first body of each order, after its charge, runs until N deliveries
  (of any order) have ended (returned, retried or failed): a task that outlasts the broker's
  visibility timeout until its redelivery has come and gone, or one whose deliveries all
  overlap. The other bodies do not wait;
- ``kill-after-return`` (a set of orders): after the task returned and before Celery acks its
  message (``task_postrun`` runs in the pool process, before the result goes back to the parent
  that acks), the process announces itself on ``killpoints`` and blocks until it is killed;
- ``kill-in-body`` (a set of orders): the same between the charge and the return, so before the
  decorator records the result;
- ``kill-between-steps`` (a set of orders): in ``checkout_steps`` (and its undecorated twin
  ``checkout_plain``), after the charge step and before the shipping step.

Each kill point fires once per order (``SET NX``); its redelivery goes through.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Optional

import redis
from celery import Celery, signals

import idempotask
from idempotask import RedisStore, idempotent_task, install

BROKER = os.environ["IDEMPOTASK_TEST_BROKER"]
LEDGER = os.environ["IDEMPOTASK_TEST_LEDGER"]
STORE = os.environ["IDEMPOTASK_TEST_STORE"]
QUEUE = os.environ["IDEMPOTASK_TEST_QUEUE"]
VISIBILITY_TIMEOUT = float(os.environ["IDEMPOTASK_TEST_VISIBILITY_TIMEOUT"])
# How long a body waits for its planned deliveries before it gives up (the test then fails on
# the figures, not on a hang).
PLAN_DEADLINE = 60

app = Celery("celery_test_app", broker=BROKER)
app.conf.update(
    # The configuration: at least once, a lost worker's message requeued, one message
    # reserved per pool process.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # No result backend: Celery 5.7 acks, rather than requeues, a message whose worker was lost
    # after it stored SUCCESS in a result backend. Without one (the usual set-up of a task whose
    # caller does not wait), a kill before the ack redelivers the message.
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        # kombu's Redis transport looks for unacked messages older than the visibility timeout
        # every interval x throttle seconds (100 s by default); every 0.25 s here.
        "unacked_restore_interval": 0.25,
        "unacked_restore_throttle": 1,
        # The sweep's mutex lasts 5 minutes by default: a worker killed while it holds it would
        # stop every other worker's restores that long.
        "unacked_mutex_expire": 5,
    },
)

# At import, in the worker's parent process: each pool process connects on its first call.
install(RedisStore(STORE))

_ledger: Optional[redis.Redis] = None
_ledger_pid = 0


def ledger() -> redis.Redis:
    """This process's connection to the ledger (a new one after a fork)."""
    global _ledger, _ledger_pid
    if _ledger is None or _ledger_pid != os.getpid():
        _ledger, _ledger_pid = redis.Redis.from_url(LEDGER), os.getpid()
    return _ledger


def _kill_point(plan: str, order_id: int) -> None:
    """Announces this process on ``killpoints`` and blocks until the test kills it, once per
    planned order."""
    client = ledger()
    if client.sismember(plan, order_id) and client.set(f"killpoint:{plan}:{order_id}", os.getpid(), nx=True):
        client.rpush("killpoints", json.dumps({"plan": plan, "order": order_id, "pid": os.getpid()}))
        threading.Event().wait()


def _gateway_charge(order_id: int, amount_cents: int) -> str:
    """The side effect: a charge, recorded the moment it happens."""
    count = ledger().hincrby("charges", str(order_id), 1)
    return f"ch_{order_id}_{amount_cents}_{count}"


def _charge(order_id: int, amount_cents: int) -> str:
    began = time.monotonic()
    charge_id = _gateway_charge(order_id, amount_cents)
    client = ledger()
    client.rpush("running", order_id)
    wanted = client.get("wait-ended")
    if wanted is not None and client.set(f"first-body:{order_id}", os.getpid(), nx=True):
        if int(client.get("ended") or 0) < int(wanted):
            # Pushed by task_postrun when the N-th delivery ends; each waiter passes it on.
            if client.blpop(["ended-enough"], timeout=PLAN_DEADLINE) is not None:
                client.rpush("ended-enough", 1)
        client.hset("first-body-seconds", order_id, time.monotonic() - began)
    _kill_point("kill-in-body", order_id)
    return charge_id


@app.task(bind=True, name="charge", max_retries=100)
@idempotent_task(key="order-charge-{order_id}", lock_ttl=2, renew=True, fingerprint=["amount_cents"])
def charge(self: Any, order_id: int, amount_cents: int) -> str:
    return _charge(order_id, amount_cents)


@app.task(bind=True, name="charge_plain", max_retries=100)
def charge_plain(self: Any, order_id: int, amount_cents: int) -> str:
    return _charge(order_id, amount_cents)


@app.task(bind=True, name="charge_hold", max_retries=100)
@idempotent_task(key="order-charge-{order_id}", lock_ttl=1, renew=True, in_doubt="hold", fingerprint=["amount_cents"])
def charge_hold(self: Any, order_id: int, amount_cents: int) -> str:
    return _charge(order_id, amount_cents)


def _ship(order_id: int) -> int:
    """The second side effect: a shipment, recorded the moment it happens."""
    return int(ledger().hincrby("shipments", str(order_id), 1))


@app.task(bind=True, name="checkout_steps", max_retries=100)
@idempotent_task(key="order-checkout-{order_id}", lock_ttl=1, renew=True, fingerprint=["amount_cents"])
def checkout_steps(self: Any, order_id: int, amount_cents: int) -> str:
    # Two side effects, each a step: a redelivery after a kill between them replays the charge
    # from the journal and ships once.
    ctx = idempotask.context()
    assert ctx is not None
    charge_id = ctx.step("charge", lambda: _gateway_charge(order_id, amount_cents))
    _kill_point("kill-between-steps", order_id)
    ctx.step("ship", lambda: _ship(order_id))
    return str(charge_id)


@app.task(bind=True, name="checkout_plain", max_retries=100)
def checkout_plain(self: Any, order_id: int, amount_cents: int) -> str:
    charge_id = _gateway_charge(order_id, amount_cents)
    _kill_point("kill-between-steps", order_id)
    _ship(order_id)
    return charge_id


def _order_of(args: Any, kwargs: Any) -> int:
    return int(kwargs["order_id"]) if kwargs and "order_id" in kwargs else int(args[0])


@signals.task_prerun.connect
def _delivered(task: Any, args: Any, kwargs: Any, **_: Any) -> None:
    order_id = _order_of(args, kwargs)
    client = ledger()
    client.incr("started")
    client.rpush(f"delivered-by:{order_id}", task.request.hostname or "?")
    client.incr(f"deliveries:{order_id}")


@signals.task_postrun.connect
def _ended(task: Any, args: Any, kwargs: Any, retval: Any, state: str, **_: Any) -> None:
    order_id = _order_of(args, kwargs)
    client = ledger()
    outcome = {"state": state, "value": retval if isinstance(retval, str) else type(retval).__name__}
    client.rpush(f"outcomes:{order_id}", json.dumps(outcome))
    ended = client.incr("ended")
    wanted = client.get("wait-ended")
    if wanted is not None and ended == int(wanted):
        client.rpush("ended-enough", ended)
    if state == "SUCCESS":
        _kill_point("kill-after-return", order_id)


@signals.worker_ready.connect
def _ready(sender: Any, **_: Any) -> None:
    ledger().rpush(f"ready:{sender.hostname}", os.getpid())
