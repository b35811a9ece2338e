# Sourced by the bench scripts, after `cargo build --release -p idempotask-test-support`:
# `start_servers SERVER…` starts servers through test-support (test-support/src/bin/servers.rs:
# free loopback ports, persistence off) and sets the variables it prints, such as redis_url,
# redis_port, redis_pid, cluster_urls, postgres_url, postgres_log, nats_url and amqp_url. They
# stop at `stop_servers`, when the script exits (which closes their starter's standard input),
# or when the script dies without closing it (the starter watches its parent).
servers_pids=()
servers_inputs=()
start_servers() {
  local dir output input line
  dir=$(mktemp -d)
  mkfifo "$dir/out"
  # The starter's standard input is a pipe this shell holds; its output comes through a FIFO,
  # read line by line: `ready` once every server answers, the end of it if the starter failed.
  exec {input}> >(exec "${CARGO_TARGET_DIR:-target}/release/servers" "$@" >"$dir/out")
  servers_pids+=("$!")
  servers_inputs+=("$input")
  exec {output}<"$dir/out"
  rm -rf "$dir"
  line=
  while IFS= read -r -u "$output" line && [ "$line" != ready ]; do
    declare -g "$line"
  done
  exec {output}<&-
  if [ "$line" != ready ]; then
    echo "the servers did not start: $*" >&2
    exit 1
  fi
}
stop_servers() { # closes every starter's standard input and waits until its servers are gone
  local input pid
  for input in "${servers_inputs[@]}"; do exec {input}>&-; done
  for pid in "${servers_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  servers_inputs=()
  servers_pids=()
}
