#!/bin/sh
# Policy check benchmark: one file, 200 files, and 200 files half of them failing; rollgate
# (one process) against the Nickel CLI (one `nickel export` per file, as a CI step would run it).
# Usage: sh bench/policy_bench.sh ROLLGATE NICKEL   (RUNS: one-file rounds, default 400)
set -eu
rollgate=$1 nickel=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(cd "$(dirname "$0")/.." && pwd)
cp "$here/contracts/rollout-policy.ncl" "$dir/"
i=1
while [ $i -le 200 ]; do
  sed "s/progress_deadline_ms = 1500/progress_deadline_ms = $((1000 + i))/; s/edge_svc/svc_$i/" \
    "$here/contracts/policy.ncl" >"$dir/p$i.ncl"
  i=$((i + 1))
done
# Both binaries are copied into the scratch folder first, so their pages sit in the page cache
# in the same state: a binary written minutes ago started ~5 % faster here than the same bytes
# installed a day earlier (two copies of nickel, interleaved: 0.957 against 1.000).
cp "$rollgate" "$dir/rollgate-under-test"
cp "$(command -v "$nickel")" "$dir/nickel-under-test"
rollgate=$dir/rollgate-under-test nickel=$dir/nickel-under-test
cd "$dir"
# One file: a few milliseconds apart on a shared machine, so the commands run alternately.
python3 "$here/bench/interleave.py" "${RUNS:-400}" \
  "$rollgate policy check p1.ncl" "$rollgate policy export p1.ncl" "$nickel export p1.ncl"
hyperfine --warmup 1 --runs 10 \
  -n "rollgate policy check (200 files, one call)" "$rollgate policy check p*.ncl" \
  -n "nickel export x200 (one process per file)" "for f in p*.ncl; do $nickel export \$f >/dev/null; done"
# 200 files of which every second one breaks its deadline bound: the failures are re-checked
# alone for their diagnostics.
mkdir failing
cp rollout-policy.ncl failing/
i=1
while [ $i -le 200 ]; do
  if [ $((i % 2)) = 0 ]; then deadline=900000; else deadline=$((1000 + i)); fi
  sed "s/progress_deadline_ms = 1500/progress_deadline_ms = $deadline/; s/edge_svc/svc_$i/" \
    "$here/contracts/policy.ncl" >"failing/p$i.ncl"
  i=$((i + 1))
done
cd failing
hyperfine --warmup 1 --runs 5 -i \
  -n "rollgate policy check (200 files, 100 failing, one call)" "$rollgate policy check p*.ncl" \
  -n "nickel export x200 (100 failing)" "for f in p*.ncl; do $nickel export \$f >/dev/null 2>&1; done"
# The same with syntax errors instead: these files never enter the shared program.
cd "$dir"
mkdir syntax
cp rollout-policy.ncl syntax/
for f in failing/p*.ncl; do
  if grep -q 900000 "$f"; then echo "{ a = , }" >"syntax/${f#failing/}"; else cp "$f" syntax/; fi
done
cd syntax
hyperfine --warmup 1 --runs 5 -i \
  -n "rollgate policy check (200 files, 100 syntax errors, one call)" "$rollgate policy check p*.ncl" \
  -n "nickel export x200 (100 syntax errors)" "for f in p*.ncl; do $nickel export \$f >/dev/null 2>&1; done"
