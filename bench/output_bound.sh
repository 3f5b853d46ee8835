#!/bin/sh
# A release's output, bounded (issue 37.5): a release writing about MBPS MB/s for SECONDS s
# under `rollgate deploy` (its output pumped into <svc>.output, rotated by the defaults: 5
# files of 20 MiB) and, side by side in the same run, the same writer sent to a plain file
# (what `nohup` or a shell redirect gives, and what rollgate did before). Prints the most disk
# the rotated output ever held, the plain file's size, and the pump's CPU per MB.
# Usage: sh bench/output_bound.sh ROLLGATE [SECONDS] [MBPS]
set -eu
rollgate=$1
seconds=${2:-60}
mbps=${3:-20}
root=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
plain_pid=
trap 'set +e; stop_releases "$root"; [ -n "$plain_pid" ] && kill -- "-$plain_pid" 2>/dev/null; rm -rf "$root"' EXIT

# Lines of 64 bytes, MBPS MB a second in ten bursts; stops when its parent does.
lines=$((mbps * 1000000 / 64 / 10))
writer="while kill -0 \$\$ 2>/dev/null; do yes 'a line of a busy release, written to stdout as fast as it can go..' | head -n $lines; sleep 0.1; done"
mkdir -p "$root/releases/v1"
printf '#!/bin/sh\n( %s ) &\nexec %s sample-service\n' "$writer" "$rollgate" >"$root/releases/v1/svc"
chmod +x "$root/releases/v1/svc"
printf '#!/bin/sh\n( %s ) &\nexec sleep %s\n' "$writer" "$((seconds + 5))" >"$root/plain.sh"

"$rollgate" deploy svc "$(free_port)" v1 --root "$root" 2>/dev/null
setsid sh "$root/plain.sh" >"$root/plain.log" 2>&1 &
plain_pid=$!
pump=$(pgrep -f "output-pump.*$root/releases/v1/svc.output" | head -1)
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
cpu_before=$(cpu "$pump")
most=0
i=0
while [ $i -lt "$seconds" ]; do
  sleep 1
  now=$(cat "$root"/releases/v1/svc.output* | wc -c)
  [ "$now" -gt "$most" ] && most=$now
  i=$((i + 1))
done
cpu_after=$(cpu "$pump")
plain=$(wc -c <"$root/plain.log")
ticks=$(getconf CLK_TCK)
files=$(ls "$root"/releases/v1/ | grep -c 'svc.output')
echo "writer: ~$mbps MB/s for $seconds s"
echo "plain file (shell redirect): $plain bytes after $seconds s"
echo "rollgate (5 x 20 MiB): at most $most bytes on disk in $files files (bound 104857600)"
awk -v c="$((cpu_after - cpu_before))" -v t="$ticks" -v b="$plain" \
  'BEGIN { printf "pump CPU: %.2f s for ~%.0f MB (%.1f ms per MB)\n", c / t, b / 1e6, 1000 * c / t / (b / 1e6) }'
