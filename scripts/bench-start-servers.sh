# Sourced by the bench scripts, after `cargo build --release -p idempotask-test-support`:
# `start_servers SERVER…` starts servers through test-support (test-support/src/bin/servers.rs:
# free loopback ports, persistence off) and sets the variables it prints, such as redis_url,
# redis_port, redis_pid, cluster_urls, postgres_url and postgres_log. They stop when the script
# exits, which closes their starter's standard input, or at `stop_servers`.
servers_pids=()
servers_inputs=()
start_servers() {
  local out line input
  out=$(mktemp)
  # The starter's standard input is a pipe only this shell holds.
  exec {input}> >(exec "${CARGO_TARGET_DIR:-target}/release/servers" "$@" >"$out")
  servers_pids+=("$!")
  servers_inputs+=("$input")
  until grep -qx ready "$out"; do
    kill -0 "$!" 2>/dev/null || { echo "the servers did not start: $*" >&2; rm -f "$out"; exit 1; }
    sleep 0.05
  done
  while IFS= read -r line; do [ "$line" = ready ] || declare -g "$line"; done <"$out"
  rm -f "$out"
}
stop_servers() { # closes every starter's standard input and waits until its servers are gone
  local input pid
  for input in "${servers_inputs[@]}"; do exec {input}>&-; done
  for pid in "${servers_pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  done
  servers_inputs=()
  servers_pids=()
}
