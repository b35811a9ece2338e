#!/usr/bin/env bash
# The Python package's tests (python/tests): installs python/ with `pip install ./python`, as
# users do, into a virtual environment of its own under the target directory, and runs pytest. The tests start their own
# redis-server, and Valkey, a Redis Cluster and PostgreSQL through test-support's `servers`
# binary (scripts/install-servers.sh installs them); none is skipped when one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
venv="$(realpath -m "$target/python-venv")"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# Pinned to what the tests were written against; pip skips what is already there.
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  'pytest>=8,<10' 'celery[redis]==5.*' 'redis>=5,<8' 'pydantic>=2,<3'
# Installed as the README tells users to, `pip install ./python` (without the README's `-v`,
# which would print a line per crate here): maturin (fetched by pip into its build environment)
# builds the wheel with the workspace's cargo, its Cargo.lock (`locked` in pyproject.toml), its
# `python-extension` profile and its target directory, and pip installs it.
echo "==> pip install ./python (the extension's build takes about 3 minutes on 2 cores the first time)"
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python
# The Rust workers of the interop tests (python/tests/test_interop.py, test_steps_interop.py),
# built as the Rust tests build the examples.
cargo build --quiet --locked -p idempotask-examples --example shared_units --example checkout_steps --features redis
export IDEMPOTASK_SHARED_UNITS IDEMPOTASK_CHECKOUT_STEPS
IDEMPOTASK_SHARED_UNITS="$(realpath "$target/debug/examples/shared_units")"
IDEMPOTASK_CHECKOUT_STEPS="$(realpath "$target/debug/examples/checkout_steps")"
# The servers of python/tests/test_stores.py (Valkey, a Redis Cluster, PostgreSQL), started by
# test-support's binary as the bench scripts start theirs.
cargo build --quiet --locked -p idempotask-test-support --bin servers
export IDEMPOTASK_SERVERS
IDEMPOTASK_SERVERS="$(realpath "$target/debug/servers")"
# From python/tests, so that `import idempotask` finds the installed wheel, never the source
# directory (which has no native module).
cd python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
