# The lesson's summary in jq, for comparison with `rollgate log summary`.
# Usage: jq -R -n -c -f summary.jq LOG
[inputs | select(startswith("{")) | fromjson? ] as $events
| [$events[] | select(.event == "promoted" or .event == "rolled_back")] as $outcomes
| [$outcomes[] | select(.event == "promoted")] as $promoted
| [$outcomes[] | select(.event == "rolled_back")] as $rolled
| {releases: ($outcomes | length), promoted: ($promoted | length), rolled_back: ($rolled | length),
   reasons: [$rolled[] | {version, reason: (.detail | split("; ") | .[0])}],
   live: (if ($promoted | length) == 0 then null else ($promoted | last | .version) end)}
