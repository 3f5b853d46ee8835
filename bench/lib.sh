# Shared by the shell benchmarks (source it). Everything here stops only what the benchmark
# started: a machine is shared, and stopping by a name pattern would end other people's processes.

# stop_releases ROOT: stops the keepers of ROOT and the release processes rollgate started in ROOT and still names in
# its pointer and its pool (`current`, `replicas.json`: the live release, a watch's fallback,
# each replica). rollgate starts every release in a process group of its own, so the group is
# signalled: a wrapper script and what it ran go together.
stop_releases() {
  # Their keepers first (SIGTERM: a keeper leaves its release running), or they would start
  # the releases again; a pid is signalled only while it is a keeper.
  for keeper in $(ls "$1/.keepers" 2>/dev/null); do
    if tr '\0' ' ' <"/proc/$keeper/cmdline" 2>/dev/null | grep -q '^[^ ]* keep '; then
      kill -TERM "$keeper" 2>/dev/null || true
    fi
  done
  sleep 0.2
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

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# sample_release ROLLGATE ROOT VERSION: releases/VERSION/svc runs ROLLGATE's sample service,
# from a copy (a hard link where it can) inside the release: a confined release runs only what
# is in its folder or the system's.
sample_release() {
  mkdir -p "$2/releases/$3"
  ln -f "$1" "$2/releases/$3/rollgate" 2>/dev/null || cp "$1" "$2/releases/$3/rollgate"
  printf '#!/bin/sh\nexec "$(dirname "$0")/rollgate" sample-service\n' >"$2/releases/$3/svc"
  chmod +x "$2/releases/$3/svc"
}

# live_port ROOT: the port of the release ROOT's pointer (`current`) names.
live_port() { sed -n 's/.*"port": *\([0-9]*\).*/\1/p' "$1/current"; }

# nginx_config UPSTREAM PORT PIDFILE [SED]: bench/nginx.conf (beside the running script) for a
# release on UPSTREAM, listening on PORT, its master's pid in PIDFILE, changed further by SED.
nginx_config() {
  sed "s/UPSTREAM/$1/; s/NGINX_PORT/$2/; s|/tmp/rollgate-bench-nginx.pid|$3|; ${4:-}" \
    "$(dirname "$0")/nginx.conf"
}

# front_the_release ROLLGATE ROOT: deploys release `a` (made already) in ROOT, then starts
# `rollgate proxy` and nginx (bench/nginx.conf) in front of it. Sets direct, pport and nport
# (the release's, the proxy's and nginx's ports) and proxy (the proxy's pid); nginx's master
# pid is in ROOT/nginx.pid. `stop_the_front ROOT` stops all three.
front_the_release() {
  "$1" deploy svc "$(free_port)" a --root "$2" 2>/dev/null
  direct=$(live_port "$2")
  pport=$(free_port)
  "$1" proxy --listen 127.0.0.1:$pport --root "$2" 2>/dev/null &
  proxy=$!
  nport=$(free_port)
  nginx_config "$direct" "$nport" "$2/nginx.pid" >"$2/nginx.conf"
  nginx -c "$2/nginx.conf"
  sleep 0.5
}

# stop_the_front ROOT: stops what front_the_release started (if it got that far): the proxy
# by $proxy, nginx by its master's pid file, and the releases of ROOT.
stop_the_front() {
  stop_releases "$1"
  [ -n "${proxy:-}" ] && kill "$proxy" 2>/dev/null
  [ -f "$1/nginx.pid" ] && kill "$(cat "$1/nginx.pid")" 2>/dev/null
  return 0
}

# Clock ticks of user + system time the processes have used.
ticks_of() {
  total=0
  for pid in $1; do
    t=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    total=$((total + t))
  done
  echo $total
}

# Resident memory (KiB) of the processes, added up.
rss_kib_of() {
  total=0
  for pid in $1; do
    r=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
    total=$((total + r))
  done
  echo $total
}

# median: the median of the numbers on stdin, one a line.
# field LOAD TARGET N: the median of column N over the rounds of LOAD and TARGET in the file
# $results (lines `load target round ...`).
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { awk -v l="$1" -v t="$2" -v f="$3" '$1 == l && $2 == t { print $f }' "$results" | median; }
