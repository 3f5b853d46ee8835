#!/bin/sh
# Two builds (or one build under two environments) of `rollgate proxy` side by side in front of
# the same release, in interleaved rounds (A, B, A, B, ...) for each load; per round the
# requests a second and the proxy's CPU ticks (user + system, /proc/PID/stat); then the medians
# and B's throughput as a share of A's, each side's CPU per request (median of its rounds'
# ticks over requests), and each proxy's AnonHugePages.
# Loads (LOADS, default "ka32"): plain HTTP keep-alive with 32 or 256 connections (ka32, ka256),
# a new connection per request (new32, new256: `Connection: close`), the same over TLS
# (tls-ka32, tls-ka256, tls-new32; an ECDSA P-256 certificate made here with openssl) and
# HTTP/2 over TLS (h2: h2load, 32 connections x 10 streams) — the loads of proxy_bench.sh and
# proxy_tls_bench.sh.
# Session 23 used it for mimalloc's transparent huge pages (one release binary as A, the same
# with B_ENV=MIMALLOC_ALLOW_THP=0 as B); session 30 for the proxy's layering (the build before
# as A, after as B), session 37 for the filter chain (issue 71). BENCHMARKS.md has them.
# Usage: [LOADS="ka32 ..."] [B_ENV="VAR=value ..."] sh bench/proxy_ab.sh ROLLGATE_A ROLLGATE_B
#        [ROUNDS] [SECONDS]   (needs wrk; h2load from nghttp2-client for h2; openssl)
# It starts the release and both proxies and stops those, by pid, and nothing else.
set -eu
rollgate_a=$1
rollgate_b=$2
rounds=${3:-7}
seconds=${4:-6}
loads=${LOADS:-ka32}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
proxy_a=
proxy_b=
trap 'set +e; [ -n "$proxy_a" ] && kill "$proxy_a"; [ -n "$proxy_b" ] && kill "$proxy_b"; stop_releases "$root"; rm -rf "$root"' EXIT
ulimit -n 65536 2>/dev/null || true

# One certificate for both, served as the default (wrk and h2load send no name).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=bench.test \
  -addext subjectAltName=DNS:bench.test -keyout "$root/leaf.key" -out "$root/leaf.pem" 2>/dev/null

sample_release "$rollgate_a" "$root" a
"$rollgate_a" deploy svc "$(free_port)" a --root "$root" 2>/dev/null
# One proxy per root: B's root names the same release process.
root_b="$root/b"
mkdir -p "$root_b"
cp "$root/current" "$root_b/current"
port_a=$(free_port)
tls_a=$(free_port)
"$rollgate_a" proxy --listen 127.0.0.1:$port_a --tls-listen 127.0.0.1:$tls_a --root "$root" \
  --tls-cert "default=$root/leaf.pem,$root/leaf.key" 2>/dev/null &
proxy_a=$!
port_b=$(free_port)
tls_b=$(free_port)
env ${B_ENV:-} "$rollgate_b" proxy --listen 127.0.0.1:$port_b --tls-listen 127.0.0.1:$tls_b \
  --root "$root_b" --tls-cert "default=$root/leaf.pem,$root/leaf.key" 2>/dev/null &
proxy_b=$!
sleep 0.5

# Requests a second of one run of LOAD against the proxy on PORT (plain) / TLS_PORT.
run_load() {
  load=$1 port=$2 tls_port=$3
  case $load in
    ka32) wrk -t1 -c32 -d"${seconds}s" "http://127.0.0.1:$port/" ;;
    ka256) wrk -t1 -c256 -d"${seconds}s" "http://127.0.0.1:$port/" ;;
    new32) wrk -t1 -c32 -H "Connection: close" -d"${seconds}s" "http://127.0.0.1:$port/" ;;
    new256) wrk -t1 -c256 -H "Connection: close" -d"${seconds}s" "http://127.0.0.1:$port/" ;;
    tls-ka32) wrk -t1 -c32 -d"${seconds}s" "https://127.0.0.1:$tls_port/" ;;
    tls-ka256) wrk -t1 -c256 -d"${seconds}s" "https://127.0.0.1:$tls_port/" ;;
    tls-new32) wrk -t1 -c32 -H "Connection: close" -d"${seconds}s" "https://127.0.0.1:$tls_port/" ;;
    h2) h2load -c32 -m10 -t1 -D "$seconds" "https://127.0.0.1:$tls_port/" ;;
    *) echo "unknown load $load" >&2; exit 2 ;;
  esac | awk '/Requests\/sec/ { print $2 } /^finished in/ { gsub(",", "", $4); print $4 }'
}

results="$root/results"
: >"$results"
for load in $loads; do
  for round in $(seq "$rounds"); do
    for side in a b; do
      if [ $side = a ]; then port=$port_a tls=$tls_a pid=$proxy_a; else port=$port_b tls=$tls_b pid=$proxy_b; fi
      before=$(ticks_of "$pid")
      rps=$(run_load "$load" "$port" "$tls")
      after=$(ticks_of "$pid")
      echo "$load round $round $side: $rps req/s, $((after - before)) ticks"
      echo "$load $side $rps $((after - before))" >>"$results"
    done
  done
done
echo "== medians of $rounds interleaved rounds of ${seconds}s (B as a share of A)"
for load in $loads; do
  a=$(awk -v l="$load" '$1 == l && $2 == "a" { print $3 }' "$results" | median)
  b=$(awk -v l="$load" '$1 == l && $2 == "b" { print $3 }' "$results" | median)
  # CPU per request: the proxy's ticks (10 ms each) over the requests of its round.
  cpu_a=$(awk -v l="$load" -v s="$seconds" '$1 == l && $2 == "a" { printf "%.2f\n", $4 * 10000 / ($3 * s) }' "$results" | median)
  cpu_b=$(awk -v l="$load" -v s="$seconds" '$1 == l && $2 == "b" { printf "%.2f\n", $4 * 10000 / ($3 * s) }' "$results" | median)
  echo "$load: A $a req/s, B $b req/s, B/A $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }'); CPU per request A $cpu_a µs, B $cpu_b µs"
done
for side in a b; do
  if [ $side = a ]; then pid=$proxy_a; else pid=$proxy_b; fi
  echo "$side: $(awk '/AnonHugePages/ { print $2, $3 }' "/proc/$pid/smaps_rollup") of anonymous huge pages"
done
