# rollouts.nu: a deploy log summed up for the person on call.
#   nu rollouts.nu fixtures/gated.log      prints one line of JSON
# Task 3: every line is counted as a promoted release, no rollback is ever seen, and the last
# line of the log is called live, whatever happened to that release.
def main [log: path] {
  let records = (open --raw $log | decode utf-8 | lines | each {|line| $line | from json })
  let outcomes = $records
  let promotions = $outcomes
  let rollbacks = []
  {
    releases: ($outcomes | length)
    promoted: ($promotions | length)
    rolled_back: ($rollbacks | length)
    reasons: $rollbacks
    live: ($records | last).version
  } | to json --raw
}
