"""Data: schema, synthetic sessions, Criteo ingest, RecD dedup, KJT loader."""
