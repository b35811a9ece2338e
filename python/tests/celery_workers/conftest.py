"""The fixture of the real-worker tests (harness.py), and their figures (jobs, deliveries,
side effects, charged twice, kills, in doubt): printed in pytest's summary and written to
``<target>/python-figures/celery-workers.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from harness import REPO, Deployment, figures_recorded


@pytest.fixture
def deployment(redis_server: Any, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    deployment = Deployment(redis_server, name)
    try:
        yield deployment
    finally:
        deployment.close()


def _figures_path() -> Path:
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    return Path(target) / "python-figures" / "celery-workers.json"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not figures_recorded:
        return
    terminalreporter.write_sep("-", "Celery workers (Redis broker, acks_late, prefork 4): figures")
    for f in figures_recorded:
        terminalreporter.write_line(
            f"{f['scenario']:<28} {f['task']:<14} jobs {f['jobs']:>2}  deliveries {f['deliveries']:>3}  "
            f"side effects {f['side_effects']:>3}  charged twice {f['charged_twice']:>2}  kills {f['kills']}  "
            f"in doubt {f['in_doubt']}  workers {f['workers']}  {f['seconds']} s"
        )
    path = _figures_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures_recorded, indent=1) + "\n")
        terminalreporter.write_line(f"(written to {path})")
    except OSError as err:
        terminalreporter.write_line(f"(not written to {path}: {err})")
