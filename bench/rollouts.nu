# rollouts.nu: the lesson's summary query, for comparison with `rollgate log summary`.
# Usage: nu rollouts.nu <log>   prints one JSON object.
def main [log: path] {
  let events = (open --raw $log | lines | where {|l| $l starts-with '{' } | each {|l| $l | from json })
  let outcomes = ($events | where event in ['promoted' 'rolled_back'])
  let promoted = ($outcomes | where event == 'promoted')
  let rolled = ($outcomes | where event == 'rolled_back')
  {
    releases: ($outcomes | length)
    promoted: ($promoted | length)
    rolled_back: ($rolled | length)
    reasons: ($rolled | each {|e| { version: $e.version, reason: ($e.detail | split row '; ' | first) } })
    live: (if ($promoted | is-empty) { null } else { $promoted | last | get version })
  } | to json --raw
}
