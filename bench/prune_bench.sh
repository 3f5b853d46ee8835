#!/bin/sh
# Issue 81: how long a deploy that prunes takes past its promotion. A root with three releases
# of ~6 500 files (TREE, with rollgate's sample service as the executable); v1 then v2 deployed,
# then v3 with keep_releases = 1, which prunes v1 (v2 stays: the last good one). Time from the `promoted` line
# to the command's exit, for ROLLGATE and OLD, ROUNDS times each, interleaved.
# Usage: sh bench/prune_bench.sh ROLLGATE OLD TREE [ROUNDS]
set -eu
new=$1
old=$2
tree=$3
rounds=${4:-3}
work=$(mktemp -d)
# Releases run as their service user: the folders above them must let it through.
chmod 755 "$work"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
trap 'set +e; for r in "$work"/r*; do stop_releases "$r" 2>/dev/null; done; rm -rf "$work"' EXIT
printf 'edge_svc:\n  progress_deadline_ms: 20000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  keep_releases: 1\n' >"$work/policy.yaml"
for round in $(seq "$rounds"); do
  for which in new old; do
    bin=$new
    [ "$which" = old ] && bin=$old
    root="$work/r-$which-$round"
    mkdir -p "$root"
    for v in v1 v2 v3; do
      cp -a "$tree" "$work/src-$v"
      rm -f "$work/src-$v/Procfile"
      cp "$bin" "$work/src-$v/rollgate"
      printf '#!/bin/sh\nexec "$(dirname "$0")/rollgate" sample-service\n' >"$work/src-$v/edge-svc"
      chmod +x "$work/src-$v/edge-svc"
      "$bin" release add edge-svc $v "$work/src-$v" --root "$root" >/dev/null 2>&1
      rm -rf "$work/src-$v"
    done
    printf 'edge_svc:\n  progress_deadline_ms: 20000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  keep_releases: 0\n' >"$work/keep_all.yaml"
    "$bin" deploy edge-svc "$(free_port)" v1 --root "$root" --policy "$work/keep_all.yaml" >/dev/null 2>&1
    "$bin" deploy edge-svc "$(free_port)" v2 --root "$root" --policy "$work/keep_all.yaml" >/dev/null 2>&1
    sync
    "$bin" deploy edge-svc "$(free_port)" v3 --root "$root" --policy "$work/policy.yaml" >/dev/null 2>&1
    ended=$(date +%s.%N)
    promoted=$(grep '"event":"promoted"' "$root/deploy.log" | tail -1 | sed 's/.*"ts":\([0-9.]*\).*/\1/')
    gone=no
    [ -d "$root/releases/v1" ] || gone=yes
    echo "$which $(echo "$ended - $promoted" | bc) s (v1 pruned: $gone)"
    stop_releases "$root"
  done
done
