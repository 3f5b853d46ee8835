"""The GROUP BY of `log query` with polars' own NDJSON reader (Python polars from PyPI).

Usage: python3 bench/polars_group_by.py LOG

polars' reader refuses a log with any line that is not JSON (`ignore_errors` does not cover
it), so the benchmark hands it a copy with only the record lines.
"""

import sys

import polars as pl

schema = {"ts": pl.Float64, "event": pl.String, "version": pl.String, "detail": pl.String}
counts = (
    pl.scan_ndjson(sys.argv[1], schema=schema, ignore_errors=True)
    .group_by("event")
    .len(name="n")
    .sort("event")
    .collect()
)
sys.stdout.write(counts.write_csv())
