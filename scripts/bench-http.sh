#!/usr/bin/env bash
# The HTTP layer against the `idempotent` crate's layer: one axum app (handler awaits 1 ms,
# answers 201), one Redis of its own (started through test-support: free loopback port,
# persistence off), every workload in one run, best of ROUNDS rounds, rounds interleaved.
# Prints Markdown for docs/performance-http.md:
#
#   1. one process: server and 64 reqwest clients share every core, Redis too;
#   2. two processes: the server pinned to CPU 0, Redis and the load generator to CPU 1; then
#      that server's CPU time per request, workload by workload, and a perf profile of it on
#      fresh keys (where the kernel lets perf sample);
#   3. with valgrind: the server's instructions per request, workload by workload, and the
#      functions our layer adds them in (callgrind, the difference between 3000 and 1000
#      requests, so start-up and warm-up cancel out). PROFILE=0 skips it; KEEP_PROFILE=DIR
#      keeps the dumps.
#
#   ./scripts/bench-http.sh [REQUESTS] [ROUNDS]      # defaults: 20000 requests, 4 rounds
#
# bench/http-compare is outside the workspace: `idempotent` 2 declares rust-version 1.98, so it
# is built with --ignore-rust-version. Needs redis-server, redis-cli and taskset (util-linux);
# valgrind for the profile.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-20000}
rounds=${2:-4}
concurrency=64
profile=${PROFILE:-1}
work=$(mktemp -d)
pids=()
. scripts/bench-start-servers.sh
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT

for tool in redis-server redis-cli taskset; do
  command -v "$tool" >/dev/null || { echo "bench-http.sh needs $tool (apt-get install redis-server redis-tools util-linux)" >&2; exit 1; }
done
if [ "$profile" = 1 ]; then
  for tool in valgrind callgrind_control callgrind_annotate; do
    command -v "$tool" >/dev/null || { echo "bench-http.sh needs $tool for the profile (apt-get install valgrind; PROFILE=0 skips it)" >&2; exit 1; }
  done
fi
[ "$(nproc)" -ge 2 ] || { echo "bench-http.sh pins to CPUs 0 and 1: it needs 2 cores" >&2; exit 1; }

echo "==> building bench/http-compare (release)" >&2
# The workspace's target directory unless told otherwise: the crates both build are shared.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --locked --ignore-rust-version --manifest-path bench/http-compare/Cargo.toml >&2
bench=$CARGO_TARGET_DIR/release/http-compare

cargo build --release --locked -p idempotask-test-support >&2
start_servers redis

serve() { # log [command prefix…] -> starts the server on a free port; sets server_pid, server_url
  local log=$1; shift
  server_pid=
  for _ in $(seq 20); do
    local port=$((20000 + RANDOM % 40000))
    "$@" "$bench" --redis-url "$redis_url" --serve "127.0.0.1:$port" >"$log" 2>&1 &
    server_pid=$!
    # The server prints its address once it listens; a taken port makes it exit.
    until grep -q '^listening on' "$log" || ! kill -0 "$server_pid" 2>/dev/null; do sleep 0.1; done
    if kill -0 "$server_pid" 2>/dev/null; then pids+=("$server_pid"); break; fi
    server_pid=
  done
  [ -n "$server_pid" ] || { echo "the bench server did not start:" >&2; cat "$log" >&2; exit 1; }
  server_url=$(sed -n "s/^listening on //p" "$log" | sed -n 1p)
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "==> 1: one process, nothing pinned; $requests requests, C = $concurrency, best of $rounds" >&2
"$bench" --redis-url "$redis_url" --requests "$requests" --concurrency "$concurrency" \
  --rounds "$rounds" >"$work/shared.md"
load_shared=$(cut -d' ' -f1-3 /proc/loadavg)

echo "==> 2: server on CPU 0; Redis and the load generator on CPU 1" >&2
taskset -a -p -c 1 "$redis_pid" >/dev/null
serve "$work/server.log" taskset -c 0
taskset -c 1 "$bench" --load "$server_url" --requests "$requests" --concurrency "$concurrency" \
  --rounds "$rounds" >"$work/pinned.md"
# The same server's CPU time per request, workload by workload (utime + stime from /proc, in
# clock ticks), Redis's (INFO cpu), and where a fresh request's goes (perf, sampling, where the kernel lets it).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$server_pid/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))
redis_cpu_us() { # Redis's own CPU time so far (INFO cpu), in µs
  redis-cli -p "$redis_port" info cpu | tr -d '\r' \
    | awk -F: '/^used_cpu_(sys|user):/ { t += $2 } END { printf "%d", t * 1000000 }'
}
for workload in plain fresh fresh-unrenewed fresh-through-blocking duplicates idempotent-fresh idempotent-duplicates; do
  before=$(cpu_ticks); redis_before=$(redis_cpu_us)
  taskset -c 1 "$bench" --load "$server_url" --workload "$workload" --requests "$requests" \
    --concurrency "$concurrency" --rounds 1 >/dev/null
  echo "| $workload | $(( ($(cpu_ticks) - before) * tick_us / requests )) | $(( ($(redis_cpu_us) - redis_before) / requests )) |" >>"$work/cpu.md"
done
perf_top="(perf cannot sample on this kernel)"
if command -v perf >/dev/null && perf record -e cpu-clock -o "$work/perf.probe" -- true >/dev/null 2>&1; then
  perf record -e cpu-clock -F 2000 -o "$work/perf.fresh" -p "$server_pid" >/dev/null 2>&1 &
  perf_pid=$!
  # perf needs a moment to attach; a load that ends before it has would leave no samples.
  sleep 1
  taskset -c 1 "$bench" --load "$server_url" --workload fresh --requests "$requests" \
    --concurrency "$concurrency" --rounds 1 >/dev/null
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  perf_top=$(perf report -i "$work/perf.fresh" --stdio --sort dso,sym 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | sed -n 1,30p | cut -c1-160 || true)
fi
stop "$server_pid"
taskset -a -p -c 0-"$(($(nproc) - 1))" "$redis_pid" >/dev/null
load_pinned=$(cut -d' ' -f1-3 /proc/loadavg)

echo "## One process: server, clients and Redis share $(nproc) cores"
echo
echo "Load average before, after: $load_before; $load_shared."
echo
cat "$work/shared.md"
echo
echo "## Two processes: server on CPU 0, Redis and clients on CPU 1"
echo
echo "Load average after: $load_pinned."
echo
cat "$work/pinned.md"
echo
echo "Server CPU per request, same server ($requests requests of each workload alone, CPU 1 loading):"
echo
echo "| workload | server CPU µs per request | Redis CPU µs per request |"
echo "| --- | ---: | ---: |"
cat "$work/cpu.md"
echo
echo "Where the server's CPU goes on fresh keys (perf, cpu-clock samples, top 30):"
echo
echo '```text'
echo "$perf_top"
echo '```'

[ "$profile" = 1 ] || exit 0

echo "==> 3: callgrind on the server, workload by workload" >&2
# One server under callgrind, instrumenting only while a load runs; each load ends in a dump.
serve "$work/callgrind.log" valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/callgrind.out"
workloads=(plain fresh duplicates idempotent-fresh idempotent-duplicates)
for workload in "${workloads[@]}"; do
  for n in 1000 3000; do
    callgrind_control -z "$server_pid" >/dev/null
    callgrind_control -i on "$server_pid" >/dev/null
    "$bench" --load "$server_url" --workload "$workload" --requests "$n" \
      --concurrency "$concurrency" --rounds 1 >/dev/null
    callgrind_control -i off "$server_pid" >/dev/null
    callgrind_control -d "$workload-$n" "$server_pid" >/dev/null
  done
done
stop "$server_pid"
# KEEP_PROFILE=DIR keeps the dumps, for `callgrind_annotate --tree=caller` and the like.
if [ -n "${KEEP_PROFILE:-}" ]; then mkdir -p "$KEEP_PROFILE"; cp "$work"/callgrind.out.* "$KEEP_PROFILE"/; fi
# Dumps are numbered in order: .1 and .2 for the first workload's 1000 and 3000, and so on.
dump() { # workload n -> its dump file
  local index=0 i
  for i in "${!workloads[@]}"; do [ "${workloads[$i]}" = "$1" ] && index=$((i * 2 + 1)); done
  [ "$2" = 3000 ] && index=$((index + 1))
  echo "$work/callgrind.out.$index"
}
functions() { # file -> "Ir<TAB>function<TAB>object" for each function's own instructions
  [ -e "$1.functions" ] || functions_of "$1" >"$1.functions"
  cat "$1.functions"
}
functions_of() { # file -> what `functions` prints, from callgrind_annotate (slow: run once a file)
  callgrind_annotate --threshold=100 --inclusive=no "$1" 2>/dev/null \
    | awk '/file:function/ { on = 1; next }
           on && NF && !/^-+$/ { ir = $1; gsub(/,/, "", ir); line = $0
                                 sub(/^ *[0-9,]+ +\([^)]*\) +/, "", line); sub(/^[^:]*:/, "", line)
                                 object = line; sub(/.*\[/, "", object); sub(/\]$/, "", object)
                                 sub(/.*\//, "", object); sub(/ \[[^]]*\]$/, "", line)
                                 print ir "\t" line "\t" object }'
}
total() { # file -> total instructions
  callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(/,/, "", $1); print $1; done = 1 }'
}
echo
echo "## Server instructions per request (callgrind)"
echo
echo "Valgrind hides SHA-NI from the program, so \`sha2\` takes its software path here (about"
echo "3 500 instructions a hash); natively, where the CPU has SHA-NI, it is a small part (the perf"
echo "profile above)."
echo
echo "| workload | instructions per request | more than no layer |"
echo "| --- | ---: | ---: |"
plain_ir=
for workload in "${workloads[@]}"; do
  small=$(dump "$workload" 1000); large=$(dump "$workload" 3000)
  per=$(( ($(total "$large") - $(total "$small")) / 2000 ))
  [ -n "$plain_ir" ] || plain_ir=$per
  echo "| $workload | $per | $((per - plain_ir)) |"
done
# What the layer adds, by function: (fresh 3000 - fresh 1000) - (plain 3000 - plain 1000), per
# request, so that the server's own work (hyper, axum, the handler's timer) cancels out.
added() { # workload -> "per-request Ir<TAB>function<TAB>object", most first
  {
    functions "$(dump "$1" 3000)" | sed 's/^/a\t/'
    functions "$(dump "$1" 1000)" | sed 's/^/b\t/'
    functions "$(dump plain 3000)" | sed 's/^/c\t/'
    functions "$(dump plain 1000)" | sed 's/^/d\t/'
  } | awk -F'\t' '
      { sign = ($1 == "a" || $1 == "d") ? 1 : -1; key = $3 "\t" $4; diff[key] += sign * $2 }
      END { for (f in diff) if (diff[f] >= 2000) printf "%d\t%s\n", diff[f] / 2000, f }' \
    | sort -t$'\t' -k1,1nr
}
for workload in fresh duplicates; do
  echo
  echo "### What idempotask-http adds per request, $workload (functions' own instructions, top 25)"
  echo
  echo "| instructions | function |"
  echo "| ---: | --- |"
  added "$workload" | sed -n 1,25p | awk -F'\t' '{ f = substr($2, 1, 150); gsub(/\|/, "\\|", f); printf "| %s | `%s` |\n", $1, f }'
  echo
  echo "By crate (the path's first segment; a function without one by its object, e.g. libc's"
  echo "malloc, free and memcpy):"
  echo
  echo "| instructions | crate |"
  echo "| ---: | --- |"
  added "$workload" | awk -F'\t' '{
      name = $2; gsub(/^[<&( ]+/, "", name); sub(/^(dyn|mut|impl) /, "", name)
      if (match(name, /^[A-Za-z_][A-Za-z0-9_]*::/)) crate = substr(name, 1, RLENGTH - 2)
      else crate = $3
      sum[crate] += $1 }
    END { for (c in sum) printf "%d\t%s\n", sum[c], c }' | sort -t$'\t' -k1,1nr | sed -n 1,15p \
    | awk -F'\t' '{ printf "| %s | `%s` |\n", $1, $2 }'
done
