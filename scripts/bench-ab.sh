#!/usr/bin/env bash
# A change's cost against a base revision, in one run on one pair of servers: the bench built
# from BASE (in a temporary worktree) and from the working tree, run against the same Redis 7 and
# Valkey 8.1 (started through test-support, persistence off), `fresh` and `duplicate` at C = 64,
# round by round with the two builds' order swapped every round, so that a machine that gets
# busier mid-run weighs on both. Prints, per server and mode, the minimum, median and maximum
# tasks/s of each build, the medians of client and server CPU per task, and the ratio of the
# medians. With INSTRUCTIONS=1 it also counts the client's instructions per task under
# `valgrind --tool=callgrind` on Redis (the difference between a run of 3 N and one of N tasks,
# so start-up cancels out), with one tokio worker thread: several threads make the count swing
# by 5 % from run to run as they steal and park, one keeps it within about 1 %, and the
# machine's load does not move it. That is the figure for changes under 10 %.
#
#   ./scripts/bench-ab.sh BASE [ROUNDS] [TASKS]      # defaults: 5 rounds, 20000 tasks
#   INSTRUCTIONS=1 ./scripts/bench-ab.sh main~3
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/bench-ab.sh BASE [ROUNDS] [TASKS]}
rounds=${2:-5}
tasks=${3:-20000}
work=$(mktemp -d)
base_tree="$work/base"
. scripts/bench-start-servers.sh
cleanup() {
  stop_servers
  git worktree remove --force "$base_tree" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

git rev-parse --verify --quiet "$base^{commit}" >/dev/null || { echo "not a revision: $base" >&2; exit 2; }
echo "==> building the bench of the working tree and of $base ($(git rev-parse --short "$base"))"
cargo build --release --locked -p idempotask-bench -p idempotask-test-support
git worktree add --detach --quiet "$base_tree" "$base"
# A target directory of its own, kept between runs: the base's dependencies build once.
CARGO_TARGET_DIR="$(pwd)/target/bench-ab-base" cargo build --release --locked \
  --manifest-path "$base_tree/Cargo.toml" -p idempotask-bench
declare -A bench=([base]="target/bench-ab-base/release/bench" [head]="target/release/bench")

start_servers redis valkey
results="$work/results.jsonl"
for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then order=(base head); else order=(head base); fi
  for server in redis valkey; do
    url_var=${server}_url
    for mode in fresh duplicate; do
      for build in "${order[@]}"; do
        line=$("${bench[$build]}" --redis-url "${!url_var}" --mode "$mode" --tasks "$tasks" \
          --concurrency 64 --rounds 1 | tail -n 1)
        echo "{\"build\":\"$build\",\"server\":\"$server\",\"round\":$round,\"run\":$line}" >>"$results"
        echo "round $round $server $mode $build: $(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["tasks_per_sec"]))' "$line") tasks/s"
      done
    done
  done
done

if [ "${INSTRUCTIONS:-0}" = 1 ]; then
  command -v valgrind >/dev/null || { echo "INSTRUCTIONS=1 needs valgrind" >&2; exit 1; }
  n=$((tasks / 10))
  for build in base head; do
    for mode in fresh duplicate; do
      counts=()
      for size in "$n" $((3 * n)); do
        TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" "${bench[$build]}" \
          --redis-url "$redis_url" --mode "$mode" --tasks "$size" --concurrency 64 --rounds 1 \
          >/dev/null 2>"$work/callgrind.err"
        counts+=("$(grep -o 'Collected : [0-9]*' "$work/callgrind.err" | grep -o '[0-9]*$')")
      done
      echo "{\"build\":\"$build\",\"mode\":\"$mode\",\"instructions_per_task\":$(((counts[1] - counts[0]) / (2 * n)))}" >>"$work/instructions.jsonl"
    done
  done
fi

python3 - "$results" "$work/instructions.jsonl" "$base" <<'PY'
import json, statistics, sys
from collections import defaultdict

results, instructions, base = sys.argv[1], sys.argv[2], sys.argv[3]
runs = defaultdict(list)
for line in open(results):
    row = json.loads(line)
    runs[(row["server"], row["run"]["mode"], row["build"])].append(row["run"])
print(f"\n| server | mode | build | tasks/s min | median | max | client CPU µs/task | server CPU µs/task |")
print("|---|---|---|---:|---:|---:|---:|---:|")
medians = {}
for (server, mode, build) in sorted(runs, key=lambda k: (k[0], k[1], k[2] != "base")):
    rows = runs[(server, mode, build)]
    rates = [r["tasks_per_sec"] for r in rows]
    medians[(server, mode, build)] = statistics.median(rates)
    label = f"base ({base})" if build == "base" else "working tree"
    print(f"| {server} | {mode} | {label} | {min(rates):,.0f} | {statistics.median(rates):,.0f} | {max(rates):,.0f} "
          f"| {statistics.median(r['client_cpu_us_per_task'] for r in rows):.1f} "
          f"| {statistics.median(r['redis_cpu_us_per_task'] for r in rows):.2f} |")
print()
for (server, mode, build), median in sorted(medians.items()):
    if build == "head":
        print(f"{server} {mode}: working tree / base = {median / medians[(server, mode, 'base')]:.3f} (medians of {len(runs[(server, mode, build)])} rounds)")
try:
    counts = {(r["build"], r["mode"]): r["instructions_per_task"] for r in map(json.loads, open(instructions))}
except FileNotFoundError:
    counts = {}
# A `duplicate` run first stores its keys, untimed but counted here: its fresh share is taken
# out with the `fresh` run's figure.
for build in ("base", "head"):
    if (build, "duplicate") in counts:
        counts[(build, "duplicate")] -= counts[(build, "fresh")]
for mode in ("fresh", "duplicate"):
    if ("base", mode) in counts:
        b, h = counts[("base", mode)], counts[("head", mode)]
        print(f"client instructions per {mode} task (Redis): base {b:,}, working tree {h:,} ({h / b - 1:+.1%})")
PY
