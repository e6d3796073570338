"""Data: the schema, where days come from, RecD's sessions, and the batches models read.

    schema.py      the schema once for every producer and consumer: features, the two
                   layouts (impressions, sessions), day folders (day_files, pick_day,
                   pick_days)
    dataset.py     a dataset folder looked at once: schema, layout, day files
    parquet.py     every Parquet read goes through here (damage named by file and row
                   group); lrm's writer settings
    synthetic/     the synthetic world: session-level ads logs with a hidden click model,
                   days of drift, arrivals, churn
    values.py      the values a column may hold (labels 0/1, ids in range, finite dense),
                   checked by every reader as it reads
    criteo.py      Criteo TSV -> the impressions layout
    logs/          any click log (Parquet, CSV/TSV, JSON lines) -> the impressions layout,
                   through a column mapping: sessions, days and histories from the data
    sessions.py    the sessions layout table by table: user-side features once per
                   session, histories shared over a user's sessions, and back
    dedup.py       RecD dedup of a dataset: impressions -> sessions, day by day
    histories.py   a user's sliding history stored once per run of her sessions
    items.py       an item's attributes stored once per item in a sessions file
    collisions.py  how many ids share a hashed embedding row, per day
    batch.py       the training batch: per-impression items, per-session users (KJTs with
                   inverse indices)
    chunks.py      normalized chunks of a file and the batches cut from them
    loader.py      Parquet (either layout) -> batches, in a fixed order, prefetched
"""
