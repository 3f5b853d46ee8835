-- `rollgate log stats` in DuckDB SQL: the candidate rejection rate, time to promotion and to
-- rollback (median, p90, max), promotions per day, rollbacks by reason.
CREATE TEMP TABLE r AS
SELECT row_number() OVER () AS n, ts, event, version, detail
FROM read_json('@LOG@', format = 'newline_delimited', ignore_errors = true,
               columns = {ts: 'DOUBLE', event: 'VARCHAR', version: 'VARCHAR', detail: 'VARCHAR'});
CREATE TEMP TABLE a AS
WITH s AS (SELECT n, ts, version FROM r WHERE event = 'candidate_started'),
     o AS (SELECT n, ts, version, event, detail FROM r WHERE event IN ('promoted', 'rolled_back'))
SELECT o.event AS outcome, o.ts - s.ts AS t, split_part(o.detail, '; ', 1) AS reason
FROM s ASOF JOIN o ON s.version = o.version AND o.n > s.n;
SELECT
  count(*) FILTER (WHERE outcome = 'rolled_back') / count(*) AS candidate_rejection_rate,
  median(t) FILTER (WHERE outcome = 'promoted') AS ready_median_s,
  quantile_cont(t, 0.9) FILTER (WHERE outcome = 'promoted') AS ready_p90_s,
  max(t) FILTER (WHERE outcome = 'promoted') AS ready_max_s,
  median(t) FILTER (WHERE outcome = 'rolled_back') AS rollback_median_s,
  quantile_cont(t, 0.9) FILTER (WHERE outcome = 'rolled_back') AS rollback_p90_s,
  max(t) FILTER (WHERE outcome = 'rolled_back') AS rollback_max_s,
  count(*) FILTER (WHERE outcome = 'promoted')
    / ((SELECT max(ts) - min(ts) FROM r) / 86400) AS promotions_per_day,
  (SELECT list({'reason': reason, 'n': n} ORDER BY n DESC)
     FROM (SELECT reason, count(*) AS n FROM a WHERE outcome = 'rolled_back' GROUP BY reason))
    AS rollbacks_by_reason
FROM a;
