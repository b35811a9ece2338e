"""Every ```` ```python ```` block of python/README.md and docs/python.md runs as written, as the
Rust README's blocks are built by tests/copied_examples.rs: each block is a script of its own,
run by this interpreter (the one the installed wheel is in) in an empty directory, against a
redis-server this test starts and flushes before each block.

The pages tell the reader to start a Redis on 127.0.0.1:6379 (`redis-server --port 6379 --save
''`); the test's server is on a free port instead, so that the suite never meets a server of the
machine's, and its URL takes the place of ``redis://127.0.0.1:6379`` in each block. Nothing else
of a block is changed.

A block that cannot run alone says why in an HTML comment on the line before its fence,
``<!-- not run: the reason -->``; it is left out of the runs and counted, and a comment with no
reason is an error."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("python/README.md", "docs/python.md")
# The server every page tells the reader to start, and the URL its blocks name.
START_COMMAND = "redis-server --port 6379 --save ''"
PAGE_URL = re.compile(r"redis://127\.0\.0\.1:6379(?!\d)")
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->")
# Seconds one block may take: the longest today takes under one.
BLOCK_TIMEOUT = 120


@dataclass
class Block:
    page: str
    line: int
    code: str
    not_run: Optional[str]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(page: str) -> List[Block]:
    """Input: a page's path under the repository. Output: its ```` ```python ```` blocks, each
    with the line of its opening fence and the reason of a ``not run`` comment before it."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    blocks: List[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```python":
            index += 1
            continue
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = NOT_RUN.search(before)
        start = index
        index += 1
        body = []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise AssertionError(f"{page}:{start + 1}: a ```python block is never closed")
        blocks.append(Block(page, start + 1, "\n".join(body) + "\n", marker.group(1).strip() if marker else None))
        index += 1
    return blocks


BLOCKS = [block for page in PAGES for block in page_blocks(page)]
RUN = [block for block in BLOCKS if block.not_run is None]


@pytest.mark.parametrize("block", RUN, ids=[block.id for block in RUN])
def test_the_block_runs_as_written(
    block: Block, redis_server: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    script = tmp_path / "example.py"
    script.write_text(PAGE_URL.sub(redis_server.url, block.code), encoding="utf-8")
    # From an empty directory, so that `import idempotask` finds the installed wheel.
    done = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
    )
    assert done.returncode == 0, (
        f"the block at {block.id} exited with {done.returncode}:\n{block.code}\n"
        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )


def test_every_block_runs_or_says_why() -> None:
    for page in PAGES:
        assert any(block.page == page for block in RUN), f"{page} has no ```python block that runs"
    for block in BLOCKS:
        if block.not_run is not None:
            assert block.not_run, f"{block.id}: a `not run` comment must say why"
    # Counted in the test's id list; printed with `-rA` or `-s`.
    print(f"{len(RUN)} blocks run, {len(BLOCKS) - len(RUN)} not run (each says why)")


def test_a_page_whose_blocks_need_redis_says_how_to_start_it() -> None:
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        needs_redis = any(PAGE_URL.search(block.code) for block in BLOCKS if block.page == page)
        if needs_redis:
            assert START_COMMAND in text, f"{page} runs blocks on Redis but does not show `{START_COMMAND}`"
