"""The synthetic world written out: days as impressions tables (`generate_day`), or days
0..N-1 as Parquet part files with the run's metrics (`generate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lrm import io
from lrm.config import GenerateConfig
from lrm.data.schema import DAY, LABEL, POSITION, SESSION, part_path
from lrm.data.synthetic.days import Day, chunks
from lrm.data.synthetic.world import World
from lrm.progress import Reporter

_MAX_LIST_VALUES = 2**31 - 1  # list<int64> offsets are int32


def _table(w: World, d: Day, s0: int, s1: int) -> pa.Table:
    """Impression rows of sessions [s0, s1) as a table of the exact impressions schema."""
    sch = w.schema.arrow("impressions")
    i0, i1 = int(d.imp_off[s0]), int(d.imp_off[s1])
    seg = d.sess_index[i0:i1]
    h0, h1 = int(d.hist_off[s0]), int(d.hist_off[s1])
    per_session = pa.ListArray.from_arrays(
        pa.array((d.hist_off[s0:s1 + 1] - h0).astype(np.int32)), pa.array(d.hist[h0:h1]))
    cols: dict[str, Any] = {
        DAY: np.full(i1 - i0, d.day, np.int32),
        SESSION: d.day * w.cfg.sessions_per_day + d.first + seg,
        **{c: d.sessions[c][seg] for c in w.schema.user_sparse},
        "user_history": per_session.take(pa.array(seg - s0)),
        **{c: d.imps[c][i0:i1] for c in (POSITION, LABEL, *w.schema.item_sparse,
                                         *w.schema.dense)},
    }
    arrays = [c if isinstance(c := cols[f.name], pa.Array) else pa.array(c, type=f.type)
              for f in sch]
    return pa.Table.from_arrays(arrays, schema=sch)


def _parts(imp_off: np.ndarray, rows_per_file: int) -> list[tuple[int, int]]:
    """Session ranges [s0, s1) of at most rows_per_file rows (one session may exceed it)."""
    out, s0, S = [], 0, len(imp_off) - 1
    while s0 < S:
        s1 = int(np.searchsorted(imp_off, imp_off[s0] + rows_per_file, side="right")) - 1
        s1 = min(max(s1, s0 + 1), S)
        out.append((s0, s1))
        s0 = s1
    return out


def generate_day(cfg: GenerateConfig, day: int) -> pa.Table:
    """Day `day` (any day >= 0, not only < cfg.days) as one impressions table."""
    w = World(cfg)
    return pa.concat_tables([_table(w, d, 0, len(d.imp_off) - 1) for d in chunks(w, day)])


def generate(cfg: GenerateConfig, out: Path) -> dict[str, Any]:
    """Write days 0..cfg.days-1 to out/day=D/part-NNNNN.parquet; return the run's metrics.

    A day is written a chunk at a time (no part file spans two chunks), and the metrics are
    sums and sets of ids, so memory stays that of a chunk whatever the day's size."""
    from lrm.metrics import log_losses, ne_from_sums  # torch: only when metrics are made
    import torch

    w = World(cfg)
    rows_per_file = max(1, min(cfg.rows_per_file, _MAX_LIST_VALUES // cfg.max_history))
    rows = sessions = files = hist_items = clicks = nbytes = 0
    loss = 0.0
    users = ads = np.zeros(0, np.int64)
    ctr_day = {}
    per_vertical = np.zeros((len(cfg.verticals), 3))  # rows, clicks, log loss of the truth
    with Reporter("generate", total=cfg.days, unit="day") as rep:
        for day in range(cfg.days):
            day_rows = day_clicks = part = 0
            for d in chunks(w, day):
                for s0, s1 in _parts(d.imp_off, rows_per_file):
                    nbytes += io.write_parquet(_table(w, d, s0, s1), part_path(out, day, part))
                    part += 1
                y = d.imps[LABEL]
                day_rows += d.rows
                day_clicks += int(y.sum())
                sessions += len(d.imp_off) - 1
                hist_items += len(d.hist)
                users = np.union1d(users, d.sessions["user_id"])
                ads = np.union1d(ads, d.imps["ad_id"])
                losses = log_losses(torch.from_numpy(d.logit), torch.from_numpy(y)).numpy()
                loss += float(losses.sum())
                v = d.sessions["vertical"][d.sess_index]
                for j in range(len(cfg.verticals)):
                    on = v == j
                    per_vertical[j] += (on.sum(), y[on].sum(), losses[on].sum())
            files += part
            rows += day_rows
            clicks += day_clicks
            ctr_day[str(day)] = round(day_clicks / day_rows, 6)
            rep.update(1, rows=rows, ctr=day_clicks / day_rows)
    return {
        "rows": rows, "sessions": sessions, "days": cfg.days, "files": files, "bytes": nbytes,
        "mean_session_length": rows / sessions,
        "mean_history_length": hist_items / sessions,
        "ctr": clicks / rows, "ctr_per_day": ctr_day,
        "users_active": len(users), "ads_active": len(ads),
        # the NE of the true click logits (lrm.metrics): the best any model can do
        "oracle_ne": ne_from_sums(loss, clicks, rows),
        "verticals": _vertical_metrics(cfg, per_vertical),
    }


def _vertical_metrics(cfg: GenerateConfig, sums: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per vertical (by name): its rows, click rate and oracle NE (None without both
    labels), from its [rows, clicks, log loss] sums."""
    from lrm.metrics import ne_from_sums

    out = {}
    for vc, (n, c, loss) in zip(cfg.verticals, sums, strict=True):
        out[vc.name] = {"rows": int(n), "ctr": float(c / n) if n else 0.0,
                        "oracle_ne": ne_from_sums(float(loss), int(c), int(n))
                        if 0 < c < n else None}
    return out
