#!/usr/bin/env bash
# The PostgreSQL modes of the bench (PostgresStore, transactional completion, and the
# hand-written insert-on-conflict pattern they replace), next to RedisStore's fresh and duplicate
# modes on a redis-server started alongside, in one run. Starts both servers through
# test-support on free loopback ports (PostgreSQL with pg_stat_statements, for statements per
# task, and fsync on; Redis with persistence off) and writes the page for docs/performance-postgres.md
# (into the target directory: see below).
#
#   ./scripts/bench-postgres.sh [TASKS] [ROUNDS]      # defaults: 10000 tasks, 3 rounds
#
# BENCH_PG_MODES=pg-handwritten-transactional,pg-transactional runs only the modes it names (to
# profile a pair closely); the page then lacks the others' rows, so record full runs only.
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-10000}
rounds=${2:-3}
# The page goes to the target directory, never to docs/: the published pages are written by
# scripts/perf-report from recorded runs (bench/results/), and `--check` fails on a page typed
# or pasted by hand. The closing line says how to record this run.
mkdir -p "${CARGO_TARGET_DIR:-target}/bench-pages"
out="${CARGO_TARGET_DIR:-target}/bench-pages/performance-postgres.md"
work=$(mktemp -d)
. scripts/bench-start-servers.sh
cleanup() {
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT

# For the server's version in the page.
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

cargo build --release --locked -p idempotask-bench -p idempotask-test-support
bench=${CARGO_TARGET_DIR:-target}/release/bench
# fsync and full-page writes on, as users run PostgreSQL (the tests turn them off), and the
# server's default max_connections (100).
start_servers postgres shared_preload_libraries=pg_stat_statements fsync=on full_page_writes=on \
  redis
echo "==> PostgreSQL: $tasks tasks, C = 64, $rounds rounds"
"$bench" --database-url "$postgres_url" --tasks "$tasks" \
  --concurrency 64 --rounds "$rounds" --markdown "$work/pg.md" | tee "$work/pg.jsonl"
echo "==> Redis: fresh and duplicate, $tasks tasks, C = 64"
for mode in fresh duplicate; do
  "$bench" --redis-url "$redis_url" --mode "$mode" --tasks "$tasks" \
    --concurrency 64 | tee -a "$work/redis.jsonl"
done

mkdir -p docs
{
  echo "# Performance on PostgreSQL"
  echo
  echo "Written by \`scripts/bench-postgres.sh $tasks $rounds\` on $(date -u '+%Y-%m-%d %H:%M UTC'); do not edit by hand."
  echo
  echo "- Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(uname -sr)"
  echo "- Load while measuring: $(cut -d' ' -f1-3 /proc/loadavg) (the cores are shared with other work)"
  echo "- $("$bin/postgres" --version); loopback; \`fsync\` on, default settings (\`max_connections\` 100), \`pg_stat_statements\` loaded"
  echo "- $(rustc --version), release profile; the application's sqlx pool of 64 connections, the store's own of $(grep -o 'DEFAULT_MAX_CONNECTIONS: u32 = [0-9]*' stores/postgres/src/store.rs | grep -o '[0-9]*$')"
  echo "- Connections the server refused (\`too many clients\` in its log): $(grep -c 'too many clients' "$postgres_log" || true)"
  echo
  echo "Each round runs every idempotask mode right after its hand-written counterpart, so each"
  echo "ratio compares runs that saw the same machine. The hand-written pattern is"
  echo "\`INSERT … ON CONFLICT DO NOTHING\`, then an \`UPDATE\` with the result (fresh) or a \`SELECT\`"
  echo "of it (duplicate); transactional, the same inside one transaction with the side effect (an"
  echo "\`INSERT\` into another table). statements/task counts what the server ran"
  echo "(\`pg_stat_statements\`), \`BEGIN\` and \`COMMIT\` included. \`pg-transactional-table-floor\` is"
  echo "the hand-written transactional pattern written against the store's own table (its two-column"
  echo "key with a \`bytea\`, its columns and \`CHECK\`), looking at no expiry, doubt or fencing: what"
  echo "that table allows at best, the floor of \`pg-transactional\`."
  echo
  cat "$work/pg.md"
  echo
  echo "WAL bytes/task is \`pg_current_wal_lsn()\` before and after each mode; client CPU is the bench"
  echo "process's user and system time (\`/proc/self/stat\`), server CPU that of every \`postgres\`"
  echo "process (backends, WAL writer, autovacuum; \`/proc/<pid>/stat\`); mean µs is \`pg_stat_statements\`'"
  echo "\`mean_exec_time\`, which leaves out parsing, planning, executor start-up and the commit's WAL"
  echo "flush, and on this machine includes waiting for a core."
  echo
  echo "## Notes"
  echo
  echo "- \`begin\` runs \`begin_fresh\` first: one \`INSERT … ON CONFLICT DO NOTHING\`, and the row that"
  echo "  is there read from the statement's snapshot when nothing was inserted. Every execution of a"
  echo "  prepared statement sets up its whole plan again (executor start-up, not in mean µs), so the"
  echo "  common path is the smallest plan that answers it: no conflict action, no second read of the"
  echo "  row before the insert, and without fencing no sequence named. An expired row or the caller's"
  echo "  own lock (a repeated grant) goes on to the full statement, as before, one statement more."
  echo "- A duplicate still writes nothing and locks nothing: \`DO NOTHING\` checks the primary key"
  echo "  before it inserts and skips a committed row without locking it, so no transaction id is"
  echo "  assigned and the commit does not wait for a WAL flush."
  echo "- The store's statements are shared strings (\`Arc<str>\`): handing one to sqlx copies no text."
  echo "- Where the time goes: a fresh task, plain or transactional, commits as often as the hand-written"
  echo "  pattern (WAL bytes/task within a few percent of it). What is left is mostly the server's CPU"
  echo "  per task (server CPU µs/task against the hand-written pattern's), then the client's (the"
  echo "  runner: token, spans, marker). Client and server share this machine's cores, so at C = 64"
  echo "  tasks/s follows their sum. One statement at a time (pgbench, C = 1) the store's \`begin\` and"
  echo "  \`finish\` took from as long as the hand-written pair to 1.8 times as long, run to run, on this"
  echo "  shared machine: too noisy to split the difference between them."
  echo
  echo "## RedisStore on the same machine, same run ($(redis-server --version | awk '{ print $1, $2, $3 }'), persistence off)"
  echo
  echo "| mode | C | keys | tasks/s | cmds/task | p50 µs | p99 µs |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  python3 - "$work/redis.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print("| {mode} | {concurrency} | {tasks} | {tasks_per_sec:.0f} | {redis_commands_per_task:.2f} | {p50_us} | {p99_us} |".format(**m))
PY
} >"$out"
echo "wrote $out; to publish it: scripts/perf-report record postgres-$(date -u +%Y-%m-%d) $out && scripts/perf-report"
