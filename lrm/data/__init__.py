"""Data: schema, Parquet reading, synthetic sessions, Criteo ingest, RecD dedup, KJT loader."""
