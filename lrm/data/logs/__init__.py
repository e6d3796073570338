"""Any click log in: a column mapping (lrm.config.LogsConfig) -> lrm's impressions layout,
with sessions, days and histories from the data itself (lrm.data.logs.ingest)."""
