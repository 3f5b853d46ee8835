#!/bin/sh
# check.sh: the lab's six checks. Run it from the folder holding your three files:
#   cd lab/starter && sh ../check.sh
# It needs rollgate (the ROLLGATE variable, else `rollgate` on PATH) and a POSIX shell; Nushell
# only for the lesson's own query file, no network. On stdout exactly the lesson's twelve lines
# (what each check saw, and one RESULT line per check); on stderr a line naming the query it
# runs. Exit 1 if any check fails.
#   FIXTURES  folder with gated.log and ungated.log (default: fixtures)
#   QUERY     the summary query: rollouts.nu (run by Nushell), rollouts.ncl (run by rollgate),
#             or empty for rollgate's built-in summary. Default: rollouts.nu when Nushell is
#             installed and the file is here, else rollouts.ncl.
#   NU        the Nushell binary (default: nu)

ROLLGATE=${ROLLGATE:-rollgate}
FIXTURES=${FIXTURES:-fixtures}
NU=${NU:-nu}
NO_COLOR=1
export NO_COLOR

if ! command -v "$ROLLGATE" >/dev/null 2>&1; then
  echo "check.sh: rollgate not found; put it on PATH or set ROLLGATE=/path/to/rollgate" >&2
  exit 2
fi
have_nu() { command -v "$NU" >/dev/null 2>&1; }
if [ -z "${QUERY+set}" ]; then
  if [ -f rollouts.nu ] && have_nu; then QUERY=rollouts.nu; else QUERY=rollouts.ncl; fi
fi
case "$QUERY" in
  *.nu)
    if ! have_nu; then
      echo "check.sh: QUERY=$QUERY needs Nushell, and \`$NU\` is not on PATH; install it (npm install @nushell/linux-x64), set NU=/path/to/nu, or use QUERY=rollouts.ncl" >&2
      exit 2
    fi
    echo "query: $QUERY, run by Nushell $("$NU" --version)" >&2 ;;
  "") echo "query: rollgate's built-in summary" >&2 ;;
  *) echo "query: $QUERY, run by rollgate log summary --query" >&2 ;;
esac

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
failed=0

result() {
  echo "RESULT $1 $2"
  [ "$2" = PASS ] || failed=1
}

# 1. policy.ncl exports, with a deadline of at most 600000 ms and at most 25 % unavailable.
if "$ROLLGATE" policy export policy.ncl >"$tmp/export.json" 2>"$tmp/export.err"; then
  # The first (only) service entry, compact: `{"edge_svc":{...}}` -> `{...}`.
  json=$(tr -d ' \n' <"$tmp/export.json" | sed 's/^{"[^"]*"://; s/}$//')
  echo "exported: $json"
  deadline=$(printf '%s' "$json" | sed -n 's/.*"progress_deadline_ms":\([0-9][0-9]*\).*/\1/p')
  unavailable=$(printf '%s' "$json" | sed -n 's/.*"max_unavailable_pct":\([0-9][0-9]*\).*/\1/p')
  if [ -n "$deadline" ] && [ "$deadline" -le 600000 ] && [ -n "$unavailable" ] && [ "$unavailable" -le 25 ]; then
    result policy_exports_bounded PASS
  else
    result policy_exports_bounded FAIL
  fi
else
  echo "export failed: $(head -n 1 "$tmp/export.err")"
  result policy_exports_bounded FAIL
fi

# 2-4. The contract refuses a bad policy, and says so about the right field.
#   refuses NAME FIELD RECORD
# The record is merged with valid values for the fields it does not test.
refuses() {
  cat >"$tmp/case.ncl" <<NICKEL
let { RolloutPolicy, .. } = import "rollout-policy.ncl" in
({ poll_ms = 100, max_surge_pct = 100, on_stall = 'rollback } & $3) | RolloutPolicy
NICKEL
  if "$ROLLGATE" policy export --import-path "$PWD" "$tmp/case.ncl" >/dev/null 2>"$tmp/case.err"; then
    echo "contract accepted $3"
    result "$1" FAIL
    return
  fi
  # The contract's own words (second line) when it has them, else Nickel's title.
  message=$(sed -n '2p' "$tmp/case.err" | sed 's/^ *//')
  case "$message" in
    "" | ┌* | "│"*) message=$(head -n 1 "$tmp/case.err") ;;
  esac
  echo "contract refused $3: $message"
  case "$message" in
    *"$2"*) result "$1" PASS ;;
    *) result "$1" FAIL ;;
  esac
}
refuses contract_rejects_missing_deadline progress_deadline_ms '{ max_unavailable_pct = 0, }'
refuses contract_rejects_long_deadline progress_deadline_ms '{ progress_deadline_ms = 900000, max_unavailable_pct = 0, }'
refuses contract_rejects_wide_unavailable max_unavailable_pct '{ progress_deadline_ms = 1500, max_unavailable_pct = 50, }'

# 5-6. The summary of each log, exactly.
summary() {
  case "$QUERY" in
    *.nu) "$NU" "$QUERY" "$1" 2>"$tmp/query.err" ;;
    "") "$ROLLGATE" log summary "$1" 2>"$tmp/query.err" ;;
    *) "$ROLLGATE" log summary --query "$QUERY" "$1" 2>"$tmp/query.err" ;;
  esac || echo "query failed: $(head -n 1 "$tmp/query.err")"
}
gated=$(summary "$FIXTURES/gated.log")
ungated=$(summary "$FIXTURES/ungated.log")
echo "gated.log   -> $gated"
echo "ungated.log -> $ungated"
if [ "$gated" = '{"releases":3,"promoted":1,"rolled_back":2,"reasons":[{"version":"v3","reason":"not ready after 1500 ms"},{"version":"v4","reason":"candidate exited with exit status: 78 before ready"}],"live":"v2"}' ]; then
  result query_gated_log PASS
else
  result query_gated_log FAIL
fi
if [ "$ungated" = '{"releases":3,"promoted":3,"rolled_back":0,"reasons":[],"live":"v4"}' ]; then
  result query_ungated_log PASS
else
  result query_ungated_log FAIL
fi

exit "$failed"
