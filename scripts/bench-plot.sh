#!/usr/bin/env bash
# Throughput against tasks in flight, drawn: idempotask, the hand-written pattern and the
# `idempotent` crate's claim over fresh keys on a Redis 7 and a Valkey 8.1
# (`bench/http-compare --sweep`), and the queue consumers (bare, hand-written, idempotask) on
# NATS JetStream and RabbitMQ (`queue-bench`), each at 1, 4, 16, 64 and 256 in flight, the
# implementations back to back at each number in flight, rounds rotating their order. Starts
# the servers through test-support (free loopback ports, persistence off), keeps the JSON lines
# in docs/img/, draws docs/img/throughput-*.svg with `bench-plot`, and writes the section of
# the pages for docs/performance.md and docs/performance-queues.md that shows them (into the
# target directory: scripts/perf-report publishes them).
#
#   ./scripts/bench-plot.sh [TASKS] [ROUNDS] [MESSAGES]   # defaults: 5000 tasks, 5 rounds, 2000 messages
#   ./scripts/bench-plot.sh --draw-only                   # redraws from docs/img/*.jsonl; no servers
#
# scripts/bench.sh runs it after its own measurements (`scripts/bench.sh --plot-only` runs only
# this). Needs what the other bench scripts need: redis-server, valkey-server, nats-server and
# rabbitmq-server (scripts/install-servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
draw_only=0
if [ "${1:-}" = --draw-only ]; then
  draw_only=1
  shift
fi
tasks=${1:-5000}
rounds=${2:-5}
messages=${3:-2000}
in_flight=1,4,16,64,256
img=docs/img
work=$(mktemp -d)
. scripts/bench-start-servers.sh
cleanup() {
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT

# The workspace's target directory unless told otherwise: http-compare shares its crates.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
release=$CARGO_TARGET_DIR/release
echo "==> building (release)" >&2
cargo build --release --locked -p idempotask-bench -p idempotask-test-support >&2
mkdir -p "$img"

if [ "$draw_only" = 0 ]; then
  # bench/http-compare is outside the workspace: `idempotent` 2 declares rust-version 1.98.
  cargo build --release --locked --ignore-rust-version --manifest-path bench/http-compare/Cargo.toml >&2
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  start_servers redis valkey
  for server in redis valkey; do
    url_var=${server}_url
    echo "==> $server: $tasks fresh tasks at $in_flight in flight, $rounds rounds" >&2
    "$release/http-compare" --sweep "$in_flight" --redis-url "${!url_var}" --tasks "$tasks" \
      --rounds "$rounds" | tee "$work/throughput-$server.jsonl"
  done
  stop_servers
  start_servers redis nats rabbitmq
  echo "==> queues: $messages messages at $in_flight in flight, $rounds rounds" >&2
  "$release/queue-bench" --redis-url "$redis_url" --nats-url "$nats_url" --amqp-url "$amqp_url" \
    --messages "$messages" --in-flight "$in_flight" --rounds "$rounds" | tee "$work/throughput-queues.jsonl"
  stop_servers
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  mv "$work"/throughput-*.jsonl "$img/"
  {
    echo "command=scripts/bench-plot.sh $tasks $rounds $messages"
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine=$(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(uname -sr)"
    echo "load=$load_before when the sweeps began, $load_after when they ended"
    echo "nats=$(nats-server --version | sed 's/^nats-server: v//')"
    echo "rabbitmq=$(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null | sed 's/-.*//' || echo '(version unknown)')"
    echo "tasks=$tasks"
    echo "rounds=$rounds"
    echo "messages=$messages"
  } >"$img/throughput.env"
fi

# What the run was: the settings are read back, so that --draw-only writes the same text.
while IFS='=' read -r name value; do
  declare "run_$name=$value"
done <"$img/throughput.env"
cores=$(echo "$run_machine" | cut -d' ' -f1)
server_of() { # file -> the server its sweep ran on, as INFO server names it
  sed -n 's/.*"server":"\([^"]*\)".*/\1/p' "$1" | sed -n 1p
}
redis_name=$(server_of "$img/throughput-redis.jsonl")
valkey_name=$(server_of "$img/throughput-valkey.jsonl")
draw() { # name group title what file -> docs/img/throughput-NAME.svg and $work/NAME.md
  "$release/bench-plot" --group "$2" --title "$3" --x-label "$4 in flight" --y-label "$4/s" \
    --out "$img/throughput-$1.svg" --markdown "$work/$1.md" "$5"
}
draw redis redis "$redis_name, $cores cores: tasks/s by tasks in flight" tasks "$img/throughput-redis.jsonl"
draw valkey valkey "$valkey_name, $cores cores: tasks/s by tasks in flight" tasks "$img/throughput-valkey.jsonl"
draw nats nats "NATS JetStream $run_nats, $cores cores: messages/s by messages in flight" messages \
  "$img/throughput-queues.jsonl"
draw rabbitmq rabbitmq "RabbitMQ $run_rabbitmq, $cores cores: messages/s by messages in flight" \
  messages "$img/throughput-queues.jsonl"

how_measured() {
  echo "Measured by \`$run_command\` on $run_date."
  echo
  echo "- Machine: $run_machine"
  echo "- Load average: $run_load (the cores are shared with other work)"
  echo "- The JSON lines are kept beside the pictures in \`docs/img/\`;"
  echo "  \`scripts/bench-plot.sh --draw-only\` redraws them"
}
queue_text() {
  echo "Each round publishes $run_messages fresh messages (untimed) per broker, number in flight and"
  echo "consumer, then times their consumption; at each number in flight the three consumers run"
  echo "back to back. \`bare\` acks without any idempotency, \`hand-written\` is the pattern with"
  echo "redis-rs inside the consumer, \`idempotask\` the integration crate; all on one Redis. A"
  echo "point is the median of $run_rounds rounds."
  echo
  echo "![NATS JetStream: messages per second by messages in flight](img/throughput-nats.svg)"
  echo
  cat "$work/nats.md"
  echo
  echo "![RabbitMQ: messages per second by messages in flight](img/throughput-rabbitmq.svg)"
  echo
  cat "$work/rabbitmq.md"
}
{
  echo "<!-- BEGIN throughput plots: written by scripts/bench-plot.sh; do not edit by hand -->"
  echo "## Throughput against tasks in flight"
  echo
  how_measured
  echo
  echo "How to read them: one line per implementation; a point is the median of $run_rounds rounds of"
  echo "$run_tasks fresh tasks at that many tasks in flight (x, a logarithmic axis: 1, 4, 16, 64,"
  echo "256), in tasks completed per second (y); higher is better. At each number in flight the"
  echo "implementations ran back to back, their order rotating round by round, so points one above"
  echo "the other saw the same machine. \`idempotask\` is \`#[idempotent_task]\` on \`RedisStore\`;"
  echo "\`hand-written\` is the four-command pattern (\`SET NX\`, \`GET\`, \`SET\`, a release script) on"
  echo "a connection of its own; \`idempotent 2.0\` is that crate's claim"
  echo "(\`claim(..).fingerprint(..).json().execute_or_replay(..)\`) on its \`ValkeyStore\`, over the"
  echo "same server (\`bench/http-compare --sweep\`); its claim always takes a fencing token, which"
  echo "ours takes only with \`fencing = true\`."
  echo
  echo "![$redis_name: tasks per second by tasks in flight](img/throughput-redis.svg)"
  echo
  cat "$work/redis.md"
  echo
  echo "![$valkey_name: tasks per second by tasks in flight](img/throughput-valkey.svg)"
  echo
  cat "$work/valkey.md"
  echo
  echo "### Queue consumers"
  echo
  queue_text
  echo "<!-- END throughput plots -->"
} >"$work/performance.md"
{
  echo "<!-- BEGIN throughput plots: written by scripts/bench-plot.sh; do not edit by hand -->"
  echo "## Throughput against messages in flight"
  echo
  how_measured
  echo
  queue_text
  echo "<!-- END throughput plots -->"
} >"$work/performance-queues.md"

fill() { # page fragment -> the page with its plots section replaced, or added at its end
  if [ -f "$1" ] && grep -q '^<!-- BEGIN throughput plots' "$1"; then
    awk -v fragment="$2" '
      /^<!-- BEGIN throughput plots/ { while ((getline line < fragment) > 0) print line; skip = 1; next }
      /^<!-- END throughput plots/ { skip = 0; next }
      !skip' "$1" >"$1.new"
    mv "$1.new" "$1"
  else
    { echo; cat "$2"; } >>"$1"
  fi
}
# The sections go into the pages the bench scripts wrote under the target directory, never into
# docs/: scripts/perf-report writes the published pages from recorded runs.
pages="${CARGO_TARGET_DIR:-target}/bench-pages"
mkdir -p "$pages"
fill "$pages/performance.md" "$work/performance.md"
fill "$pages/performance-queues.md" "$work/performance-queues.md"
echo "wrote $img/throughput-{redis,valkey,nats,rabbitmq}.svg and their sections of $pages/performance.md and $pages/performance-queues.md; to publish them: scripts/perf-report record plot-$(date -u +%Y-%m-%d) $pages/performance.md && scripts/perf-report" >&2
