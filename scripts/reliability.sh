#!/usr/bin/env bash
# Runs the reliability suite (tests/reliability.rs) in release mode and writes its figures to
# docs/reliability.md. Every scenario injects its faults into a server the test starts: redis-server,
# and valkey-server for those that need no Redis-only feature.
set -euo pipefail
cd "$(dirname "$0")/.."

rows="target/tmp/reliability-rows.md"
mkdir -p target/tmp
rm -f "$rows"
cargo test --release --locked --test reliability -- --test-threads=1
[ -s "$rows" ] || { echo "no figures were recorded" >&2; exit 1; }

out=docs/reliability.md
mkdir -p docs
{
  echo "# Reliability report"
  echo
  echo "Written by \`scripts/reliability.sh\` from the figures \`tests/reliability.rs\` records; the"
  echo "same scenarios run (in debug mode) in the README's test command, asserting what must hold."
  echo
  echo "- date: $(date -u +%Y-%m-%d)"
  echo "- machine: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB; build: release"
  echo "- Redis: $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), persistence off unless the scenario says (AOF \`appendfsync always\` in 8)"
  echo "- Valkey: $(valkey-server --version | sed 's/.*v=\([^ ]*\).*/\1/') for the scenarios marked so (\`finish\` and \`renew\` as \`SET … IFEQ\`); the others run on Redis only"
  echo "- timeouts: response timeout 400–500 ms where a scenario injects faults, 2 s otherwise; lock TTLs 0.3–1 s in the fault scenarios"
  echo "- random inputs: proptest with its default RNG, 2,000 cases"
  echo
  echo "| scenario | what held, and the figures |"
  echo "|---|---|"
  sort -t'|' -k2,2n "$rows"
} > "$out.tmp"
# Keep any hand-written sections that follow the generated table (e.g. Redis Cluster).
if [ -f "$out" ] && grep -q '^## ' "$out"; then
  echo >> "$out.tmp"
  sed -n '/^## /,$p' "$out" >> "$out.tmp"
fi
mv "$out.tmp" "$out"
echo "wrote $out"
