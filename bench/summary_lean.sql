-- The lesson's summary in the leanest DuckDB SQL found: one scan, no window. `list` and `last`
-- follow the order rows arrive in, which DuckDB keeps for a single file (its default
-- `preserve_insertion_order`); compare times, not answers (see summary.sql).
SELECT
  count(*) FILTER (WHERE event IN ('promoted', 'rolled_back')) AS releases,
  count(*) FILTER (WHERE event = 'promoted') AS promoted,
  count(*) FILTER (WHERE event = 'rolled_back') AS rolled_back,
  list({'version': version, 'reason': split_part(detail, '; ', 1)})
    FILTER (WHERE event = 'rolled_back') AS reasons,
  last(version) FILTER (WHERE event = 'promoted') AS live
FROM read_json('@LOG@', format = 'newline_delimited', ignore_errors = true,
               columns = {ts: 'DOUBLE', event: 'VARCHAR', version: 'VARCHAR', detail: 'VARCHAR'});
