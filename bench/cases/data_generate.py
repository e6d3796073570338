"""data.generate: rows/s of the synthetic session generator (lrm.data.synthetic).

Two cases per size (default: 5 days x 20k sessions x ~8 impressions; 10x: 10x sessions/day):

* in memory, vs a naive per-session loop: `generate_day` (every day, tables built) against a
  loop over sessions that runs the same world and click-model code on one session at a time
  and builds rows as Python dicts (`Table.from_pylist`), timed on a small subset. Ratio > 1:
  how much the day-at-once vectorization wins.
* to Parquet, vs pyarrow's bare write (ceiling): what `generate` does per day (generate the
  day, then `lrm.io.write_parquet`: zstd, temp file, footer check, rename) against
  `pq.write_table` of the very same table alone. The baseline is an upper bound, so the
  ratio is < 1: the share of the bare write speed the whole generator reaches.

The in-memory line also carries `candidate_per_cpu_s` (rows per CPU second of this
process), which other load on a shared machine disturbs less than wall time.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.cases.data_profiles import tiny
from bench.common import emit, smoke
from lrm.config import GenerateConfig
from lrm.data import synthetic
from lrm.data.schema import DAY, LABEL, POSITION, SESSION, part_path
from lrm.data.synthetic.hashing import bucket, hash_ids
from lrm.data.synthetic.world import HASH_ROWS, World
from lrm.io import dir_bytes, write_parquet

NAIVE_SESSIONS = 1_000


def _naive(cfg: GenerateConfig, sessions: int, day: int = 0) -> pa.Table:
    """The same structure, one session at a time, rows as dicts (the baseline)."""
    w = World(cfg)
    rng = np.random.default_rng([cfg.seed, day])
    sch = w.schema
    # each vertical's intercept ~ the calibrated one (the generator bisects on the day)
    intercept = np.log(np.array(w.vertical_ctr) / (1 - np.array(w.vertical_ctr))) - 0.5
    rows = []
    for s in range(sessions):
        rank = w.users.sample(rng, 1, day)
        uid = w.users.ids(rank, day)
        user = w.user_attributes(uid)
        user["session_hour"] = (user["hour_pref"] + round(rng.normal(0, 2.5))) % 24
        user["vertical"] = rng.choice(len(w.share), 1, p=w.share)  # the session's surface
        n = 1 + int(rng.poisson(cfg.mean_session_length - 1))
        hour = user["session_hour"] + 0.5
        base, rate = w.stream(uid, rank)  # the user's history stream, read at this hour
        pos = base + np.floor(rate * (day + hour / 24)).astype(np.int64)
        hist, hist_cat, hist_adv = w.history(day, uid, user["user_age"], user["user_geo"],
                                             base, rate, pos, user["hist_len"])
        arank = w.ads.sample(rng, n, day)
        aid = w.ads.ids(arank, day)
        ad = w.ad_attributes(aid)
        log_bid = (w.adv_bid[bucket(hash_ids(ad["advertiser_id"], w.salt["bid"]), HASH_ROWS)]
                   + 0.4 * ad["quality"] + rng.normal(0, 0.3, n))
        order = np.argsort(-(log_bid + 0.5 * ad["quality"] + rng.normal(0, 0.5, n)))
        f = {"user_id": np.repeat(uid, n), **{c: np.repeat(user[c], n) for c in sch.user_sparse
                                               if c != "user_id"},
             POSITION: np.arange(n), "ad_id": aid[order],
             **{c: ad[c][order] for c in ("advertiser_id", "ad_category", "ad_format")},
             "d_position": np.log1p(np.arange(n)),
             "d_user_activity": np.repeat((np.log(cfg.users * w.users.law.mass(rank)) - 3.9) / 3.5,
                                          n),
             "d_ad_age": (np.log1p(w.ads.age_days(arank[order], day)) - 2) / 0.8,
             "d_bid": log_bid[order] / 0.8}
        f.update(w.history_features(np.array([0, len(hist)]), hist_cat, hist_adv,
                                    np.zeros(n, np.int64), f["ad_category"],
                                    f["advertiser_id"]))
        p = 1 / (1 + np.exp(-(w.raw_logit(day, f) + intercept[f["vertical"]])))
        history = hist.tolist()
        for i in range(n):
            row = {DAY: day, SESSION: day * cfg.sessions_per_day + s,
                   "user_history": history, LABEL: int(rng.random() < p[i])}
            row.update({c: f[c][i].item() for c in (*sch.user_sparse, POSITION,
                                                    *sch.item_sparse, *sch.dense)})
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=sch.arrow("impressions"))


def _case(cfg: GenerateConfig, label: str, naive_sessions: int = NAIVE_SESSIONS) -> None:
    """Per day: generate_day, then the atomic write generate() does, then a bare write."""
    gen_s = gen_cpu = atomic_s = bare_s = 0.0
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        for day in range(cfg.days):
            t0, c0 = time.perf_counter(), time.process_time()
            table = synthetic.generate_day(cfg, day)
            t1, c1 = time.perf_counter(), time.process_time()
            write_parquet(table, part_path(Path(tmp) / "raw", day))
            t2 = time.perf_counter()
            pq.write_table(table, Path(tmp) / f"bare-{day}.parquet", compression="zstd")
            t3 = time.perf_counter()
            gen_s, gen_cpu = gen_s + t1 - t0, gen_cpu + c1 - c0
            atomic_s, bare_s = atomic_s + t2 - t1, bare_s + t3 - t2
            rows += table.num_rows
            del table
        size = dir_bytes(Path(tmp) / "raw")
    t0 = time.perf_counter()
    naive = _naive(cfg, naive_sessions).num_rows / (time.perf_counter() - t0)
    emit("data.generate", f"{label}: generate_day in memory vs naive per-session loop "
         f"({naive_sessions} sessions)", "rows/s", candidate=round(rows / gen_s),
         baseline=round(naive), better="higher", rows=rows,
         candidate_per_cpu_s=round(rows / gen_cpu))
    emit("data.generate", f"{label}: generate + atomic Parquet write vs pyarrow bare write of "
         "the same tables (ceiling)", "rows/s", candidate=round(rows / (gen_s + atomic_s)),
         baseline=round(rows / bare_s), better="higher", rows=rows,
         bytes_per_row=round(size / rows, 1))


def run(quick: bool) -> None:
    if smoke():
        _case(tiny(), "smoke", naive_sessions=50)
        return
    base = GenerateConfig()
    _case(base, "default")
    if not quick:
        _case(dataclasses.replace(base, sessions_per_day=10 * base.sessions_per_day), "10x")
