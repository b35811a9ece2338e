"""Steps shared with a Rust worker, both ways, on one Redis: the example
``examples/checkout_steps.rs`` (its path in ``IDEMPOTASK_CHECKOUT_STEPS``; scripts/test-python.sh
builds it) and this file's ``checkout``, the same task (``checkout``, key ``order-7``) with the
same three steps (``charge``, ``ledger``, ``receipt``). The Python task's lock lasts 1 s, half the
Rust one's: the Rust worker waits on a busy unit for its own lock TTL, 2 s, which a dead Python
worker's lock must not outlast.

A worker crashes right after the charge step: the Rust example aborts itself
(``CRASH_AFTER=charge``), the Python worker is a forked child killed with SIGKILL. The other
language's worker then takes the order over, replays the charge from the journal without
charging again, and runs the ledger and the receipt once. Each effect appends a line to the
file ``EFFECTS`` names, which the crash cannot take back: the file holds each effect once.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional

import redis

import idempotask
from idempotask import idempotent_task

ORDER = "order-7"
# The effects file and whether to die after the charge, for this process's `checkout`.
_run: Dict[str, Any] = {"effects": None, "crash_after_charge": False}


def _effect(line: str) -> None:
    with open(_run["effects"], "a", encoding="utf-8") as effects:
        effects.write(line + "\n")


# The Rust example's task: the same name and key, and its steps in its order.
@idempotent_task(key="{order}", name="checkout", lock_ttl=1, max_wait=10)
def checkout(order: str) -> str:
    ctx = idempotask.context()
    assert ctx is not None

    def charge() -> str:
        _effect(f"charge {order}")
        return f"ch_{order}"

    charge_id = ctx.step("charge", charge)
    if _run["crash_after_charge"]:
        os.kill(os.getpid(), signal.SIGKILL)
    # Rust's `()`: JSON null, recorded as such.
    ctx.step("ledger", lambda: _effect(f"ledger {order} {charge_id}"))
    ctx.step("receipt", lambda: _effect(f"receipt {order} {charge_id}"))
    return charge_id


def _rust_checkout(redis_url: str, effects: Path, crash: bool = False) -> subprocess.CompletedProcess:
    path = os.environ.get("IDEMPOTASK_CHECKOUT_STEPS")
    if not path:
        raise RuntimeError(
            "IDEMPOTASK_CHECKOUT_STEPS is not set: run through scripts/test-python.sh, which builds "
            "the example checkout_steps and sets it to the binary's path"
        )
    env = {**os.environ, "REDIS_URL": redis_url, "EFFECTS": str(effects)}
    if crash:
        env["CRASH_AFTER"] = "charge"
    return subprocess.run([path], env=env, capture_output=True, text=True, timeout=60)


def _field(output: str, label: str) -> Optional[str]:
    """The rest of the example's line that starts with ``label``."""
    return next((line[len(label):].strip() for line in output.splitlines() if line.startswith(label)), None)


EVERY_EFFECT_ONCE = f"charge {ORDER}\nledger {ORDER} ch_{ORDER}\nreceipt {ORDER} ch_{ORDER}\n"


def test_a_charge_recorded_by_a_rust_worker_is_replayed_by_python(
        store: Any, redis_server: Any, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    _run.update(effects=effects, crash_after_charge=False)
    crashed = _rust_checkout(redis_server.url, effects, crash=True)
    assert crashed.returncode != 0, crashed
    assert effects.read_text() == f"charge {ORDER}\n"

    # Waits for the aborted worker's lock to run out, replays its charge, runs the rest.
    assert checkout(ORDER) == f"ch_{ORDER}"
    assert effects.read_text() == EVERY_EFFECT_ONCE
    # And the Rust worker replays the Python worker's result.
    replayed = _rust_checkout(redis_server.url, effects)
    assert replayed.returncode == 0, replayed
    assert _field(replayed.stdout, "outcome:") == f"Replayed ch_{ORDER}"
    assert effects.read_text() == EVERY_EFFECT_ONCE


def test_a_charge_recorded_by_a_python_worker_is_replayed_by_rust(
        store: Any, redis_server: Any, redis_client: redis.Redis, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    _run.update(effects=effects, crash_after_charge=True)
    pid = os.fork()
    if pid == 0:
        try:
            checkout(ORDER)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    _run["crash_after_charge"] = False
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert effects.read_text() == f"charge {ORDER}\n"
    # The journal entry is the core's layout, whichever language wrote it.
    (journal,) = redis_client.keys("idempotask:v2:default:*:steps")
    assert redis_client.lrange(journal, 0, -1) == [f'{{"step":"charge","ok":"ch_{ORDER}"}}'.encode()]

    resumed = _rust_checkout(redis_server.url, effects)
    assert resumed.returncode == 0, resumed
    assert _field(resumed.stdout, "charge:") == f'replayed "ch_{ORDER}"'
    assert _field(resumed.stdout, "ledger:") == "ran ()"
    assert _field(resumed.stdout, "receipt:") == "ran ()"
    assert _field(resumed.stdout, "outcome:") == f"Executed ch_{ORDER}"
    assert effects.read_text() == EVERY_EFFECT_ONCE
    # And Python replays the Rust worker's result.
    assert checkout(ORDER) == f"ch_{ORDER}"
    assert effects.read_text() == EVERY_EFFECT_ONCE
