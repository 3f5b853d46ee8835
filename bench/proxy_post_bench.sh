#!/bin/sh
# Issue 79's proxy rows: keep-alive GET and POST (a 1 KiB body) with 32 connections through
# nginx (bench/nginx.conf), HAProxy (bench/haproxy.cfg) and `rollgate proxy` — this build and an
# older one given as OLD, to see what the fixes cost — in front of the same release (rollgate's
# sample service, which reads every body), in interleaved rounds; medians of req/s and of the
# CPU each request cost the proxy (user + system time of its processes over the run, from
# /proc/PID/stat, divided by the requests wrk counted). Failed requests (non-2xx, socket
# errors) are counted too.
# Usage: sh bench/proxy_post_bench.sh ROLLGATE OLD_ROLLGATE [ROUNDS] [SECONDS]
#   (needs wrk, nginx and haproxy). It starts each of them itself and stops those, by pid.
set -eu
rollgate=$1
old=$2
rounds=${3:-5}
seconds=${4:-8}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
proxy=
old_proxy=
haproxy_pid=
cleanup() {
  set +e
  [ -n "$old_proxy" ] && kill "$old_proxy" 2>/dev/null
  [ -n "$haproxy_pid" ] && kill "$haproxy_pid" 2>/dev/null
  stop_the_front "$root"
  rm -rf "$root"
}
trap cleanup EXIT
sample_release "$rollgate" "$root" a
front_the_release "$rollgate" "$root"
nginx_master=$(cat "$root/nginx.pid")
# The older build's proxy: a root of its own (one proxy per root) naming the same release.
old_root="$root/old"
mkdir -p "$old_root"
cp "$root/current" "$old_root/current"
oport=$(free_port)
"$old" proxy --listen 127.0.0.1:$oport --root "$old_root" 2>/dev/null &
old_proxy=$!
hport=$(free_port)
sed "s/UPSTREAM/$direct/; s/HAPROXY_PORT/$hport/" "$here/haproxy.cfg" >"$root/haproxy.cfg"
haproxy -f "$root/haproxy.cfg" -db 2>/dev/null &
haproxy_pid=$!
sleep 0.5
printf 'wrk.method = "POST"\nwrk.body = string.rep("x", 1024)\nwrk.headers["Content-Type"] = "application/octet-stream"\n' >"$root/post.lua"
# Counts every answer that is not 2xx (wrk counts only socket errors and non-2xx/3xx).
printf 'done = function(summary, latency, requests)\n  io.write(string.format("failed %%d\\n", summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))\nend\n' >"$root/done.lua"
cat "$root/post.lua" "$root/done.lua" >"$root/post_done.lua"

pids_of() {
  case $1 in
    nginx) echo "$nginx_master $(pgrep -P "$nginx_master" | tr '\n' ' ')" ;;
    haproxy) echo "$haproxy_pid" ;;
    rollgate) echo "$proxy" ;;
    old) echo "$old_proxy" ;;
  esac
}
url_of() {
  case $1 in
    nginx) echo "http://127.0.0.1:$nport/" ;;
    haproxy) echo "http://127.0.0.1:$hport/" ;;
    rollgate) echo "http://127.0.0.1:$pport/" ;;
    old) echo "http://127.0.0.1:$oport/" ;;
  esac
}
clk=$(getconf CLK_TCK)
results="$root/results"
: >"$results"
for round in $(seq "$rounds"); do
  for load in get post; do
    for target in nginx haproxy rollgate old; do
      script="$root/done.lua"
      [ "$load" = post ] && script="$root/post_done.lua"
      pids=$(pids_of "$target")
      before=$(ticks_of "$pids")
      wrk -t2 -c32 -d"${seconds}s" -s "$script" "$(url_of "$target")" >"$root/out" 2>&1
      after=$(ticks_of "$pids")
      requests=$(awk '/requests in/ { print $1 }' "$root/out")
      failed=$(awk '/^failed/ { print $2 }' "$root/out")
      awk -v l="$load" -v t="$target" -v r="$requests" -v f="$failed" -v s="$seconds" \
        -v c=$((after - before)) -v k="$clk" -v round="$round" \
        'BEGIN { printf "%s %s %s %.0f %.2f %d\n", round, l, t, r / s, (c / k) * 1e6 / r, f }' >>"$results"
    done
  done
done
echo "load target req/s(median) cpu_us/req(median) failed(total) rounds"
for load in get post; do
  for target in nginx haproxy rollgate old; do
    awk -v l="$load" -v t="$target" '$2 == l && $3 == t { print $4, $5, $6 }' "$results" >"$root/these"
    rps=$(cut -d' ' -f1 "$root/these" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    cpu=$(cut -d' ' -f2 "$root/these" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    failed=$(cut -d' ' -f3 "$root/these" | awk '{ s += $1 } END { print s }')
    all=$(cut -d' ' -f1 "$root/these" | tr '\n' ' ')
    echo "$load $target $rps $cpu $failed ($all)"
  done
done
