#!/bin/sh
# Two builds (or one build under two environments) of `rollgate proxy` side by side in front of
# the same release, keep-alive 32 (wrk -t1 -c32), in interleaved rounds: A, B, A, B, ...; per
# round the requests a second and the proxy's CPU ticks (user + system, /proc/PID/stat); then
# each proxy's AnonHugePages. Session 23 used it for mimalloc's transparent huge pages: one
# release binary as A, the same with B_ENV=MIMALLOC_ALLOW_THP=0 as B (BENCHMARKS.md).
# Usage: [B_ENV="VAR=value ..."] sh bench/proxy_ab.sh ROLLGATE_A ROLLGATE_B [ROUNDS] [SECONDS]
# It starts the release and both proxies and stops those, by pid, and nothing else.
set -eu
rollgate_a=$1
rollgate_b=$2
rounds=${3:-7}
seconds=${4:-6}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
proxy_a=
proxy_b=
trap 'set +e; [ -n "$proxy_a" ] && kill "$proxy_a"; [ -n "$proxy_b" ] && kill "$proxy_b"; stop_releases "$root"; rm -rf "$root"' EXIT
sample_release "$rollgate_a" "$root" a
"$rollgate_a" deploy svc "$(free_port)" a --root "$root" 2>/dev/null
# One proxy per root: B's root names the same release process.
root_b="$root/b"
mkdir -p "$root_b"
cp "$root/current" "$root_b/current"
port_a=$(free_port)
"$rollgate_a" proxy --listen 127.0.0.1:$port_a --root "$root" 2>/dev/null &
proxy_a=$!
port_b=$(free_port)
env ${B_ENV:-} "$rollgate_b" proxy --listen 127.0.0.1:$port_b --root "$root_b" 2>/dev/null &
proxy_b=$!
sleep 0.5

for round in $(seq "$rounds"); do
  for side in a b; do
    if [ $side = a ]; then port=$port_a pid=$proxy_a; else port=$port_b pid=$proxy_b; fi
    before=$(ticks_of "$pid")
    rps=$(wrk -t1 -c32 -d"${seconds}s" "http://127.0.0.1:$port/" | awk '/Requests\/sec/ { print $2 }')
    after=$(ticks_of "$pid")
    echo "round $round $side: $rps req/s, $((after - before)) ticks"
  done
done
for side in a b; do
  if [ $side = a ]; then pid=$proxy_a; else pid=$proxy_b; fi
  echo "$side: $(awk '/AnonHugePages/ { print $2, $3 }' "/proc/$pid/smaps_rollup") of anonymous huge pages"
done
