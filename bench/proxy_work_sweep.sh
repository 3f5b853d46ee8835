#!/bin/sh
# Proxy throughput against how much work the release does per request: straight to the
# release, through nginx and through `rollgate proxy`, side by side for each amount of work.
#
# The release is `rollgate sample-service --threads 2 --work-us W`: two serving threads (one
# per core here, so the proxy's CPU comes out of the release's) spending W microseconds of CPU
# on every request, as a handler that parses, queries and renders would. W=0 is the no-op
# release of proxy_bench.sh's first table, now on two threads.
#
# Usage: sh bench/proxy_work_sweep.sh ROLLGATE [W ...]   (needs wrk and nginx on PATH)
# PROXY_ARGS adds flags to `rollgate proxy` (e.g. "--threads 1"); SECONDS_PER_RUN (default 10).
set -eu
rollgate=$1
shift
[ $# -gt 0 ] || set -- 0 25 50 100 200 500
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
trap 'set +e; stop_releases "$root"; kill $proxy 2>/dev/null; nginx -c "$root/nginx.conf" -s stop 2>/dev/null; rm -rf "$root"' EXIT
rate() { wrk -t1 -c32 -d"${SECONDS_PER_RUN:-10}"s "http://127.0.0.1:$1/" | awk '/Requests\/sec/ { printf "%d", $2 }'; }

pport=$(free_port)
nport=$(free_port)
proxy=
echo "work_us  direct_rps  nginx_rps (of direct)  rollgate_rps (of direct)"
for work in "$@"; do
  mkdir -p "$root/releases/w$work"
  printf '#!/bin/sh\nexec %s sample-service --threads 2 --work-us %s\n' "$rollgate" "$work" \
    >"$root/releases/w$work/svc"
  chmod +x "$root/releases/w$work/svc"
  # The deployer switches `current`; the proxy follows it, and nginx is pointed at it by hand.
  "$rollgate" deploy svc "$(free_port)" "w$work" --root "$root" --grace-ms 1000 >/dev/null 2>&1
  direct=$(live_port "$root")
  sed "s/UPSTREAM/$direct/; s/NGINX_PORT/$nport/" "$here/nginx.conf" >"$root/nginx.conf"
  if [ -z "$proxy" ]; then
    "$rollgate" proxy --listen "127.0.0.1:$pport" --root "$root" ${PROXY_ARGS:-} 2>/dev/null &
    proxy=$!
    nginx -c "$root/nginx.conf"
  else
    nginx -c "$root/nginx.conf" -s reload
  fi
  sleep 1
  d=$(rate "$direct")
  n=$(rate "$nport")
  r=$(rate "$pport")
  printf '%7s  %10s  %9s (%3s %%)  %12s (%3s %%)\n' "$work" "$d" "$n" $((100 * n / d)) "$r" $((100 * r / d))
done
