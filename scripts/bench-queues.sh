#!/usr/bin/env bash
# The queue consumers' bench (bench/src/queues.rs): on NATS JetStream, RabbitMQ, Redis Streams
# (on the store's Redis), SQS (a local moto_server) and Kafka (a local tansu broker), a bare consumer (ack only), the
# hand-written pattern inside the consumer (GET, SET NX PX, the body, SET of the marker, a
# compare-and-delete) and the integration crate, each over fresh messages, at 1 and 64 in
# flight (10 on SQS, its most per receive), rounds interleaved, next to the Redis round trip
# measured in the same run. Starts a nats-server (JetStream), a RabbitMQ broker, a moto_server,
# a tansu broker and a redis-server through test-support on free loopback ports and writes the page for
# docs/performance-queues.md (into the target directory: see below), keeping the section that
# scripts/bench-plot.sh writes there (throughput against messages in flight).
#
#   ./scripts/bench-queues.sh [MESSAGES] [ROUNDS] [SQS_MESSAGES]
#   # defaults: 5000 messages, 5 rounds, 200 on SQS (moto answers in about 40 ms per request)
set -euo pipefail
cd "$(dirname "$0")/.."
messages=${1:-5000}
rounds=${2:-5}
sqs_messages=${3:-200}
# The page goes to the target directory, never to docs/: the published pages are written by
# scripts/perf-report from recorded runs (bench/results/), and `--check` fails on a page typed
# or pasted by hand. The closing line says how to record this run.
mkdir -p "${CARGO_TARGET_DIR:-target}/bench-pages"
out="${CARGO_TARGET_DIR:-target}/bench-pages/performance-queues.md"
work=$(mktemp -d)
. scripts/bench-start-servers.sh
cleanup() {
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT

cargo build --release --locked -p idempotask-bench -p idempotask-test-support
bench=${CARGO_TARGET_DIR:-target}/release/queue-bench
start_servers redis nats rabbitmq moto tansu
echo "==> queues: $messages messages per run ($sqs_messages on SQS), in flight 1 and 64 (10 on SQS), $rounds rounds"
"$bench" --redis-url "$redis_url" --nats-url "$nats_url" --amqp-url "$amqp_url" --redis-streams \
  --sqs-url "$sqs_url" --kafka-url "$kafka_url" --messages "$messages" --sqs-messages "$sqs_messages" --in-flight 1,64 \
  --rounds "$rounds" --markdown "$work/queues.md" |
  tee "$work/queues.jsonl"

mkdir -p docs
plots=$(sed -n '/^<!-- BEGIN throughput plots/,/^<!-- END throughput plots/p' "$out" 2>/dev/null || true)
{
  echo "# Performance of the queue consumers"
  echo
  echo "Written by \`scripts/bench-queues.sh $messages $rounds $sqs_messages\` on $(date -u '+%Y-%m-%d %H:%M UTC'); do not edit by hand."
  echo
  echo "- Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(uname -sr)"
  echo "- Load while measuring: $(cut -d' ' -f1-3 /proc/loadavg) (the cores are shared with other work)"
  echo "- $(nats-server --version); RabbitMQ $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '(version unknown)'); $(redis-server --version | awk '{ print $1, $2, $3 }'); moto $(python3 -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null || echo '(version unknown)') (\`moto_server\`, in memory); $(tansu --version 2>/dev/null || echo 'tansu (version unknown)') (SQLite storage in a temporary directory); loopback, persistence off"
  echo "- $(rustc --version), release profile; one \`RedisStore\` for the integrations, one redis-rs \`ConnectionManager\` for the hand-written consumer; Redis Streams on that same Redis; the Redis Streams and SQS integrations' store a \`BatchingStore\` over the \`RedisStore\`, as their docs advise"
  echo
  echo "Each round publishes $messages fresh messages ($sqs_messages on SQS) (untimed) to a queue of their own for every"
  echo "broker, in-flight limit and consumer, then times their consumption; the consumers' order"
  echo "rotates round by round. msg/s are min, median and max over the rounds; the ratios compare"
  echo "medians of the same run. µs/msg over bare is \`1/median − 1/median(bare)\`, to set against"
  echo "two Redis round trips at 1 in flight."
  echo
  cat "$work/queues.md"
  if [ -n "$plots" ]; then
    echo
    echo "$plots"
  fi
} >"$out"
echo "wrote $out; to publish it: scripts/perf-report record queues-$(date -u +%Y-%m-%d) $out && scripts/perf-report"
