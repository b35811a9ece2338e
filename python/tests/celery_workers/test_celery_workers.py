"""The issue's Celery tests with real workers: Celery 5 from PyPI, a Redis broker,
``task_acks_late``, ``task_reject_on_worker_lost``, ``worker_prefetch_multiplier = 1``, prefork
pools of 4 (celery_test_app.py). Each scenario runs the seed's charge task with
``@idempotent_task`` (``charge``) and without it (``charge_plain``): the decorated task charges
each job once however often its message is delivered; the same run of the plain task shows the
double charge. Charges are counted by the ledger the moment they happen, never from a killed
worker's output."""

from __future__ import annotations

import time
from typing import Callable, List

import pytest

from harness import DEADLINE, Deployment

TASKS = [pytest.param("charge", id="decorated"), pytest.param("charge_plain", id="undecorated")]


def _successes(deployment: Deployment, order: int) -> List[str]:
    return [o["value"] for o in deployment.outcomes(order) if o["state"] == "SUCCESS"]


def _wait_for(deployment: Deployment, condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {DEADLINE} s\n{deployment.logs()}"
        time.sleep(0.05)


def _kill_at_each_point(deployment: Deployment, plan: str, killed: List[int]) -> None:
    """Kills (SIGKILL) each pool process that reaches its kill point of ``plan``, once per killed
    order."""
    for _ in killed:
        point = deployment.next_killpoint()
        assert point["plan"] == plan
        deployment.kill_process(point["pid"])


def _assert_once_each(deployment: Deployment, jobs: List[int]) -> None:
    """Every job charged exactly once, and every delivery that returned got that charge's id."""
    charges = deployment.charges()
    assert {order: charges.get(order, 0) for order in jobs} == {order: 1 for order in jobs}
    for order in jobs:
        successes = _successes(deployment, order)
        assert successes, f"order {order} never returned"
        assert set(successes) == {f"ch_{order}_1200_1"}, f"order {order}: {successes}"


@pytest.mark.parametrize("task", TASKS)
def test_a_pool_process_killed_after_the_side_effect_and_before_the_ack(deployment: Deployment, task: str) -> None:
    # The pool process that ran the job is killed after the task returned (its charge made, the
    # decorator's result stored) and before the parent acked the message: the parent sees the
    # process lost and, with task_reject_on_worker_lost, requeues the message.
    jobs, killed = list(range(1, 13)), [4, 9]
    deployment.plan(kill_after_return=killed)
    deployment.worker("a")
    for order in jobs:
        deployment.send(task, order)
    _kill_at_each_point(deployment, "kill-after-return", killed)

    deployment.wait_settled(lambda: all(deployment.deliveries(o) >= 2 for o in killed)
                            and all(_successes(deployment, o) for o in jobs))
    figures = deployment.figures("kill pool process", task, jobs)
    assert figures["kills"] == len(killed)
    assert figures["deliveries"] >= len(jobs) + len(killed)
    assert figures["never_charged"] == 0
    if task == "charge":
        assert figures["side_effects"] == len(jobs)
        assert figures["charged_twice"] == 0
        _assert_once_each(deployment, jobs)
    else:
        charges = deployment.charges()
        assert all(charges[order] >= 2 for order in killed), charges
        assert figures["charged_twice"] >= len(killed)


@pytest.mark.parametrize("task", TASKS)
def test_a_worker_killed_after_the_side_effect_and_before_the_ack(deployment: Deployment, task: str) -> None:
    # The whole worker (its parent and its pool) is killed with SIGKILL while two of its pool
    # processes hold returned, unacked jobs: nobody requeues them, they stay in kombu's unacked
    # hash, and a second worker restores them once they are older than the visibility timeout.
    jobs, killed = list(range(1, 13)), [4, 9]
    deployment.plan(kill_after_return=killed)
    first = deployment.worker("a")
    for order in jobs:
        deployment.send(task, order)
    points = [deployment.next_killpoint() for _ in killed]
    assert sorted(point["order"] for point in points) == killed
    # The kill comes when the other jobs have returned, so that no body is cut in the middle
    # (a unit in doubt: the in_doubt test below).
    others = [order for order in jobs if order not in killed]
    _wait_for(deployment, lambda: all(_successes(deployment, o) for o in others), "the other jobs returned")
    deployment.kill_worker(first)
    second = deployment.worker("b")

    deployment.wait_settled(lambda: all(deployment.deliveries(o) >= 2 for o in killed)
                            and all(_successes(deployment, o) for o in jobs))
    figures = deployment.figures("kill whole worker", task, jobs)
    for order in killed:
        assert deployment.delivered_by(order)[-1] == second.hostname
    assert figures["deliveries"] >= len(jobs) + len(killed)
    assert figures["never_charged"] == 0
    if task == "charge":
        assert figures["side_effects"] == len(jobs)
        assert figures["charged_twice"] == 0
        _assert_once_each(deployment, jobs)
    else:
        charges = deployment.charges()
        assert all(charges[order] >= 2 for order in killed), charges
        assert figures["charged_twice"] >= len(killed)


@pytest.mark.parametrize("task", TASKS)
def test_a_task_longer_than_the_visibility_timeout_is_delivered_to_a_second_worker(
        deployment: Deployment, task: str) -> None:
    # Four jobs fill the first worker's pool; each body, after its charge, runs until four other
    # deliveries have come and gone, which the broker makes only once the messages have been
    # unacked for longer than the visibility timeout (2 s). The first worker cannot take more,
    # so the second worker gets the redeliveries while the first bodies still run.
    # The decorated redelivery finds the unit busy and retries (self.retry, countdown the
    # holder's remaining lock time, the lock renewed meanwhile); its retry replays the result.
    jobs = [1, 2, 3, 4]
    deployment.plan(wait_ended=len(jobs))
    first = deployment.worker("a")
    for order in jobs:
        deployment.send(task, order)
    assert sorted(deployment.wait_running(len(jobs))) == jobs
    second = deployment.worker("b")

    deployment.wait_settled(lambda: all(len(_successes(deployment, o)) >= 2 for o in jobs))
    figures = deployment.figures("outlast visibility timeout", task, jobs)
    seconds = deployment.first_body_seconds()
    assert sorted(seconds) == jobs and min(seconds.values()) > deployment.visibility_timeout, seconds
    for order in jobs:
        by = deployment.delivered_by(order)
        assert by[0] == first.hostname and second.hostname in by, (
            f"order {order} delivered by {by}: {deployment.outcomes(order)}\n{deployment.logs()}")
    assert figures["deliveries"] >= 2 * len(jobs)
    assert figures["never_charged"] == 0
    if task == "charge":
        assert figures["side_effects"] == len(jobs)
        assert figures["charged_twice"] == 0
        _assert_once_each(deployment, jobs)
        for order in jobs:
            # The redelivery found the unit busy while the first body ran.
            assert any(o["state"] == "RETRY" for o in deployment.outcomes(order)), deployment.outcomes(order)
    else:
        assert figures["charged_twice"] == len(jobs)


@pytest.mark.parametrize("task", TASKS)
def test_fired_from_two_workers_at_once_the_gateway_is_called_once(deployment: Deployment, task: str) -> None:
    # The seed's own test as Celery users write it, with real workers: one order sent 8 times to
    # two workers of 4 processes each; the first body runs until the 7 other deliveries have
    # ended, so that they all overlap it. Then the task is applied once more.
    order, copies = 7, 8
    deployment.plan(wait_ended=copies - 1)
    first, second = deployment.worker("a"), deployment.worker("b")
    for _ in range(copies):
        deployment.send(task, order)
    deployment.wait_settled(lambda: len(_successes(deployment, order)) == copies)
    deployment.send(task, order)
    deployment.wait_settled(lambda: len(_successes(deployment, order)) == copies + 1)

    figures = deployment.figures("two workers at once", task, [order])
    assert {first.hostname, second.hostname} <= set(deployment.delivered_by(order))
    assert figures["deliveries"] >= copies + 1
    if task == "charge":
        assert figures["side_effects"] == 1
        _assert_once_each(deployment, [order])
        retried = [o for o in deployment.outcomes(order) if o["state"] == "RETRY"]
        assert len(retried) >= copies - 1, "the other deliveries found the unit busy"
    else:
        assert figures["side_effects"] >= copies + 1
        assert figures["charged_twice"] == 1


@pytest.mark.parametrize("task", [pytest.param("charge_hold", id="hold"), pytest.param("charge", id="rerun")])
def test_a_pool_process_killed_between_the_side_effect_and_the_result(deployment: Deployment, task: str) -> None:
    # A kill in the middle of the body, after the charge and before the decorator stored the
    # result: the unit is in doubt once the dead process's lock runs out. in_doubt="hold" refuses
    # it (InDoubt, the task fails and is acked; an operator decides); the default "rerun" runs the
    # body again, and so charges again: what the kill test above avoids by its kill point.
    jobs, killed = list(range(1, 7)), [2, 5]
    deployment.plan(kill_in_body=killed)
    deployment.worker("a")
    for order in jobs:
        deployment.send(task, order)
    _kill_at_each_point(deployment, "kill-in-body", killed)

    def ended(order: int) -> bool:
        return any(o["state"] in ("SUCCESS", "FAILURE") for o in deployment.outcomes(order))

    deployment.wait_settled(lambda: all(ended(o) for o in jobs), killed_in_body=len(killed))
    figures = deployment.figures("kill mid-body (in doubt)", task, jobs)
    assert figures["never_charged"] == 0
    if task == "charge_hold":
        assert figures["side_effects"] == len(jobs)
        assert figures["charged_twice"] == 0
        assert figures["in_doubt"] == len(killed)
        for order in killed:
            assert [o["value"] for o in deployment.outcomes(order) if o["state"] == "FAILURE"] == ["InDoubt"]
    else:
        assert figures["charged_twice"] == len(killed)
        assert figures["in_doubt"] == 0


@pytest.mark.parametrize("task", [pytest.param("checkout_steps", id="steps"), pytest.param("checkout_plain", id="undecorated")])
def test_a_pool_process_killed_between_two_steps(deployment: Deployment, task: str) -> None:
    # A kill between the charge step (recorded in the unit's journal) and the shipping step:
    # the message is requeued, and once the dead process's lock ran out the redelivery takes
    # the unit over in doubt, replays the charge from the journal and ships. The undecorated
    # twin charges again.
    jobs, killed = list(range(1, 7)), [2, 5]
    deployment.plan(kill_between_steps=killed)
    deployment.worker("a")
    for order in jobs:
        deployment.send(task, order)
    _kill_at_each_point(deployment, "kill-between-steps", killed)

    deployment.wait_settled(lambda: all(_successes(deployment, o) for o in jobs), killed_in_body=len(killed))
    figures = deployment.figures("kill between two steps", task, jobs)
    assert figures["never_charged"] == 0
    assert deployment.shipments() == {order: 1 for order in jobs}
    if task == "checkout_steps":
        assert figures["side_effects"] == len(jobs)
        assert figures["charged_twice"] == 0
        _assert_once_each(deployment, jobs)
    else:
        assert figures["charged_twice"] == len(killed)
