"""The synthetic world written out as the flat click log a user would bring: one CSV of
impressions (user, time, session id, item, click, user and item attributes, dense columns,
the surface; no histories: `lrm ingest logs` makes them), read through `MAPPING`.

`Export` adds what real exports do to a log (the defaults write the world as it is):

* a first day that starts late and a last day that ends early (`start_hour`, `end_hour`):
  an export cut at a time of its own, not at a day boundary (one started 55 minutes before
  the first midnight: a first day of 55 minutes);
* codes for unknown (`unknown`): user attributes as text codes, unknown (the world's 0 of
  age and gender) written as a negative code (-124), which ingest takes as a token;
* a numeric item attribute (`item_dense`): ``video_duration``, seconds, heavy-tailed (5 s
  to an hour, most under a minute), a function of the ad.

Surfaces of unequal share are the world's own verticals (`GenerateConfig.verticals`,
written by name in ``surface``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from lrm.config import GenerateConfig, LogsConfig
from lrm.data.synthetic.write import generate_day

T0 = 1_573_257_600  # day 0's midnight, UTC (2019-11-09), in seconds
CATEGORICAL = ["user_age", "user_gender", "user_geo", "user_device", "slot"]
DENSE = ["d_bid", "d_ad_age", "d_user_activity"]
ITEM_ATTRIBUTES = ["advertiser_id", "ad_category", "ad_format"]
CODED = ("user_age", "user_gender")  # attributes whose 0 is "unknown"
DURATION = "video_duration"


@dataclass(frozen=True)
class Export:
    """What the export does to the world's days (the defaults: nothing)."""

    start_hour: float = 0.0  # day 0's rows from this hour on (23 + 5/60: its last 55 min)
    end_hour: float = 24.0  # the last day's rows before this hour
    unknown: str = ""  # the text code of an unknown age or gender ("": the world's 0)
    item_dense: bool = False  # write video_duration, a number of the ad


# what exports met in the field do (issue 44): all of it at once
FIELD = Export(start_hour=23 + 5 / 60, end_hour=12.0, unknown="-124", item_dense=True)


def mapping(export: Export = Export()) -> LogsConfig:
    """The column mapping that reads the log `write_log` writes with `export`."""
    return LogsConfig(label="label", user="user_id", item="ad_id", time="ts",
                      session="session_id", categorical=list(CATEGORICAL), dense=list(DENSE),
                      item_attributes=list(ITEM_ATTRIBUTES), vertical="surface",
                      item_dense=[DURATION] if export.item_dense else [])


def log_frame(cfg: GenerateConfig, export: Export = Export()) -> pl.DataFrame:
    """Days 0..cfg.days-1 of the world as the export's rows, in time order."""
    names = pl.Series([v.name for v in cfg.verticals])
    days = []
    for day in range(cfg.days):
        df = pl.from_arrow(generate_day(cfg, day))
        assert isinstance(df, pl.DataFrame)
        # a session's impressions share a time within its day and hour
        days.append(df.with_columns(
            ts=T0 + pl.col("day").cast(pl.Int64) * 86_400 + pl.col("session_hour") * 3_600
            + pl.col("session_id") % 3_000, slot=pl.col("position"),
            surface=pl.col("vertical").replace_strict(range(len(names)), names)))
    df = pl.concat(days)
    last = cfg.days - 1
    df = df.filter((pl.col("ts") >= T0 + export.start_hour * 3_600)
                   & (pl.col("ts") < T0 + (last * 24 + export.end_hour) * 3_600))
    if export.unknown:
        df = df.with_columns(pl.when(pl.col(c) == 0).then(pl.lit(export.unknown))
                             .otherwise(pl.col(c).cast(pl.String)).alias(c) for c in CODED)
    extra = []
    if export.item_dense:  # 5 s to an hour, most short (Pareto, from a hash of the ad)
        unit = (pl.col("ad_id").cast(pl.UInt64) * 2_654_435_761 % 1_000_003) / 1_000_003
        df = df.with_columns((5 * (1 - unit) ** -0.8).clip(upper_bound=3600).round(1)
                             .alias(DURATION))
        extra = [DURATION]
    return df.sort("ts", "session_id", "position").select(
        "user_id", "ts", "session_id", "ad_id", "label", *CATEGORICAL, *ITEM_ATTRIBUTES,
        *extra, "surface", *DENSE)


def write_log(cfg: GenerateConfig, path: Path, export: Export = Export()) -> int:
    """The world's days as one CSV log at `path` (see `Export`); the rows written."""
    df = log_frame(cfg, export)
    df.write_csv(path)
    return df.height
