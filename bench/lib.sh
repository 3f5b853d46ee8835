# Shared by the shell benchmarks (source it). Everything here stops only what the benchmark
# started: a machine is shared, and stopping by a name pattern would end other people's processes.

# stop_releases ROOT: stops the release processes rollgate started in ROOT and still names in
# its pointer and its pool (`current`, `replicas.json`: the live release, a watch's fallback,
# each replica). rollgate starts every release in a process group of its own, so the group is
# signalled: a wrapper script and what it ran go together.
stop_releases() {
  pids=$(cat "$1/current" "$1/replicas.json" 2>/dev/null | grep -o '"pid": *[0-9]*' | grep -o '[0-9]*$' | sort -u)
  for pid in $pids; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $pids; do
    tries=0
    while kill -0 "$pid" 2>/dev/null && [ $tries -lt 50 ]; do sleep 0.1; tries=$((tries + 1)); done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
