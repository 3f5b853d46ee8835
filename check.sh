#!/bin/sh
# check.sh: the lab's six checks against rollgate's own contract (contracts/), example policy,
# fixtures (fixtures/) and built-in log summary. CI runs it after the tests.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${ROLLGATE:-}" ]; then
  cargo build --quiet --manifest-path "$here/Cargo.toml"
  ROLLGATE="${CARGO_TARGET_DIR:-$here/target}/debug/rollgate"
fi
cd "$here/contracts"
ROLLGATE="$ROLLGATE" FIXTURES="$here/fixtures" QUERY= sh "$here/lab/check.sh"
