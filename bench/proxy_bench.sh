#!/bin/sh
# Proxy benchmark (issue 40): the release directly, nginx (bench/nginx.conf, the reverse proxy a
# user would otherwise put there) and `rollgate proxy`, in interleaved rounds (direct, nginx,
# rollgate; ROUNDS times; medians) for four loads: keep-alive with 32 and 256 connections, and a
# new connection per request (`Connection: close`) with 32 and 256. For nginx and rollgate, the
# CPU each request cost the proxy: user + system time of its processes over the run
# (/proc/PID/stat), divided by the requests wrk counted. Then p99 latency at half of rollgate's
# saturation rate (oha -q, interleaved too), and failed requests under load across 100 deploys.
# Issue 38: a second rollgate proxy with counting off (`--no-counting`, on a second root naming
# the same release) runs in the same rounds, so counting's cost is measured side by side.
# It starts the release, nginx and the proxy itself and stops those, by pid, and nothing else.
# Usage: sh bench/proxy_bench.sh ROLLGATE [ROUNDS] [SECONDS]   (needs wrk, oha and nginx)
# LOADS="ka32 ..." runs only those loads; DEPLOYS=0 skips the deploys under load.
set -eu
rollgate=$1
rounds=${2:-3}
seconds=${3:-8}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
proxy=
trap 'set +e; stop_the_front "$root"; rm -rf "$root"' EXIT
sample_release "$rollgate" "$root" a
sample_release "$rollgate" "$root" b
front_the_release "$rollgate" "$root"
nginx_master=$(cat "$root/nginx.pid")
# The counting-off proxy: a root of its own (one proxy per root) whose pointer names the same
# release process.
uncounted_root="$root/uncounted"
mkdir -p "$uncounted_root"
cp "$root/current" "$uncounted_root/current"
uport=$(free_port)
"$rollgate" proxy --listen 127.0.0.1:$uport --root "$uncounted_root" --no-counting 2>/dev/null &
uncounted=$!
trap 'set +e; kill "$uncounted" 2>/dev/null; stop_the_front "$root"; rm -rf "$root"' EXIT
sleep 0.3

# The processes that serve a target: nginx's master and its workers; rollgate's proxy.
pids_of() {
  case $1 in
    nginx) echo "$nginx_master $(pgrep -P "$nginx_master" | tr '\n' ' ')" ;;
    rollgate) echo "$proxy" ;;
    uncounted) echo "$uncounted" ;;
    *) echo "" ;;
  esac
}
url_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$direct/" ;;
    nginx) echo "http://127.0.0.1:$nport/" ;;
    rollgate) echo "http://127.0.0.1:$pport/" ;;
    uncounted) echo "http://127.0.0.1:$uport/" ;;
  esac
}
# wrk's p99 in ms (it prints us, ms or s).
p99_ms() { awk '$1 == "99%" { v = $2; if (v ~ /us$/) { sub(/us/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms/, "", v) } else if (v ~ /s$/) { sub(/s/, "", v); v *= 1000 }; printf "%.2f", v }' "$1"; }

clk=$(getconf CLK_TCK)
results="$root/results"
: >"$results"
loads=${LOADS:-ka32 ka256 close32 close256}
for load in $loads; do
  # The header as one word: wrk reads `Name: value` (without the space it sends no close).
  case $load in
    ka32) conns=32 close="" ;;
    ka256) conns=256 close="" ;;
    close32) conns=32 close="Connection: close" ;;
    close256) conns=256 close="Connection: close" ;;
  esac
  round=1
  while [ $round -le "$rounds" ]; do
    for target in direct nginx rollgate uncounted; do
      pids=$(pids_of $target)
      before=$(ticks_of "$pids")
      if [ -n "$close" ]; then
        wrk -t1 -c$conns -H "$close" -d"${seconds}s" --latency "$(url_of $target)" >"$root/wrk.out" 2>&1
      else
        wrk -t1 -c$conns -d"${seconds}s" --latency "$(url_of $target)" >"$root/wrk.out" 2>&1
      fi
      after=$(ticks_of "$pids")
      rps=$(awk '/Requests\/sec/ { printf "%d", $2 }' "$root/wrk.out")
      requests=$(awk '/requests in/ { print $1 }' "$root/wrk.out")
      errors=$(awk '/Socket errors/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' "$root/wrk.out")
      non2xx=$(awk '/Non-2xx/ { print $NF }' "$root/wrk.out")
      cpu=$(awk -v t=$((after - before)) -v c="$clk" -v n="$requests" 'BEGIN { if (n > 0) printf "%.1f", t / c * 1e6 / n; else print 0 }')
      echo "$load $target $round $rps $cpu $(p99_ms "$root/wrk.out") ${errors:-0} ${non2xx:-0}" >>"$results"
      echo "$load round $round $target: $rps req/s, proxy CPU $cpu us/request, p99 $(p99_ms "$root/wrk.out") ms, socket errors ${errors:-0}, non-2xx ${non2xx:-0}" >&2
    done
    round=$((round + 1))
  done
done

echo "== throughput: wrk -t1 -d${seconds}s, medians of $rounds interleaved rounds"
echo "| load | direct req/s | nginx req/s | rollgate req/s | rollgate / nginx | nginx CPU us/req | rollgate CPU us/req | counting off req/s | counting on / off | p99 ms nginx / on / off |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for load in $loads; do
  d=$(field $load direct 4); n=$(field $load nginx 4); r=$(field $load rollgate 4)
  nc=$(field $load nginx 5); rc=$(field $load rollgate 5); u=$(field $load uncounted 4)
  ratio=$(awk -v r="$r" -v n="$n" 'BEGIN { printf "%.2f", r / n }')
  cost=$(awk -v r="$r" -v u="$u" 'BEGIN { printf "%.3f", r / u }')
  p99s="$(field $load nginx 6) / $(field $load rollgate 6) / $(field $load uncounted 6)"
  echo "| $load | $d | $n | $r | $ratio | $nc | $rc | $u | $cost | $p99s |"
done

# p99 at half of rollgate's keep-alive saturation, interleaved rounds, medians.
rate=${RATE:-$(awk -v r="$(field ka32 rollgate 4)" 'BEGIN { printf "%d", r / 2 }')}
echo "== latency at half of rollgate's saturation: oha -q $rate -c8 -z10s, medians of $rounds rounds"
: >"$root/latency"
round=1
while [ $round -le "$rounds" ]; do
  for target in direct nginx rollgate uncounted; do
    oha --no-tui -q "$rate" -c 8 -z 10s "$(url_of $target)" >"$root/oha.out" 2>&1
    p50=$(awk '/50.00%/ { printf "%.3f", $3 * ($4 == "ms" ? 1 : ($4 == "sec" || $4 == "secs" ? 1000 : 1)) }' "$root/oha.out")
    p99=$(awk '/99.00%/ { printf "%.3f", $3 * ($4 == "ms" ? 1 : ($4 == "sec" || $4 == "secs" ? 1000 : 1)) }' "$root/oha.out")
    echo "$target $p50 $p99" >>"$root/latency"
    echo "latency round $round $target: p50 $p50, p99 $p99 ($(grep -E 'Success rate' "$root/oha.out" | tr -s ' '))" >&2
  done
  round=$((round + 1))
done
for target in direct nginx rollgate uncounted; do
  p50=$(awk -v t=$target '$1 == t { print $2 }' "$root/latency" | median)
  p99=$(awk -v t=$target '$1 == t { print $3 }' "$root/latency" | median)
  echo "$target: p50 $p50 ms, p99 $p99 ms"
done

deploys=${DEPLOYS:-100}
[ "$deploys" -gt 0 ] || exit 0
echo "== $deploys deploys under load through the proxy"
wrk -t1 -c16 -d600s "http://127.0.0.1:$pport/" >"$root/wrk.out" 2>&1 &
load=$!
i=0; version=b
while [ $i -lt "$deploys" ]; do
  "$rollgate" deploy svc "$(free_port)" $version --root "$root" --grace-ms 1000 2>/dev/null || echo "deploy $i failed"
  if [ $version = b ]; then version=a; else version=b; fi
  i=$((i + 1))
done
kill -INT $load; wait $load 2>/dev/null || true
grep -E 'requests in|Non-2xx|Socket errors|Requests/sec' "$root/wrk.out" || true
echo "promoted: $(grep -c '"promoted"' "$root/deploy.log"), drained by the proxy: $(grep -c 'proxy drained' "$root/deploy.log")"
