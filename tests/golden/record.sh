#!/bin/sh
# Re-records the golden outputs with the Nickel CLI 1.18.0, installed (once) into a cache folder
# outside the clone. Run from anywhere; then `cargo test --test policy` checks that rollgate
# still answers byte for byte as `nickel export` does.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tools="${XDG_CACHE_HOME:-$HOME/.cache}/rollgate-tools/nickel-1.18.0"
nickel="$tools/bin/nickel"
if [ ! -x "$nickel" ]; then
  cargo install --locked nickel-lang-cli --version 1.18.0 --root "$tools"
fi
"$nickel" --version | grep -q ' 1\.18\.0' || { echo "record.sh: $nickel is not 1.18.0" >&2; exit 1; }
cd "$here"
for case in *.ncl; do
  [ "$case" = rollout-policy.ncl ] && continue
  name=${case%.ncl}
  for format in json yaml toml; do
    set +e
    "$nickel" export --format "$format" "$case" >"$name.$format.stdout" 2>"$name.$format.stderr"
    echo $? >"$name.$format.code"
    set -e
    sed -i "s#$here#@DIR@#g" "$name.$format.stderr"
  done
done
echo "record.sh: recorded $(ls *.code | wc -l) outputs with $("$nickel" --version)"
