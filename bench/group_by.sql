-- `rollgate log query --sql "SELECT event, count(*) AS n FROM log GROUP BY event"` in DuckDB.
SELECT event, count(*) AS n
FROM read_json('@LOG@', format = 'newline_delimited', ignore_errors = true,
               columns = {ts: 'DOUBLE', event: 'VARCHAR', version: 'VARCHAR', detail: 'VARCHAR'})
GROUP BY event ORDER BY event;
