# rollouts.nu, worked answer to task 3: a deploy log summed up for the person on call.
#   nu rollouts.nu fixtures/gated.log      prints one line of JSON
#
# It answers as `rollgate log summary` does. A record is a line that begins with `{` (a line
# that does not parse is skipped); only `promoted` and `rolled_back` are outcomes, and only a
# promotion makes a release live, so a release that was rolled back is never reported live.

# A field as text: strings as they are, numbers as written (3, not 3.0); anything else is
# missing.
def as-text [value] {
  match ($value | describe) {
    'string' => $value
    'int' => ($value | into string)
    'float' => (if ($value | math round) == $value { $value | into int | into string } else { $value | into string })
    _ => null
  }
}

def main [log: path] {
  let records = (
    open --raw $log
    | decode utf-8
    | str replace --regex '^\x{FEFF}' ''
    | lines
    | each {|line| $line | str replace --regex '\r$' '' }
    | where {|line| $line starts-with '{' }
    | each {|line| try { $line | from json } catch { null } }
    | where {|record| ($record | describe) starts-with 'record' }
  )
  let outcomes = ($records | where {|record| ($record.event? | describe) == 'string' and $record.event in ['promoted' 'rolled_back'] })
  let promotions = ($outcomes | where {|record| $record.event == 'promoted' })
  let rollbacks = ($outcomes | where {|record| $record.event == 'rolled_back' })
  # What follows the first "; " of a detail is context for a person, not the reason.
  let reasons = ($rollbacks | each {|record|
    let detail = (as-text $record.detail?)
    {
      version: (as-text $record.version?)
      reason: (if $detail == null { null } else { $detail | split row '; ' | first })
    }
  })
  {
    releases: ($outcomes | length)
    promoted: ($promotions | length)
    rolled_back: ($rollbacks | length)
    reasons: $reasons
    live: (if ($promotions | is-empty) { null } else { as-text ($promotions | last).version? })
  } | to json --raw
}
