#!/bin/sh
# TLS benchmark (issue 47): nginx (bench/nginx-tls.conf) and `rollgate proxy --tls-listen` with
# the same ECDSA P-256 certificate (made here with openssl) and the same release behind them,
# in interleaved rounds (nginx, rollgate; ROUNDS times; medians) for four loads: keep-alive
# over TLS with 32 and 256 connections (wrk), a new TLS connection per request (wrk with
# `Connection: close`: handshakes a second), and HTTP/2 with h2load, 32 connections x 10
# streams. For each, the CPU a request cost the proxy: user + system time of its processes
# over the run (/proc/PID/stat) divided by the requests counted. Then the memory of idle TLS
# connections: RSS of the proxy's processes before and after IDLE (5000) connections that
# finished their handshake and sit idle.
# It starts the release, nginx and the proxy itself and stops those, by pid, and nothing else.
# Usage: sh bench/proxy_tls_bench.sh ROLLGATE [ROUNDS] [SECONDS]  (needs wrk, h2load
# from nghttp2-client, nginx, openssl, python3)
set -eu
rollgate=$1
rounds=${2:-3}
seconds=${3:-8}
idle=${IDLE:-5000}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
proxy=
trap 'set +e; stop_the_front "$root"; rm -rf "$root"' EXIT
ulimit -n 65536 2>/dev/null || true

# One certificate for both: a CA and an ECDSA P-256 leaf for bench.test, served as the default
# (wrk and h2load connect to 127.0.0.1 and send no name).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=bench-ca \
  -keyout "$root/ca.key" -out "$root/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=bench.test \
  -keyout "$root/leaf.key" -out "$root/leaf.csr" 2>/dev/null
printf 'subjectAltName=DNS:bench.test\n' >"$root/leaf.ext"
openssl x509 -req -in "$root/leaf.csr" -CA "$root/ca.pem" -CAkey "$root/ca.key" -CAcreateserial \
  -days 7 -extfile "$root/leaf.ext" -out "$root/leaf.pem" 2>/dev/null

sample_release "$rollgate" "$root" a
"$rollgate" deploy svc "$(free_port)" a --root "$root" 2>/dev/null
direct=$(live_port "$root")
plain=$(free_port)
rport=$(free_port)
"$rollgate" proxy --listen 127.0.0.1:$plain --tls-listen 127.0.0.1:$rport --root "$root" \
  --tls-cert "default=$root/leaf.pem,$root/leaf.key" 2>/dev/null &
proxy=$!
nport=$(free_port)
sed "s/UPSTREAM/$direct/; s/NGINX_PORT/$nport/; s|PIDFILE|$root/nginx.pid|; s|CERT|$root/leaf.pem|; s|KEY|$root/leaf.key|" \
  "$here/nginx-tls.conf" >"$root/nginx.conf"
nginx -c "$root/nginx.conf"
sleep 0.5
nginx_master=$(cat "$root/nginx.pid")

pids_of() {
  case $1 in
    nginx) echo "$nginx_master $(pgrep -P "$nginx_master" | tr '\n' ' ')" ;;
    rollgate) echo "$proxy" ;;
  esac
}
port_of() { case $1 in nginx) echo $nport ;; rollgate) echo $rport ;; esac; }

clk=$(getconf CLK_TCK)
results="$root/results"
: >"$results"
loads=${LOADS:-ka32 ka256 new32 h2}
for load in $loads; do
  round=1
  while [ $round -le "$rounds" ]; do
    for target in nginx rollgate; do
      pids=$(pids_of $target)
      url="https://127.0.0.1:$(port_of $target)/"
      before=$(ticks_of "$pids")
      case $load in
        ka32) wrk -t1 -c32 -d"${seconds}s" "$url" >"$root/out" 2>&1 ;;
        ka256) wrk -t1 -c256 -d"${seconds}s" "$url" >"$root/out" 2>&1 ;;
        new32) wrk -t1 -c32 -H "Connection: close" -d"${seconds}s" "$url" >"$root/out" 2>&1 ;;
        h2) h2load -c32 -m10 -t1 -D "$seconds" "$url" >"$root/out" 2>&1 ;;
      esac
      after=$(ticks_of "$pids")
      case $load in
        h2)
          rps=$(awk '/^finished in/ { gsub(",", ""); printf "%d", $4 }' "$root/out")
          requests=$(awk '/^requests:/ { print $8 }' "$root/out")
          failed=$(awk '/^requests:/ { print $10 + $12 }' "$root/out")
          ;;
        *)
          rps=$(awk '/Requests\/sec/ { printf "%d", $2 }' "$root/out")
          requests=$(awk '/requests in/ { print $1 }' "$root/out")
          failed=$(awk '/Socket errors/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' "$root/out")
          ;;
      esac
      cpu=$(awk -v t=$((after - before)) -v c="$clk" -v n="${requests:-0}" 'BEGIN { if (n > 0) printf "%.1f", t / c * 1e6 / n; else print 0 }')
      echo "$load $target $round ${rps:-0} $cpu ${failed:-0}" >>"$results"
      echo "$load round $round $target: ${rps:-0} req/s, proxy CPU $cpu us/request, failed ${failed:-0}" >&2
    done
    round=$((round + 1))
  done
done

echo "== TLS throughput, medians of $rounds interleaved rounds of ${seconds}s (wrk -t1; h2load -c32 -m10 -t1)"
echo "| load | nginx req/s | rollgate req/s | rollgate / nginx | nginx CPU us/req | rollgate CPU us/req | failed (nginx / rollgate) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for load in $loads; do
  n=$(field $load nginx 4); r=$(field $load rollgate 4)
  nc=$(field $load nginx 5); rc=$(field $load rollgate 5)
  ratio=$(awk -v r="$r" -v n="$n" 'BEGIN { if (n > 0) printf "%.2f", r / n; else print "-" }')
  echo "| $load | $n | $r | $ratio | $nc | $rc | $(field $load nginx 6) / $(field $load rollgate 6) |"
done

# Memory per idle TLS connection: IDLE handshaken connections held open by one Python process.
echo "== memory of $idle idle TLS connections (RSS of the proxy's processes, after - before)"
for target in nginx rollgate; do
  pids=$(pids_of $target)
  before=$(rss_kib_of "$pids")
  python3 - "$(port_of $target)" "$idle" "$root/ca.pem" "$root/held.$target" <<'PY' &
import socket, ssl, sys, time
port, count, ca, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
held = []
for _ in range(count):
    raw = socket.create_connection(("127.0.0.1", port))
    held.append(ctx.wrap_socket(raw, server_hostname="bench.test"))
open(flag, "w").write(str(len(held)))
time.sleep(30)
PY
  holder=$!
  tries=0
  while [ ! -s "$root/held.$target" ] && [ $tries -lt 600 ]; do sleep 0.2; tries=$((tries + 1)); done
  sleep 1
  after=$(rss_kib_of "$pids")
  kill $holder 2>/dev/null || true
  wait $holder 2>/dev/null || true
  echo "$target: $before KiB -> $after KiB: $(awk -v a="$after" -v b="$before" -v n="$idle" 'BEGIN { printf "%.1f", (a - b) / n }') KiB per idle TLS connection"
  sleep 2
done
