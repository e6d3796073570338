"""Typed configs for the params.yaml sections.

The library never opens params.yaml: stages load it and build these dataclasses with
`from_dict`, which rejects unknown keys and wrong types with the dotted key in the message,
and each dataclass validates its values in `__post_init__` so a bad value fails at start.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lrm.errors import ConfigError

C = TypeVar("C")


def _check(cond: bool, key: str, why: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {why}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} is not {tp}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        _, vt = typing.get_args(tp) or (Any, Any)
        return {str(k): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is Any:
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp in (str, bool) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def from_dict(cls: type[C], data: dict[str, Any] | None, section: str) -> C:
    """Build config dataclass `cls` from a params.yaml section; unknown keys are errors."""
    data = dict(data or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{section}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{section}: unknown keys {unknown}; known: {sorted(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{section}.{e}") from None


@dataclass(kw_only=True)
class GenerateConfig:
    """Synthetic session-level ads log (lrm.data.synthetic)."""

    users: int = 100_000  # user id space (Zipf-popular); up to 1e8
    ads: int = 10_000  # ad id space; up to 1e8
    advertisers: int = 1_000
    categories: int = 50
    days: int = 5
    sessions_per_day: int = 20_000
    mean_session_length: float = 8.0  # impressions per session (>= 1)
    max_history: int = 100  # longest user history sequence
    zipf_users: float = 1.05
    zipf_ads: float = 1.1
    base_ctr: float = 0.03
    latent_dim: int = 16  # rank of the hidden user x ad interaction
    drift: float = 0.15  # how far interests move per day (0: stationary)
    churn: float = 0.05  # fraction of users/ads that leave (and are replaced) per day
    seed: int = 0
    rows_per_file: int = 1_000_000

    def __post_init__(self) -> None:
        for k in ("users", "ads", "advertisers", "categories", "days", "sessions_per_day",
                  "max_history", "latent_dim", "rows_per_file"):
            _check(getattr(self, k) >= 1, k, "must be >= 1")
        _check(self.users <= 10**9 and self.ads <= 10**9, "users/ads", "at most 1e9 ids")
        _check(self.mean_session_length >= 1, "mean_session_length", "must be >= 1")
        _check(0 < self.base_ctr < 0.5, "base_ctr", "must be in (0, 0.5)")
        _check(self.zipf_users > 0 and self.zipf_ads > 0, "zipf_*", "exponents must be > 0")
        _check(self.drift >= 0, "drift", "must be >= 0")
        _check(0 <= self.churn < 1, "churn", "must be in [0, 1)")


@dataclass(kw_only=True)
class IngestConfig:
    """Criteo TSV ingest (lrm.data.criteo)."""

    files: list[str] = field(default_factory=list)
    skip_bad: bool = False  # skip and count bad rows instead of failing on the first
    rows_per_day: int = 0  # split the row stream into days of this many rows; 0: one day per file
    chunk_rows: int = 200_000  # rows per streamed chunk (bounds memory)

    def __post_init__(self) -> None:
        _check(self.rows_per_day >= 0, "rows_per_day", "must be >= 0")
        _check(self.chunk_rows >= 1, "chunk_rows", "must be >= 1")


@dataclass(kw_only=True)
class DedupConfig:
    """RecD dedup of impression rows into session rows (lrm.data.dedup)."""

    rows_per_file: int = 200_000  # sessions per output Parquet file

    def __post_init__(self) -> None:
        _check(self.rows_per_file >= 1, "rows_per_file", "must be >= 1")


@dataclass(kw_only=True)
class LoaderConfig:
    """Parquet -> KJT batches (lrm.data.loader)."""

    batch_size: int = 2048  # impressions per batch
    dedup: bool = True  # user-side features once per session (RecD) vs the plain form
    prefetch: int = 4  # batches prepared ahead by background workers
    num_workers: int = 1

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "batch_size", "must be >= 1")
        _check(self.prefetch >= 0, "prefetch", "must be >= 0")
        _check(self.num_workers >= 0, "num_workers", "must be >= 0")


@dataclass(kw_only=True)
class TrackingConfig:
    """MLflow: tracking URI (MLFLOW_TRACKING_URI overrides) and experiment."""

    uri: str = "sqlite:///mlflow.db"
    experiment: str = "lrm"
