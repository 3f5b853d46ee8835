#!/bin/sh
# Where a proxied request's CPU goes (issue 40): `rollgate proxy` and nginx (bench/nginx.conf)
# in front of the same sample-service release, each under `wrk -t1 -c32` keep-alive; during it,
# `perf stat` (CPU, context switches, system calls per request) and `perf record -g` of the
# proxy's process and of nginx's workers; then the top of each profile. It stops what it
# started, by pid. Usage: sh bench/proxy_profile.sh ROLLGATE [OUT_DIR]   (needs perf, wrk, nginx)
set -eu
rollgate=$1
out=${2:-$(mktemp -d)}
mkdir -p "$out"
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
proxy=
trap 'set +e; stop_the_front "$root"; rm -rf "$root"' EXIT
sample_release "$rollgate" "$root" a
front_the_release "$rollgate" "$root"
workers=$(pgrep -P "$(cat "$root/nginx.pid")" | tr '\n' ',' | sed 's/,$//')
for target in "rollgate $pport $proxy" "nginx $nport $workers"; do
  set -- $target
  wrk -t1 -c32 -d10s "http://127.0.0.1:$2/" >"$out/wrk.$1" &
  load=$!
  sleep 1
  perf stat -e task-clock,context-switches,raw_syscalls:sys_enter -p "$3" -- sleep 8 2>"$out/stat.$1"
  wait $load
  wrk -t1 -c32 -d9s "http://127.0.0.1:$2/" >/dev/null &
  load=$!
  sleep 1
  perf record -F 1999 -g -p "$3" -o "$out/perf.$1" -- sleep 6 >/dev/null 2>&1
  wait $load
  # Requests in the 8 s measured: wrk's rate over its run, times 8 (a count of writes would
  # depend on how each proxy writes: rollgate writes a relayed request with one send).
  rps=$(awk '/Requests\/sec/ { print $2 }' "$out/wrk.$1")
  awk -v who="$1" -v rps="$rps" '/task-clock/ { gsub(",", "", $1); ms = $1 } /context-switches/ { gsub(",", "", $1); cs = $1 }
    /raw_syscalls/ { gsub(",", "", $1); sc = $1 }
    END { n = rps * 8; printf "%s: %.1f us CPU, %.2f syscalls, %.2f context switches per request (%d requests in 8 s)\n", who, ms * 1000 / n, sc / n, cs / n, n }' "$out/stat.$1"
  perf report -i "$out/perf.$1" --no-children --sort dso -g none 2>/dev/null | grep '%' | head -4
  perf report -i "$out/perf.$1" --no-children --sort sym -g none 2>/dev/null | grep '\[\.\]' | head -25
done
echo "profiles in $out"
