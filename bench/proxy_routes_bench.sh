#!/bin/sh
# Routing and the access log (issue 48): the same release behind two `rollgate proxy`s in
# interleaved rounds (medians): `one` serves it with --root and no access log; `routed` serves
# it through a --config of 10 routes, the request's host matching the last one, with the access
# log on; `unlogged` the same routes without the log. wrk keep-alive 32 (and LOADS="ka32 ka256 close32"); the proxy's CPU per request from
# /proc. Beside them, in the same rounds, nginx (bench/nginx.conf) in front of the same release
# without and with its own access log (JSON lines, buffered): what a user pays for logging every
# request in the tool they would otherwise use. Then the memory per route: RSS of an idle proxy
# with 1 route and with ROUTES routes.
# It starts the release, the proxies and nginx itself and stops those, by pid, and nothing else.
# Usage: sh bench/proxy_routes_bench.sh ROLLGATE [ROUNDS] [SECONDS]   (needs wrk and nginx)
set -eu
rollgate=$1
rounds=${2:-5}
seconds=${3:-8}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
pids=""
# The clean-up must run whole: `set -e` is off in it (a proxy already gone fails its kill).
trap 'set +e; for p in $pids; do kill "$p" 2>/dev/null; done; for f in "$root"/nginx-*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done; stop_releases "$root/main"; rm -rf "$root"; true' EXIT

mkdir -p "$root/main"
sample_release "$rollgate" "$root/main" a
"$rollgate" deploy svc "$(free_port)" a --root "$root/main" 2>/dev/null
oneport=$(free_port)
"$rollgate" proxy --listen 127.0.0.1:$oneport --root "$root/main" 2>/dev/null &
one=$!
pids="$one"

# Nine other services (roots whose pointer names the same release) and, last, the one the
# requests are for: a root of its own too (one proxy per root), the same release behind it.
config="$root/proxy.toml"
routedport=$(free_port)
printf 'listen = "127.0.0.1:%s"\naccess_log = true\n' "$routedport" >"$config"
i=0
while [ $i -lt 10 ]; do
  mkdir -p "$root/s$i"
  cp "$root/main/current" "$root/s$i/current"
  if [ $i -lt 9 ]; then host="svc$i.bench.test"; prefix="/svc$i"; else host="bench.test"; prefix="/"; fi
  printf '[[route]]\nhost = "%s"\npath_prefix = "%s"\nroot = "%s"\nservice = "s%s"\n' \
    "$host" "$prefix" "$root/s$i" "$i" >>"$config"
  i=$((i + 1))
done
"$rollgate" proxy --config "$config" 2>/dev/null &
routed=$!
pids="$pids $routed"
# variant NAME PREFIX PORT SED: the routed config changed by SED, listening on PORT, its ten
# roots under PREFIX (one proxy per root) naming the same release; prints the proxy's pid.
variant() {
  sed "s|^listen = .*|listen = \"127.0.0.1:$3\"|; s|$root/s|$root/$2|; $4" "$config" >"$root/$1.toml"
  for i in 0 1 2 3 4 5 6 7 8 9; do mkdir -p "$root/$2$i"; cp "$root/main/current" "$root/$2$i/current"; done
  "$rollgate" proxy --config "$root/$1.toml" >/dev/null 2>&1 &
  echo $!
}
# The same routes without the access log, to tell what the routing costs from what the log
# costs; and with the log sampled, one request in 10.
nologport=$(free_port)
unlogged=$(variant nolog n "$nologport" 's|^access_log = true|access_log = false|')
sampledport=$(free_port)
sampled=$(variant sampled p "$sampledport" 's|^access_log = true|access_log = true\naccess_log_sample = 10|')
pids="$pids $unlogged $sampled"

# nginx_front NAME PORT LOGCONF: nginx on PORT in front of the release, bench/nginx.conf with its
# `access_log off;` replaced by an include of LOGCONF; its master's pid in $root/nginx-NAME.pid.
direct=$(live_port "$root/main")
nginx_front() {
  nginx_config "$direct" "$2" "$root/nginx-$1.pid" "s|access_log off;|include $3;|" >"$root/nginx-$1.conf"
  nginx -c "$root/nginx-$1.conf"
}
echo 'access_log off;' >"$root/nginx-nolog.inc"
# The same fields as rollgate's access log, one JSON object a line, written through a buffer.
cat >"$root/nginx-log.inc" <<EOF
log_format rollgate escape=json '{"ts":"\$time_iso8601","host":"\$host","method":"\$request_method","path":"\$uri","status":\$status,"bytes":\$body_bytes_sent,"duration_ms":\$request_time,"client":"\$remote_addr","request_id":"\$request_id"}';
access_log $root/nginx-access.log rollgate buffer=64k flush=200ms;
EOF
ngnologport=$(free_port)
nginx_front nolog "$ngnologport" "$root/nginx-nolog.inc"
nglogport=$(free_port)
nginx_front log "$nglogport" "$root/nginx-log.inc"
sleep 0.5
# nginx_pids NAME: nginx's master and its workers.
nginx_pids() { m=$(cat "$root/nginx-$1.pid"); echo "$m $(pgrep -P "$m" | tr '\n' ' ')"; }

clk=$(getconf CLK_TCK)
results="$root/results"
: >"$results"
loads=${LOADS:-ka32}
for load in $loads; do
  case $load in
    ka32) conns=32 close="" ;;
    ka256) conns=256 close="" ;;
    close32) conns=32 close="Connection: close" ;;
  esac
  round=1
  while [ $round -le "$rounds" ]; do
    for target in one unlogged routed sampled nginx nginxlog; do
      case $target in
        nginx) pid=$(nginx_pids nolog) port=$ngnologport ;;
        nginxlog) pid=$(nginx_pids log) port=$nglogport ;;
        one) pid=$one port=$oneport ;;
        unlogged) pid=$unlogged port=$nologport ;;
        routed) pid=$routed port=$routedport ;;
        sampled) pid=$sampled port=$sampledport ;;
      esac
      before=$(ticks_of "$pid")
      if [ -n "$close" ]; then
        wrk -t1 -c$conns -H "Host: bench.test" -H "$close" -d"${seconds}s" "http://127.0.0.1:$port/" >"$root/wrk.out" 2>&1
      else
        wrk -t1 -c$conns -H "Host: bench.test" -d"${seconds}s" "http://127.0.0.1:$port/" >"$root/wrk.out" 2>&1
      fi
      after=$(ticks_of "$pid")
      rps=$(awk '/Requests\/sec/ { printf "%d", $2 }' "$root/wrk.out")
      requests=$(awk '/requests in/ { print $1 }' "$root/wrk.out")
      non2xx=$(awk '/Non-2xx/ { print $NF }' "$root/wrk.out")
      cpu=$(awk -v t=$((after - before)) -v c="$clk" -v n="$requests" 'BEGIN { if (n > 0) printf "%.2f", t / c * 1e6 / n; else print 0 }')
      echo "$load $target $round $rps $cpu ${non2xx:-0}" >>"$results"
      echo "$load round $round $target: $rps req/s, proxy CPU $cpu us/request, non-2xx ${non2xx:-0}" >&2
    done
    round=$((round + 1))
  done
done
lines=$(cat "$root"/s9/access.log* 2>/dev/null | wc -l)

echo "== wrk -t1 -d${seconds}s, Host: bench.test, medians of $rounds interleaved rounds"
echo "| load | one route, no log req/s | 10 routes, no log | 10 routes + access log | 10 routes + log 1 in 10 | routes / one | routes + log / one | + log 1 in 10 / one | CPU us/req: one, routes, routes + log, + log 1 in 10 |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
ratio() { awk -v r="$1" -v o="$2" 'BEGIN { printf "%.3f", r / o }'; }
for load in $loads; do
  o=$(field $load one 4); u=$(field $load unlogged 4); r=$(field $load routed 4); p=$(field $load sampled 4)
  oc=$(field $load one 5); uc=$(field $load unlogged 5); rc=$(field $load routed 5); pc=$(field $load sampled 5)
  echo "| $load | $o | $u | $r | $p | $(ratio "$u" "$o") | $(ratio "$r" "$o") | $(ratio "$p" "$o") | $oc, $uc, $rc, $pc |"
done
echo "access log lines written by the routed proxy: $lines"
echo
echo "| load | nginx no log req/s | nginx + access log | nginx + log / no log | nginx CPU us/req: no log, + log |"
echo "| --- | --- | --- | --- | --- |"
for load in $loads; do
  n=$(field $load nginx 4); l=$(field $load nginxlog 4)
  echo "| $load | $n | $l | $(ratio "$l" "$n") | $(field $load nginx 5), $(field $load nginxlog 5) |"
done
echo "access log lines written by nginx: $(wc -l <"$root/nginx-access.log")"

# Memory per route: idle proxies with 1 and with ROUTES routes (their own roots, nothing live).
routes=${ROUTES:-500}
for count in 1 "$routes"; do
  c="$root/mem$count.toml"
  printf 'listen = "127.0.0.1:%s"\n' "$(free_port)" >"$c"
  i=0
  while [ $i -lt "$count" ]; do
    mkdir -p "$root/m$count-$i"
    printf '[[route]]\nhost = "m%s.bench.test"\nroot = "%s"\n' "$i" "$root/m$count-$i" >>"$c"
    i=$((i + 1))
  done
  "$rollgate" proxy --config "$c" 2>/dev/null &
  p=$!
  pids="$pids $p"
  # Serving once every route's proxy.sock is there; then settled.
  tries=0
  while [ "$(ls "$root"/m$count-*/proxy.sock 2>/dev/null | wc -l)" -lt "$count" ] && [ $tries -lt 100 ]; do
    sleep 0.1; tries=$((tries + 1))
  done
  sleep 1
  echo "$count $(rss_kib_of "$p")" >>"$root/memory"
  kill "$p"
done
awk -v n="$routes" '$1 == 1 { a = $2 } $1 == n { b = $2 } END { printf "memory: 1 route %d KiB, %d routes %d KiB: %.1f KiB per route\n", a, n, b, (b - a) / (n - 1) }' "$root/memory"
