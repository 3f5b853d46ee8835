-- `rollgate log history` in DuckDB SQL: each start paired with the next outcome of its version,
-- time to outcome, the rollback's reason, and how long a promotion stayed live.
CREATE TEMP TABLE r AS
SELECT row_number() OVER () AS n, ts, event, version, detail
FROM read_json('@LOG@', format = 'newline_delimited', ignore_errors = true,
               columns = {ts: 'DOUBLE', event: 'VARCHAR', version: 'VARCHAR', detail: 'VARCHAR'});
CREATE TEMP TABLE attempts AS
WITH s AS (SELECT n, ts, version FROM r WHERE event = 'candidate_started'),
     o AS (SELECT n, ts, version, event, detail FROM r WHERE event IN ('promoted', 'rolled_back'))
SELECT s.n, s.version, s.ts AS started, o.ts AS finished, coalesce(o.event, 'unfinished') AS outcome,
       o.ts - s.ts AS time_to_outcome_s,
       CASE WHEN o.event = 'rolled_back' THEN split_part(o.detail, '; ', 1) END AS reason
FROM s ASOF LEFT JOIN o ON s.version = o.version AND o.n > s.n;
COPY (
  SELECT version, started, finished, outcome, time_to_outcome_s, reason,
         CASE WHEN outcome = 'promoted'
              THEN lead(finished) OVER (PARTITION BY outcome = 'promoted' ORDER BY n) - finished END
           AS live_for_s
  FROM attempts ORDER BY n
) TO '/dev/stdout' (FORMAT csv);
