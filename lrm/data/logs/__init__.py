"""Any click log in: a column mapping (lrm.config.LogsConfig) -> lrm's impressions layout,
with sessions, days and histories from the data itself (lrm.data.logs.ingest)."""

# a log file's name ends with one of these (each also + ".gz"), and its format by it
FORMAT_OF = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv",
             ".txt": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
LOG_SUFFIXES = tuple(FORMAT_OF) + tuple(s + ".gz" for s in FORMAT_OF)
