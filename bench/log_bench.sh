#!/bin/sh
# Log analysis benchmark: a generated log of ATTEMPTS attempts (two records each, plus noise);
# rollgate's summary, history, stats and a SQL GROUP BY, and the same summary by jq, by the lab's
# Nushell query and by DuckDB's SQL where they are installed. Wall time and peak RSS from
# /usr/bin/time; answers compared where they can be the same.
# Usage: sh bench/log_bench.sh ROLLGATE [ATTEMPTS]
#   NU=/path/to/nu, DUCKDB=/path/to/duckdb (the PyPI package duckdb-cli) to name them;
#   POLARS_PYTHON=/path/to/python3 (with the PyPI package polars) adds polars' own reader
set -eu
rollgate=$1 attempts=${2:-1000000}
here=$(cd "$(dirname "$0")" && pwd)
log=$(mktemp --suffix=.log)
out=$(mktemp -d)
trap 'rm -rf "$log" "$out"' EXIT
python3 "$here/gen_log.py" "$attempts" "$log"
bytes=$(stat -c %s "$log")
echo "log: $(wc -l <"$log") lines, $bytes bytes"
run() { # name, command...
  name=$1; shift
  /usr/bin/time -f "%e %M" -o "$out/time" "$@" >"$out/$name.out" 2>"$out/$name.err"
  read -r secs kb <"$out/time"
  printf '%-22s %7.2f s %8.0f MB/s %7.0f MB peak\n' "$name" "$secs" \
    "$(echo "$bytes / 1000000 / $secs" | bc -l)" "$(echo "$kb / 1024" | bc -l)"
}
run "rollgate summary" "$rollgate" log summary "$log"
# The same binary with serde_json alone (no fast path), for the side-by-side figure.
run "rollgate summary serde" env ROLLGATE_LOG_PARSER=serde "$rollgate" log summary "$log"
cmp -s "$out/rollgate summary.out" "$out/rollgate summary serde.out" && echo "  the fast path's answer is identical" || echo "  the fast path's answer DIFFERS"
run "rollgate history" "$rollgate" log history --format csv "$log"
run "rollgate stats" "$rollgate" log stats --format json "$log"
run "rollgate group-by" "$rollgate" log query --format csv \
  --sql "SELECT event, count(*) AS n FROM log GROUP BY event ORDER BY event" "$log"
if command -v jq >/dev/null; then
  run "jq summary" jq -R -n -c -f "$here/summary.jq" "$log"
  cmp -s "$out/rollgate summary.out" "$out/jq summary.out" && echo "  jq's answer is identical" || echo "  jq's answer DIFFERS"
fi
nu=${NU:-nu}
if command -v "$nu" >/dev/null; then
  run "nushell summary" "$nu" "$here/../lab/solution/rollouts.nu" "$log"
  cmp -s "$out/rollgate summary.out" "$out/nushell summary.out" && echo "  Nushell's answer is identical" || echo "  Nushell's answer DIFFERS"
fi
# polars' own reader (POLARS_PYTHON: a python3 with the polars package) refuses noise lines,
# so it reads a copy holding only the record lines; rollgate reads that copy too, side by side.
if [ -n "${POLARS_PYTHON:-}" ]; then
  grep '^{' "$log" >"$out/records.log"
  run "polars gb (records)" "$POLARS_PYTHON" "$here/polars_group_by.py" "$out/records.log"
  run "rollgate gb (records)" "$rollgate" log query --format csv \
    --sql "SELECT event, count(*) AS n FROM log GROUP BY event ORDER BY event" "$out/records.log"
  cmp -s "$out/polars gb (records).out" "$out/rollgate gb (records).out" && echo "  polars' answer is identical" || echo "  polars' answer DIFFERS"
  rm -f "$out/records.log"
fi
duckdb=${DUCKDB:-duckdb}
if command -v "$duckdb" >/dev/null; then
  for q in summary summary_lean history stats group_by; do
    sed "s#@LOG@#$log#" "$here/$q.sql" >"$out/$q.sql"
    run "duckdb $q" "$duckdb" -json -f "$out/$q.sql"
  done
fi
