#!/bin/sh
# Proxy benchmark: throughput and latency straight to a release and through `rollgate proxy`,
# side by side in one run, then failed requests under load across 100 deploys.
# nginx (bench/nginx.conf) runs beside them as the reverse proxy a user would otherwise use.
# Usage: sh bench/proxy_bench.sh ROLLGATE   (needs wrk, oha and nginx on PATH)
set -eu
rollgate=$1
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
trap 'stop_releases "$root"; kill $proxy 2>/dev/null; nginx -c "$root/nginx.conf" -s stop 2>/dev/null; rm -rf "$root"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
release() { mkdir -p "$root/releases/$1"; printf '#!/bin/sh\nexec %s sample-service\n' "$rollgate" >"$root/releases/$1/svc"; chmod +x "$root/releases/$1/svc"; }
release a; release b
"$rollgate" deploy svc "$(free_port)" a --root "$root" 2>/dev/null
direct=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$root/current")
pport=$(free_port)
"$rollgate" proxy --listen 127.0.0.1:$pport --root "$root" 2>/dev/null &
proxy=$!
nport=$(free_port)
sed "s/UPSTREAM/$direct/; s/NGINX_PORT/$nport/" "$here/nginx.conf" >"$root/nginx.conf"
nginx -c "$root/nginx.conf"
sleep 0.5

echo "== saturation: wrk -t1 -c32 -d10s (keep-alive)"
for target in "direct 127.0.0.1:$direct" "nginx 127.0.0.1:$nport" "rollgate 127.0.0.1:$pport"; do
  set -- $target
  wrk -t1 -c32 -d10s --latency "http://$2/" >"$root/wrk.$1"
  printf '%s: ' "$1"; grep -E 'Requests/sec|50%|99%' "$root/wrk.$1" | tr -s ' ' | tr '\n' ' '; echo
done

# Half of rollgate's own saturation throughput.
rate=${RATE:-$(awk '/Requests\/sec/ { printf "%d", $2 / 2 }' "$root/wrk.rollgate")}
echo "== latency at half of rollgate's saturation: oha -q $rate -c8 -z10s"
for target in "direct 127.0.0.1:$direct" "nginx 127.0.0.1:$nport" "rollgate 127.0.0.1:$pport"; do
  set -- $target
  printf '%s: ' "$1"; oha --no-tui -q "$rate" -c 8 -z 10s "http://$2/" | grep -E 'Requests/sec|50.00%|99.00%|Success rate' | tr -s ' ' | tr '\n' ' '; echo
done

echo "== 100 deploys under load through the proxy"
wrk -t1 -c16 -d600s "http://127.0.0.1:$pport/" >"$root/wrk.out" 2>&1 &
load=$!
i=0; version=b
while [ $i -lt 100 ]; do
  "$rollgate" deploy svc "$(free_port)" $version --root "$root" --grace-ms 1000 2>/dev/null || echo "deploy $i failed"
  if [ $version = b ]; then version=a; else version=b; fi
  i=$((i + 1))
done
kill -INT $load; wait $load 2>/dev/null || true
grep -E 'requests in|Non-2xx|Socket errors|Requests/sec' "$root/wrk.out" || true
echo "promoted: $(grep -c '"promoted"' "$root/deploy.log"), drained by the proxy: $(grep -c 'proxy drained' "$root/deploy.log")"
