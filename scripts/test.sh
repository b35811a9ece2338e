#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, integration, doc and UI tests, the Python
# package's tests, and the docs.
# Installs redis-server, Redis 8.2, Valkey, PostgreSQL, nats-server, RabbitMQ, moto_server and
# tansu (with cmake and libcurl's headers for librdkafka) when missing; the tests start their own
# servers on free loopback ports and stop them.
# `--quick`: the published crates' unit tests and doctests only, with no server and no install.
set -euo pipefail
cd "$(dirname "$0")/.."

# A run from a clean clone gains nothing from incremental compilation, whose caches take a third
# of the target directory. The packages' verification builds (`cargo package`) are workspaces of
# their own and do not read the workspace's profile, hence the debug setting here too.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only

# Each step's heading says when it started, in seconds since the run began.
step() { echo "==> $* (at ${SECONDS}s)"; }

# The crates that go to crates.io.
published=(idempotask idempotask-macros idempotask-conformance idempotask-redis idempotask-postgres idempotask-apalis idempotask-consumer idempotask-nats idempotask-lapin idempotask-redis-streams idempotask-sqs idempotask-kafka idempotask-http idempotask-cli)

# `--quick`: the published crates' unit tests and doctests, which run on MemoryStore or on
# nothing at all; no server, no install, no root. The tests that start servers, the UI tests,
# the lints and the docs are the full run's.
case "${1:-}" in
  "") ;;
  --quick)
    quick_args=(--locked)
    for crate in "${published[@]}"; do quick_args+=(-p "$crate"); done
    step "unit tests of the published crates"
    cargo test "${quick_args[@]}" --lib --bins
    step "doctests of the published crates"
    cargo test "${quick_args[@]}" --doc
    step "done"
    exit 0
    ;;
  *)
    echo "usage: scripts/test.sh [--quick]" >&2
    exit 2
    ;;
esac

# The servers the tests run against, installed when missing (and the system-wide ones stopped).
scripts/install-servers.sh

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The workspace build unifies features; each published crate must also build, lint and
# document on its own with no features and with all of them, as users and docs.rs build it.
for crate in "${published[@]}"; do
  step "$crate: no default features, all features"
  cargo clippy -p "$crate" --no-default-features --all-targets --locked -- -D warnings
  cargo clippy -p "$crate" --all-features --all-targets --locked -- -D warnings
done
# Each server example builds with only the feature its header names, not just with the
# workspace's union of features.
for feature in redis postgres apalis nats rabbitmq redis-streams sqs kafka http; do
  step "examples with --features $feature"
  cargo check -p idempotask-examples --examples --features "$feature" --locked
done
step "cargo test"
log=$(mktemp)
copied_log=$(mktemp)
copied_pid=
trap '[ -n "$copied_pid" ] && kill "$copied_pid" 2>/dev/null; rm -f "$log" "$copied_log"' EXIT
cargo test --workspace --locked --no-run 2>&1 | tee "$log"
# tests/copied_examples.rs is minutes of `cargo check` in copied crates, with no server and no
# clock: it runs beside the other tests, which mostly wait on their servers, and the main run
# skips it. On one core it took 549 s, longer than the main run: it gets both.
# `--workspace`, as the build above: with `-p` the features would differ, and its rebuild would
# hold the build directory's lock while the main run waited.
cargo test --workspace --locked --test copied_examples >"$copied_log" 2>&1 &
copied_pid=$!
# --no-fail-fast: one failing test binary must not hide how the others fare.
cargo test --workspace --locked --no-fail-fast -- --skip copied:: 2>&1 | tee -a "$log"
copied_status=0
wait "$copied_pid" || copied_status=$?
copied_pid=
step "tests/copied_examples.rs, run beside the others"
tee -a "$log" <"$copied_log"
[ "$copied_status" -eq 0 ]
# The metrics feature is off in the workspace build; its tests run on their own.
cargo test -p idempotask --features metrics --locked --test observe 2>&1 | tee -a "$log"
step "the Python package (python/tests, with pytest)"
# A virtual environment of its own under the target directory, the package installed with
# `pip install ./python`, then pytest; the tests start their own servers.
scripts/test-python.sh
step "cargo doc"
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked
# As docs.rs builds them (all features), and as users get them by default (none).
for crate in "${published[@]}"; do
  [ "$crate" = idempotask-cli ] && continue # a binary: its help is its documentation
  RUSTDOCFLAGS=-Dwarnings cargo doc -p "$crate" --all-features --no-deps --locked
  RUSTDOCFLAGS=-Dwarnings cargo doc -p "$crate" --no-default-features --no-deps --locked
done
step "module cycles in every crate"
python3 scripts/check-module-cycles.py
step "file sizes"
python3 scripts/check-file-sizes.py
step "links in the Markdown files"
./scripts/check-links.py
step "performance pages"
# Every figure on docs/performance*.md comes from bench/results/ through its template; the
# self-test proves the check fails on a planted inconsistency.
scripts/perf-report --self-test
scripts/perf-report --check
step "cargo package"
# Every published crate packages and builds from its own .crate, the workspace's crates taken
# from the packages made alongside (not from crates.io, where they are not yet). The crates
# with `publish = false` (tests, examples, benchmarks) are not packaged.
package_args=()
for crate in "${published[@]}"; do package_args+=(-p "$crate"); done
# cargo takes a registry's crate of a given version as never changing: it reuses the copy
# it unpacked into $CARGO_HOME/registry/src/-<hash of the target directory>/ and the build it
# made of it, so a second run from the same directory (CI's always is) verified the new
# crates against the previous run's idempotask. Both go first. Only these temporary
# registries have a name starting with `-`; crates.io's sources are left alone.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/idempotask* \
  "${CARGO_TARGET_DIR:-target}"/debug/.fingerprint/idempotask*
cargo package "${package_args[@]}" --locked --offline
step "quickstart"
cargo run --quiet --locked --example quickstart

# One closing line for the whole run: cargo prints one `test result` per test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
