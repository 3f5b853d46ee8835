-- The lesson's summary in DuckDB SQL, for `bench/log_bench.sh` (the log's path replaces @LOG@).
-- DuckDB reads every line that parses as a JSON object, indented ones included, where rollgate
-- and the lesson keep only lines that begin with `{`; on the generated log that is a handful of
-- extra `promoted` records, so compare times, not answers.
CREATE TEMP TABLE r AS
SELECT row_number() OVER () AS n, event, version, detail
FROM read_json('@LOG@', format = 'newline_delimited', ignore_errors = true,
               columns = {ts: 'DOUBLE', event: 'VARCHAR', version: 'VARCHAR', detail: 'VARCHAR'});
SELECT
  count(*) FILTER (WHERE event IN ('promoted', 'rolled_back')) AS releases,
  count(*) FILTER (WHERE event = 'promoted') AS promoted,
  count(*) FILTER (WHERE event = 'rolled_back') AS rolled_back,
  (SELECT list({'version': version, 'reason': split_part(detail, '; ', 1)} ORDER BY n)
     FROM r WHERE event = 'rolled_back') AS reasons,
  (SELECT version FROM r WHERE event = 'promoted' ORDER BY n DESC LIMIT 1) AS live
FROM r;
