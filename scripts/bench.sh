#!/usr/bin/env bash
# The benchmark end to end: starts a redis-server of its own through test-support (persistence
# off, a free loopback port), runs every bench mode in release mode, the criterion
# micro-benchmarks and a profile, and writes the page for docs/performance.md (into the target
# directory: see below); then scripts/bench-plot.sh
# draws throughput against tasks in flight on Redis 7, Valkey 8.1, NATS and RabbitMQ into it.
#
#   ./scripts/bench.sh [TASKS] [ROUNDS]      # defaults: 20000 tasks, 3 rounds
#   ./scripts/bench.sh --plot-only [ARGS]    # only the plots: scripts/bench-plot.sh [ARGS]
#
# Needs redis-server and valgrind (apt-get install redis-server valgrind); uses perf from
# linux-perf where the kernel lets it sample.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --plot-only ]; then
  shift
  exec scripts/bench-plot.sh "$@"
fi
tasks=${1:-20000}
rounds=${2:-3}
# The page goes to the target directory, never to docs/: the published pages are written by
# scripts/perf-report from recorded runs (bench/results/), and `--check` fails on a page typed
# or pasted by hand. The closing line says how to record this run.
mkdir -p "${CARGO_TARGET_DIR:-target}/bench-pages"
out="${CARGO_TARGET_DIR:-target}/bench-pages/performance.md"
work=$(mktemp -d)
. scripts/bench-start-servers.sh
cleanup() {
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT

for tool in redis-server redis-cli valgrind callgrind_annotate; do
  command -v "$tool" >/dev/null || { echo "bench.sh needs $tool (apt-get install redis-server valgrind)" >&2; exit 1; }
done

echo "==> building (release)"
cargo build --release --locked -p idempotask-bench -p idempotask-test-support
bench=target/release/bench
start_servers redis
url=$redis_url
port=$redis_port

echo "==> bench: all modes, $tasks tasks, C = 64, $rounds rounds"
"$bench" --redis-url "$url" --mode all --tasks "$tasks" --concurrency 64 --rounds "$rounds" \
  --markdown "$work/tables.md" | tee "$work/bench.jsonl"

echo "==> criterion"
cargo bench --locked -p idempotask-redis --bench client_side -- --warm-up-time 1 --measurement-time 3 \
  | tee "$work/criterion.txt"
# `name  time: [low median high]`, the name alone on the line before when it is long.
criterion_table=$(awk '
  /time:/ { name = $0; sub(/time:.*/, "", name); gsub(/^ +| +$/, "", name); if (name == "") name = prev
            split($0, t, /[][]/); split(t[2], v, " "); printf "| %s | %s %s |\n", name, v[3], v[4] }
  NF && !/^ / { prev = $0; gsub(/^ +| +$/, "", prev) }' "$work/criterion.txt")

echo "==> future sizes"
sizes=$(cargo test --release --locked -p idempotask --test future_sizes -- --nocapture | grep '^future sizes:')
# name=bytes now, next to what the same test measured before the body was boxed (1207bab).
sizes_table=$(echo "$sizes" | tr ' ' '\n' | awk -F= '
  BEGIN {
    before["body"] = 4128; before["attribute"] = 96616; before["trivial"] = 2040
    before["nested"] = 48960; before["run"] = 46888; before["run_reported"] = 42680
    before["async_trait"] = 96800; before["transactional"] = 9088
    what["body"] = "a plain `async fn` body holding a 4 KiB buffer across an await"
    what["attribute"] = "the same body under `#[idempotent_task]`"
    what["trivial"] = "a trivial task (`Ok(order_id)`) under the attribute"
    what["nested"] = "a task whose body awaits a trivial task"
    what["run"] = "the 4 KiB body through `Task::call(..).run(body)`"
    what["run_reported"] = "the same through `run_reported`"
    what["async_trait"] = "the 4 KiB body in an `#[async_trait]` impl, under the attribute"
    what["transactional"] = "the 4 KiB body through `run_in_transaction`"
  }
  NF == 2 { printf "| %s | %s | %s |\n", what[$1], before[$1], $2 }')

echo "==> profile (callgrind: instructions of the client per task)"
# Two sizes per mode: the difference divided by the difference in calls leaves out start-up.
callgrind_run() { # mode tasks
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.$1.$2" \
    "$bench" --redis-url "$url" --mode "$1" --tasks "$2" --concurrency 64 \
    >/dev/null 2>"$work/valgrind.$1.$2.log"
}
total_ir() { # mode tasks
  callgrind_annotate "$work/callgrind.$1.$2" 2>/dev/null \
    | awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1; exit }'
}
for mode in fresh handwritten-fresh duplicate handwritten-duplicate; do
  callgrind_run "$mode" 1000
  callgrind_run "$mode" 3000
done
per_call() { # mode -> instructions per key of that mode (duplicates include their set-up)
  echo $(( ($(total_ir "$1" 3000) - $(total_ir "$1" 1000)) / 2000 ))
}
ir_fresh=$(per_call fresh)
ir_hand_fresh=$(per_call handwritten-fresh)
ir_dup=$(( $(per_call duplicate) - ir_fresh ))
ir_hand_dup=$(( $(per_call handwritten-duplicate) - ir_hand_fresh ))
top_functions() { # mode -> the 25 functions with the most instructions of their own
  callgrind_annotate --threshold=100 "$work/callgrind.$1.3000" 2>/dev/null \
    | awk '/file:function/ { on = 1; next } on && NF && !/^-+$/ { print }' | sed -n 1,25p \
    | sed -E 's/ +\([^)]*\)//; s/^ +//; s/ \[[^]]*\]$//' | cut -c1-150
}

server_profile="(perf cannot sample on this kernel)"
if perf record -e cpu-clock -o "$work/perf.probe" -- true >/dev/null 2>&1; then
  echo "==> profile (perf: where redis-server spends its CPU in fresh)"
  # An empty keyspace, so that the bench's closing SCAN for lock keys stays out of the profile.
  redis-cli -p "$port" flushall >/dev/null
  perf record -e cpu-clock -F 4000 -o "$work/perf.redis" -p "$redis_pid" >/dev/null 2>&1 &
  perf_pid=$!
  # perf needs a moment to attach; a run that ends before it has would leave no samples.
  sleep 1
  "$bench" --redis-url "$url" --mode fresh --tasks "$tasks" --concurrency 64 >/dev/null
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  server_profile=$(perf report -i "$work/perf.redis" --stdio --sort dso,sym 2>&1 \
    | grep -v '^#' | grep -v '^$' | sed -n 1,30p || true)
fi

echo "==> Redis Cluster: 3 masters and 3 replicas on this machine, bench --cluster"
# Started now, not with the single server: its six processes stay out of the runs above.
start_servers cluster
"$bench" --cluster --redis-url "$cluster_urls" --mode all --tasks "$tasks" --concurrency 64 --rounds 1 \
  --markdown "$work/cluster.md" | tee "$work/cluster.jsonl"

echo "==> writing $out"
mkdir -p docs
{
  echo "# Performance"
  echo
  echo "Written by \`scripts/bench.sh $tasks $rounds\` on $(date -u '+%Y-%m-%d %H:%M UTC'); do not edit by hand."
  echo
  echo "This is Redis $(redis-server --version | awk '{ print $3 }' | sed 's/v=//') only, with the profiles and the cluster; the same targets on"
  echo "Redis 7 and Valkey 8.1 side by side are in [\`performance-servers.md\`](performance-servers.md)"
  echo "(\`scripts/bench-servers.sh\`)."
  echo
  echo "- Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(uname -sr)"
  echo "- Load while measuring: $(cut -d' ' -f1-3 /proc/loadavg) (the cores are shared with other work)"
  echo "- Redis: $(redis-server --version | awk '{ print $3 }' | sed 's/v=//'), on loopback, persistence off"
  echo "- $(rustc --version), release profile; one \`RedisStore\` (one multiplexed connection)"
  echo
  # Filled by scripts/bench-plot.sh, below.
  echo "<!-- BEGIN throughput plots: written by scripts/bench-plot.sh; do not edit by hand -->"
  echo "<!-- END throughput plots -->"
  echo
  echo "## Bench (\`cargo run --release -p idempotask-bench -- --mode all --tasks $tasks --concurrency 64 --rounds $rounds\`)"
  echo
  echo "Calls are task calls (C per key in \`contended\`). cmds/task counts the commands the client"
  echo "sent (\`INFO commandstats\` deltas, leaving out what scripts run inside and the store's"
  echo "refused \`SET … IFEQ\` that asks a server without it every 5 s). Redis cmd µs is the"
  echo "commands' own time from commandstats; Redis CPU and client CPU are process CPU time per call"
  echo "(\`INFO cpu\`, \`/proc/self/stat\`)."
  echo
  cat "$work/tables.md"
  echo
  echo "## Client-side work per task (criterion, median)"
  echo
  echo "| benchmark | time |"
  echo "|---|---:|"
  echo "$criterion_table"
  echo
  echo "The \`per task\` lines are what one call does on the client besides I/O (target: under 2 µs)."
  echo "A whole call on \`MemoryStore\` adds the runner (task-local context, drop guard, boxed store"
  echo "futures) and the in-memory store itself."
  echo
  echo "## Future sizes (\`runtime/tests/future_sizes.rs\`, release, bytes before the first poll)"
  echo
  echo "| future | before | now |"
  echo "|---|---:|---:|"
  echo "$sizes_table"
  echo
  cat <<'TEXT'
Sizes are deterministic for a given compiler (rustc 1.95 here, the same in debug and release);
the test asserts bounds, and `scripts/bench.sh` regenerates this table from it. The body's
future is moved to the heap once, when the call is made, and every layer of the runner holds a
pointer to it: the task's future is the runner's own state, whatever the body holds. What
remains (about 900 bytes) is the call (task, key, fingerprint, store: 72 bytes), its span and
observation (about 100), the lock token and the drop guard that releases or records in the
background (about 150), and the largest store step in flight: asking for the lock (about 300)
or recording the result (about 270). Timers for waiting on a busy key or a failing store, the
renewal watchdog and the late-grant release are boxed when they happen, so they cost nothing to
calls that do not need them. The price is one allocation per call, for the body.
TEXT
  echo
  echo "## Where the time goes"
  echo
  echo "Client instructions per task call (callgrind; the difference between 3000 and 1000 calls"
  echo "at C = 64, so start-up is left out; the client's whole process: runner, redis-rs, tokio,"
  echo "allocator, system call entry):"
  echo
  echo "| mode | instructions per call |"
  echo "|---|---:|"
  echo "| fresh | $ir_fresh |"
  echo "| handwritten-fresh | $ir_hand_fresh |"
  echo "| duplicate | $ir_dup |"
  echo "| handwritten-duplicate | $ir_hand_dup |"
  echo
  echo "Functions with the most instructions of their own, \`fresh\`:"
  echo
  echo '```text'
  top_functions fresh
  echo '```'
  echo
  echo "redis-server during \`fresh\` (perf, cpu-clock samples; the binary is stripped, so Lua's"
  echo "interpreter shows as bare addresses):"
  echo
  echo '```text'
  echo "$server_profile"
  echo '```'
  echo
  echo "## Redis Cluster (\`bench --cluster --mode all --tasks $tasks --concurrency 64 --rounds 1\`)"
  echo
  echo "The same modes through \`RedisClusterStore\` (and the hand-written pattern through the same"
  echo "cluster connection) on a local cluster of 3 masters and 3 replicas, all six processes on this"
  echo "machine's $(nproc) cores next to the bench; the server columns are sums over the masters. This"
  echo "shows what the cluster costs per task on one machine, not how it scales across machines."
  echo
  cat "$work/cluster.md"
  if [ -f docs/performance-notes.md ]; then
    echo
    cat docs/performance-notes.md
  fi
} >"$out"
echo "wrote $out; to publish it: scripts/perf-report record redis-$(date -u +%Y-%m-%d) $out && scripts/perf-report"

# Its own servers, one kind at a time: the ones above would only take CPU from it.
stop_servers
echo "==> throughput against tasks in flight (scripts/bench-plot.sh)"
scripts/bench-plot.sh
