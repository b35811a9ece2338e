#!/usr/bin/env bash
# The Python package's benchmark (python/bench/bench.py): the package against the hand-written
# redis-py pattern on one redis-server of its own (started through test-support, as
# scripts/bench.sh does), rounds interleaved, with the Rust core's own bench at 1 in flight in
# the same rounds for the binding's cost per call. Builds the wheel in release mode into the
# virtual environment of scripts/test-python.sh.
#
#   ./scripts/bench-python.sh [TASKS] [ROUNDS] [THREADS]   # defaults: 5000 tasks, 5 rounds, 16
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-5000}
rounds=${2:-5}
threads=${3:-16}
target="${CARGO_TARGET_DIR:-target}"
venv="$(realpath -m "$target/python-venv")"
wheels="$(realpath -m "$target/python-wheels")"
. scripts/bench-start-servers.sh
trap stop_servers EXIT

echo "==> building (release): the Rust bench, the server starter, the wheel"
cargo build --release --locked -p idempotask-bench --bin bench
cargo build --release --locked -p idempotask-test-support --bin servers
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check 'maturin>=1.9.4,<2' 'redis>=5,<8'
rm -rf "$wheels"
"$venv/bin/maturin" build --release --locked --manifest-path python/Cargo.toml \
  --interpreter "$venv/bin/python" --out "$wheels" --quiet
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
  "$wheels"/idempotask-*.whl

start_servers redis
echo "==> bench: $tasks tasks, $rounds rounds, 1 and $threads in flight, on $redis_url"
# From python/bench, so that `import idempotask` finds the installed wheel.
bench="$(realpath "$target/release/bench")"
cd python/bench
"$venv/bin/python" bench.py --redis-url "$redis_url" --tasks "$tasks" --rounds "$rounds" \
  --threads "$threads" --rust-bench "$bench"
