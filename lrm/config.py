"""Typed configs for the params.yaml sections.

The library never opens params.yaml: stages load it and build these dataclasses with
`from_dict`, which rejects unknown keys and wrong types with the dotted key in the message,
and each dataclass validates its values in `__post_init__` so a bad value fails at start.
"""

from __future__ import annotations

import dataclasses
import re
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
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{section}: expected a mapping, got {data!r}")
    data = dict(data or {})
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
class VerticalConfig:
    """One vertical of the synthetic world (lrm.data.synthetic): a surface (a feed, search
    results, a video tab) over the world's shared users and ads, with its own share of the
    sessions, click rate, position effect and part of the click function."""

    name: str = ""  # how metrics and the vertical models name it (its id: its place in the list)
    share: float = 1.0  # relative traffic: sessions land on it with share / sum of shares
    base_ctr: float | None = None  # its mean click probability (None: generate.base_ctr)
    position: float = 1.0  # x the position effect (per-format slopes of log1p(position))
    own: float = 0.0  # std (logit units) of its own term of the click function (0: none)

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "must not be empty")
        _check(self.share > 0, "share", "must be > 0")
        _check(self.base_ctr is None or 0 < self.base_ctr < 0.5, "base_ctr",
               "must be in (0, 0.5) (or null: generate.base_ctr)")
        _check(self.position >= 0, "position", "must be >= 0")
        _check(self.own >= 0, "own", "must be >= 0")


def default_verticals() -> list[VerticalConfig]:
    """Three surfaces, as an ads system's differ: a feed with the most traffic and a mild
    position effect, search (intent: more clicks, a steep position effect) and a video tab
    (few clicks, position matters little); each with a part of the click function its own.
    No surface has half the traffic: ExFM's foundation model learns from several times any
    vertical model's data (issue 26 measured the FM's lead with the feed at 50%: 0.5-1%)."""
    return [VerticalConfig(name="feed", share=0.4, position=1.0, own=0.4),  # generate.base_ctr
            VerticalConfig(name="search", share=0.35, base_ctr=0.05, position=2.0, own=0.4),
            VerticalConfig(name="video", share=0.25, base_ctr=0.015, position=0.5, own=0.4)]


@dataclass(kw_only=True)
class GenerateConfig:
    """Synthetic session-level ads log (lrm.data.synthetic)."""

    users: int = 100_000  # user id space (Zipf-popular); up to 1e8
    ads: int = 10_000  # ad id space; up to 1e8
    advertisers: int = 1_000  # advertiser id space (each ad has one)
    categories: int = 50  # ad categories (users' interests are over them)
    # ExFM: the FM's first version (days 0-1, exfm.teacher_days) logs day 3 on (a lag of 2);
    # the vertical models' variants train on days 3-5: day 5 scores them to pick the served
    # one, day 6 is the held-out table's
    days: int = 7  # days of logs (ExFM's default schedule needs 7: see above)
    sessions_per_day: int = 20_000  # sessions a day, over every vertical
    mean_session_length: float = 8.0  # impressions per session (>= 1)
    max_history: int = 100  # longest user history sequence
    zipf_users: float = 1.05  # Zipf exponent of users' activity (higher: fewer heavy users)
    zipf_ads: float = 1.1  # Zipf exponent of ads' popularity
    base_ctr: float = 0.03  # a vertical's click rate where it states none
    # one vertical with the defaults (share 1, base_ctr null, position 1, own 0), e.g.
    # `--generate.verticals '[{name: all}]'`, is the single-surface world
    verticals: list[VerticalConfig] = field(  # the surfaces; a session is on one
        default_factory=default_verticals)
    latent_dim: int = 16  # rank of the hidden user x ad interaction
    drift: float = 0.15  # how far interests move per day (0: stationary)
    churn: float = 0.05  # fraction of users/ads that leave (and are replaced) per day
    seed: int = 0  # the world's random seed (same seed, same logs)
    rows_per_file: int = 1_000_000  # impressions per written Parquet file

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
        _check(len(self.verticals) >= 1, "verticals", "list at least one vertical")
        names = [v.name for v in self.verticals]
        _check(len(set(names)) == len(names), "verticals", f"repeated names in {names}")


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}
LOG_FORMATS = ("auto", "parquet", "csv", "tsv", "jsonl")
TIME_UNITS = ("s", "ms", "us", "iso")


def duration_seconds(text: str) -> int:
    """'30m' -> 1800: an integer and a unit, s | m | h | d."""
    t = text.strip()
    if len(t) < 2 or t[-1] not in _DURATION or not t[:-1].isdigit() or int(t[:-1]) < 1:
        raise ValueError(f"{text!r} is not a duration such as 45s, 30m, 2h or 1d")
    return int(t[:-1]) * _DURATION[t[-1]]


@dataclass(kw_only=True)
class LogsConfig:
    """A click log's column mapping (`lrm ingest logs`, lrm.data.logs): the role of each column.

    The same keys are the command's flags (`--label COL`, `--session-gap 30m`, ...) and a
    mapping file's (`--map FILE`). A column plays one role at most. Which roles a log needs
    (a label; a user and a time for sessions by gap and for histories) is checked when it
    is ingested, so the empty default stays valid.
    """

    files: list[str] = field(default_factory=list)  # used when no FILE is given
    format: str = "auto"  # auto (by suffix) | parquet | csv | tsv | jsonl (.gz: compressed)
    columns: list[str] = field(default_factory=list)  # CSV/TSV without a header: the names
    label: str = ""  # the click column: 0/1 or a boolean (see label_count)
    label_count: bool = False  # the label counts events: a count > 0 maps to 1
    user: str = ""  # the user id column
    item: str = ""  # the item id column (with explode: the name of the exploded items)
    time: str = ""  # the impression's time
    time_unit: str = "s"  # s | ms | us (numbers since the epoch) | iso (ISO 8601 text)
    time_format: str = ""  # a strptime format for other text times, e.g. %m/%d/%Y %I:%M:%S %p
    session: str = ""  # a page-view or session id column
    session_gap: str = ""  # or: a user's impressions closer than this are one session (30m)
    categorical: list[str] = field(default_factory=list)  # per-impression id columns
    dense: list[str] = field(default_factory=list)  # numeric (log-scaled where heavy-tailed)
    sequence: list[str] = field(default_factory=list)  # list columns (or delimited strings)
    item_attributes: list[str] = field(default_factory=list)  # columns a function of the item
    # (read and scaled as `dense` is; the sessions files store them once per item)
    item_dense: list[str] = field(default_factory=list)  # numbers of the item (price, duration)
    vertical: str = ""  # a surface, tab or page type: ExFM's verticals
    explode: str = ""  # a page view's shown items with their labels, e.g. "N1-1 N2-0"
    item_sep: str = " "  # between the items of a delimited list (explode, sequence, history)
    label_sep: str = "-"  # between an exploded item and its label
    history: str = "auto"  # auto (clicks before the session) | COL | none
    history_order: str = "oldest_first"  # of a history COL: oldest_first | newest_first
    days: str = "auto"  # auto (time when a time column is given, else one) | time | file | one
    day_start: int = 0  # the UTC hour a day starts at (0-23)

    def __post_init__(self) -> None:
        _check(self.format in LOG_FORMATS, "format",
               f"must be one of {list(LOG_FORMATS)}, got {self.format!r}")
        _check(self.time_unit in TIME_UNITS, "time_unit",
               f"must be one of {list(TIME_UNITS)}, got {self.time_unit!r}")
        _check(self.history_order in ("oldest_first", "newest_first"), "history_order",
               f"must be oldest_first or newest_first, got {self.history_order!r}")
        _check(bool(self.history), "history", "must be auto, none or a column")
        _check(self.days in ("auto", "time", "file", "one"), "days",
               f"must be auto, time, file or one, got {self.days!r}")
        _check(0 <= self.day_start <= 23, "day_start", "must be an hour, 0-23")
        _check(bool(self.item_sep) and bool(self.label_sep), "item_sep/label_sep",
               "must not be empty")
        _check(not (self.session and self.session_gap), "session/session_gap",
               "give one: a session column or a gap")
        if self.session_gap:
            try:
                duration_seconds(self.session_gap)
            except ValueError as e:
                raise ConfigError(f"session_gap: {e}") from None
        seen: dict[str, str] = {}
        for role, col in self.roles():
            _check(col not in seen, role, f"column {col!r} already plays {seen.get(col)}")
            seen[col] = role

    def roles(self) -> list[tuple[str, str]]:
        """(role, source column) of every column the mapping reads."""
        one = [("label", self.label), ("user", self.user), ("time", self.time),
               ("session", self.session), ("vertical", self.vertical),
               ("explode", self.explode)]
        if not self.explode:
            one.append(("item", self.item))
        if self.history not in ("auto", "none"):
            one.append(("history", self.history))
        many = [(k, c) for k in ("categorical", "dense", "sequence", "item_attributes",
                                 "item_dense")
                for c in getattr(self, k)]
        return [(k, c) for k, c in one + many if c]


@dataclass(kw_only=True)
class IngestConfig:
    """Log ingest: Criteo TSV (lrm.data.criteo) and any click log through a mapping (`logs`)."""

    files: list[str] = field(default_factory=list)  # Criteo TSV files, when no FILE is given
    skip_bad: bool = False  # skip and count bad rows instead of failing on the first
    # the days: the data's own time. Criteo TSV has no time column, so a day is a file
    # ("file": file k of the list is day k) or every file together is one day ("one")
    days: str = "file"  # file (file k is day k) | one (every file one day)
    chunk_rows: int = 200_000  # rows per streamed chunk (bounds memory)
    logs: LogsConfig = field(default_factory=LogsConfig)  # `lrm ingest logs`: the mapping

    def __post_init__(self) -> None:
        _check(self.days in ("file", "one"), "days",
               f"must be 'file' (a day per file) or 'one' (one day), got {self.days!r}")
        _check(self.chunk_rows >= 1, "chunk_rows", "must be >= 1")


@dataclass(kw_only=True)
class DedupConfig:
    """RecD dedup of impression rows into session rows (lrm.data.dedup)."""

    rows_per_file: int = 200_000  # sessions per output Parquet file
    # lrm.data.items (measured on the default day: its sessions file 3.18 -> 2.50 MB)
    item_table: bool = True  # store an ad's attributes once per ad in each file

    def __post_init__(self) -> None:
        _check(self.rows_per_file >= 1, "rows_per_file", "must be >= 1")


@dataclass(kw_only=True)
class LoaderConfig:
    """Parquet -> KJT batches (lrm.data.loader); the batch size is the training's."""

    recd: bool = True  # user-side features once per session (RecD) vs once per impression
    prefetch: int = 4  # batches prepared ahead by background workers
    # lrm.dist.loader_workers says why
    num_workers: int | str = "auto"  # loader threads; auto: 2 on a GPU with 4+ cores, else 1

    def __post_init__(self) -> None:
        _check(self.prefetch >= 0, "prefetch", "must be >= 0")
        _check(self.num_workers == "auto" or (type(self.num_workers) is int  # not a bool
                                              and self.num_workers >= 0),
               "num_workers", f"must be auto or an integer >= 0, got {self.num_workers!r}")


@dataclass(kw_only=True)
class TrackingConfig:
    """MLflow: tracking URI (MLFLOW_TRACKING_URI overrides) and experiment."""

    uri: str = "sqlite:///mlflow.db"  # MLflow tracking URI (MLFLOW_TRACKING_URI overrides)
    experiment: str = "lrm"  # MLflow experiment the runs go to


def _check_dims(dims: list[int], key: str) -> None:
    _check(all(d >= 1 for d in dims), key, f"every layer width must be >= 1, got {dims}")


@dataclass(kw_only=True)
class TableConfig:
    """Embedding tables of both models (lrm.models.tables); the loader hashes ids with them."""

    max_rows: int = 1_000_000  # cap on the rows of a table whose vocab is known
    hash_size: int = 50_000  # rows of a table whose feature has no known vocab (Criteo)
    # feature -> feature whose table it shares, e.g. {user_history: ad_id} (same id space)
    shared: dict[str, str] = field(default_factory=dict)  # feature -> feature whose table it uses
    seq_pooling: str = "mean"  # pooling of multi-id features (user_seq): mean | sum

    def __post_init__(self) -> None:
        _check(self.max_rows >= 1, "max_rows", "must be >= 1")
        _check(self.hash_size >= 1, "hash_size", "must be >= 1")
        _check(self.seq_pooling in ("mean", "sum"), "seq_pooling", "must be 'mean' or 'sum'")
        for f, owner in self.shared.items():
            _check(f != owner, f"shared.{f}", "a feature cannot share its own table")
            _check(owner not in self.shared, f"shared.{f}",
                   f"{owner!r} shares a table itself; point at the table's owner instead")


WUKONG_NORMS = ("embedding", "layer", "none")  # what a Wukong layer's LayerNorm normalizes


@dataclass(kw_only=True)
class TeacherModelConfig:
    """Wukong teacher (lrm.models.wukong): stacked FM + linear-compress layers."""

    embedding_dim: int = 32  # d: every sparse feature and dense embedding
    dense_embeddings: int = 2  # dense features are projected into this many d-vectors
    dense_mlp: list[int] = field(default_factory=lambda: [64])  # hidden widths of that MLP
    layers: int = 3  # Wukong layers (depth)
    fm_embeddings: int = 8  # n_F: embeddings out of each FM block
    lcb_embeddings: int = 8  # n_L: embeddings out of each linear compress block
    # k of the optimized FM X (Xᵀ Y), Y [n, k]; 0: the full X Xᵀ. The paper's low rank is for
    # hundreds of features; with 14 the full product is cheap, and rank 8 cost NE (issue 26:
    # 0.9449 vs 0.9338 on the single-surface default world, the DLRM student 0.9305)
    fm_rank: int = 0  # rank of Wukong's FM interaction (0: the full X Xᵀ)
    fm_mlp: list[int] = field(default_factory=lambda: [256])  # hidden widths in the FM block
    top_mlp: list[int] = field(default_factory=lambda: [256, 64])  # last width feeds the head
    norm: str = "embedding"  # a layer's LayerNorm: over each embedding | the layer | none

    def __post_init__(self) -> None:
        for k in ("embedding_dim", "dense_embeddings", "layers", "fm_embeddings"):
            _check(getattr(self, k) >= 1, k, "must be >= 1")
        _check(self.lcb_embeddings >= 0, "lcb_embeddings", "must be >= 0")
        _check(self.fm_rank >= 0, "fm_rank", "must be >= 0 (0: full FM)")
        _check_dims(self.dense_mlp, "dense_mlp")
        _check_dims(self.fm_mlp, "fm_mlp")
        _check_dims(self.top_mlp, "top_mlp")
        _check(len(self.top_mlp) >= 1, "top_mlp", "needs at least one layer (it feeds the head)")
        _check(self.norm in WUKONG_NORMS, "norm", f"must be one of {list(WUKONG_NORMS)}, got "
               f"{self.norm!r}")


@dataclass(kw_only=True)
class StudentModelConfig:
    """DLRM-style student (lrm.models.dlrm): bottom MLP, dot interaction, top MLP."""

    embedding_dim: int = 16  # d: every sparse feature and the bottom MLP's output
    bottom_mlp: list[int] = field(default_factory=lambda: [64])  # hidden widths; out: embedding_dim
    top_mlp: list[int] = field(default_factory=lambda: [128, 64])  # last width feeds the head(s)
    # ExFM's parts (lrm.models.exfm), set per variant by lrm.exfm.distill.student_config
    aux_head: bool = False  # an auxiliary head on the top representation (distillation)
    adapter: bool = False  # a student adapter on the teacher's logit and the dense features
    aux_mlp: list[int] = field(default_factory=list)  # hidden widths of the aux head
    adapter_mlp: list[int] = field(default_factory=lambda: [16])  # hidden widths of the adapter
    # the adapter's context: the dense features, or those and the student's top
    # representation (detached: the adapter's loss never trains the student)
    adapter_context: str = "dense"  # dense | dense+features
    # the dot interaction's sizes padded to a multiple of this: the same function (a GPU
    # runs odd sizes such as 65 on slow kernels). Off: the student's products are small, and
    # 8 measured slower on an H100 (bench vs_torchrec's student, batch 2048: 8.83 vs 8.49 ms)
    interaction_pad: int = 1  # pad the interaction's sizes to a multiple (e.g. 8); 1: off

    def __post_init__(self) -> None:
        _check(self.embedding_dim >= 1, "embedding_dim", "must be >= 1")
        _check(self.interaction_pad >= 1, "interaction_pad", "must be >= 1 (1: no padding)")
        _check_dims(self.bottom_mlp, "bottom_mlp")
        _check_dims(self.top_mlp, "top_mlp")
        _check_dims(self.aux_mlp, "aux_mlp")
        _check_dims(self.adapter_mlp, "adapter_mlp")
        _check(self.adapter_context in ("dense", "dense+features"), "adapter_context",
               f"must be 'dense' or 'dense+features', got {self.adapter_context!r}")
        _check(len(self.top_mlp) >= 1, "top_mlp", "needs at least one layer (it feeds the head)")


@dataclass(kw_only=True)
class ModelConfig:
    """The `model` section: tables shared by both models, and each model's shape."""

    tables: TableConfig = field(default_factory=TableConfig)
    teacher: TeacherModelConfig = field(default_factory=TeacherModelConfig)
    student: StudentModelConfig = field(default_factory=StudentModelConfig)


MODEL_KINDS = ("teacher", "student")  # the model kinds: ModelConfig's fields but `tables`


@dataclass(kw_only=True)
class TrainConfig:
    """Training hyper-parameters (lrm.train): batch, optimizers, schedule, logging, device.

    The base for every stage that trains; `teacher.train` and `students.train` override
    single keys of it. Which days train is `SplitConfig`'s; checkpoints are `CheckpointConfig`'s.
    On small data the schedule adapts (lrm.train.schedule): a floor on steps, a validation
    slice with early stopping, warm-up; hashed tables fit the ids seen.
    """

    batch_size: int = 2048  # impressions per step over all ranks (each rank: batch_size / W)
    epochs: int = 1  # passes over the train days (when steps is 0)
    steps: int = 0  # optimizer steps (0: `epochs` passes); may span epochs; taken literally
    # the batch shrinks (not below min_batch_size) until a run takes this many steps (0: off).
    # Measured (student, 2-3 seeds, held-out NE): a 200k-impression session log 0.928 at
    # batch 2048 (82 steps) -> 0.912 at 500 steps with lr 3e-3; MIND's sample 0.998 -> 0.997;
    # the default synthetic world 0.930 -> 0.927; the Criteo sample within its noise
    # (a model's first run only: a day that goes on from the day before's model is not
    # fitted, lrm.train.days)
    fit_steps: int = 500  # the batch shrinks until a run takes this many steps (0: off)
    min_steps: int = 50  # floor on a run's steps: at min_batch_size still fewer: more epochs
    # the batch never shrinks below this. Smaller batches and more passes both measured worse
    # on the Criteo sample (teacher 0.882 at 152 rows a step; 0.899 at 15; 0.91 with 9 passes)
    min_batch_size: int = 128  # the batch never shrinks below this
    val_fraction: float = 0.1  # last share of the train days held out to validate (0: none)
    val_max_rows: int = 50_000  # at most this many impressions in that slice
    val_every: int = 0  # steps between validations (0: ten an epoch)
    # the slice is the newest rows of the train days: once early stopping has put the best
    # state back, they train once, in time order, so a run of several passes ends having
    # learnt from every row (lrm.train.schedule says what was measured)
    val_tail: bool = True  # after early stopping, one pass over the validation slice
    patience: int = 3  # validations without a lower NE before stopping (the best state returns)
    warmup_steps: int = 50  # linear learning-rate warm-up, both optimizers (at most a tenth of an epoch)
    fit_tables: bool = True  # hashed tables get no more rows than the train days have distinct ids
    # torch.compile the dense MLPs (CUDA graphs on a GPU). Measured slower, so off: CPU 41
    # vs 42 ms a step and ~50 s to compile; an H100 (default student, batch 2048) 12.5 vs
    # 10.3 ms a step (the step is the host's: its own work rose 6.9 -> 8.4 ms)
    compile: bool = False  # torch.compile the dense MLPs (measured slower: see above)
    # CUDA graphs on a GPU (not with compile). One process: the whole step, one replay a
    # step after the learning-rate warm-up (lrm.train.step_graph; vs_torchrec's student on an
    # H100, ms a step in one run: batch 2048 0.87 against torchrec's DLRM example 6.85,
    # 16384 1.75 vs 6.33). Several processes, or shared-history batches: the dense MLPs' forward and
    # backward (lrm.train.graphs; batch 2048 9.16 -> 8.14 ms a step)
    cuda_graphs: bool = True  # CUDA graphs on a GPU: the whole step in one process
    # dense part: AdamW. 3e-3 measured better than 1e-3 at the batches fit_steps gives (a
    # 200k-impression log: student 0.9155 -> 0.9117, teacher within its noise)
    lr: float = 3e-3  # dense part's AdamW learning rate
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (dense part only)
    embedding_lr: float = 0.05  # embedding tables: fbgemm's fused row-wise Adagrad
    # decay of an exponential moving average of the dense weights, which the run validates,
    # evaluates and saves in place of its last step's (lrm.train.average; 0: off). On for
    # every model since issue 44 (it was the FM's alone): where the schedule shrinks the batch
    # (a small log: ~500 steps of ~160 rows) the student's last steps set its calibration.
    # Student, 0 -> 0.98, mean held-out NE (2-core Xeon): MovieLens 100K held out on day 7 /
    # 8 / 9 (3 seeds) 0.9035 -> 0.8901, 0.9460 -> 0.9227, 0.8854 -> 0.8881 (torchrec's DLRM
    # 0.8934, 0.9173, 0.8932: docs/results.md); ml-latest-small 0.9091 -> 0.9041; the
    # default world's baseline (2 seeds) 0.8940 -> 0.8917; the synthetic log 0.9042 ->
    # 0.9043, the Criteo sample 0.8858 -> 0.8855, the MIND sample 0.9973 -> 0.9986 (the
    # DLRM 0.9991)
    ema_decay: float = 0.98  # average of the dense weights kept in place of the last (0: off)
    seed: int = 0  # init and data order (the same seed: the same run on CPU)
    eval_every: int = 0  # steps between evals on the held-out day (0: only at the end)
    eval_batches: int = 0  # batches per rank in a periodic eval (0: all); the final eval reads all
    log_every: int = 10  # steps between progress / MLflow metric points
    ne_window: int = 100_000  # impressions in the running (windowed) train NE
    device: str = "auto"  # auto (cuda when present) | cpu | cuda
    amp: bool = True  # bf16 autocast of train steps: GPU, or a CPU with native bf16
    threads: int = 0  # torch intra-op threads per process (0: the free cores, lrm.dist)
    fp8: str = ""  # an fp8_probe report: its safe-and-fast layers train in FP8 ("": off)

    def __post_init__(self) -> None:
        for k in ("batch_size", "epochs", "log_every", "ne_window", "min_batch_size",
                  "val_max_rows", "patience"):
            _check(getattr(self, k) >= 1, k, "must be >= 1")
        for k in ("steps", "eval_every", "eval_batches", "threads", "min_steps", "fit_steps",
                  "val_every", "warmup_steps"):
            _check(getattr(self, k) >= 0, k, "must be >= 0 (0: see the comment in params.yaml)")
        _check(0 <= self.val_fraction < 1, "val_fraction", "must be in [0, 1)")
        _check(self.lr > 0 and self.embedding_lr > 0, "lr/embedding_lr", "must be > 0")
        _check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        _check(0 <= self.ema_decay < 1, "ema_decay", "must be in [0, 1) (0: off)")
        _check(self.device in ("auto", "cpu", "cuda"), "device", "must be auto, cpu or cuda")


def _overrides(cls: type) -> type:
    """A dataclass with every field of `cls` optional (None: inherit the base section's)."""
    hints = typing.get_type_hints(cls)
    fields_ = [(f.name, hints[f.name] | None, field(default=None))  # type: ignore[operator]
               for f in dataclasses.fields(cls)]
    name = cls.__name__.removesuffix("Config") + "Overrides"
    out = dataclasses.make_dataclass(name, fields_, kw_only=True)
    out.__module__ = __name__
    out.__doc__ = f"Keys of {cls.__name__} to override (absent or null: the base section's)."
    out.__lrm_base__ = cls  # type: ignore[attr-defined]
    return out


TrainOverrides = _overrides(TrainConfig)


def with_overrides(base: C, overrides: Any, section: str = "") -> C:
    """`base` with every non-None field of `overrides` (an `_overrides` dataclass) applied;
    a value the config refuses is a ConfigError naming `section` (e.g. teacher.train)."""
    changes = {k: v for k, v in dataclasses.asdict(overrides).items() if v is not None}
    try:
        return dataclasses.replace(base, **changes)  # type: ignore[type-var]
    except ConfigError as e:
        raise ConfigError(f"{section}.{e}" if section else str(e)) from None


@dataclass(kw_only=True)
class FP8Config:
    """FP8 probing and dispatch (lrm.fp8, stage fp8_probe): thresholds, batches, recipe."""

    min_batches: int = 4  # batches probed at least
    max_batches: int = 32  # batches probed at most
    budget_s: float = 120.0  # seconds of probing per model: it stops at the first batch past it
    slow_device_batches: int = 4  # batches probed where no FP8 GEMM is fast (a CPU, a GPU
    # before sm_89): the error is shown, no layer can be chosen there, so no more is spent
    ci_db: float = 0.5  # stop once every judged 95% interval is at most +- this (dB)
    confidence: float = 0.95  # of those intervals
    rows: int = 2048  # rows of a batch the error is computed on (a sample; float64 GEMMs)
    min_sqnr_db: float = 25.0  # safe: the forward SQNR's lower bound is at least this
    min_grad_sqnr_db: float = 20.0  # ... and the gradients' (e5m2) lower bound at least this
    min_speedup: float = 1.05  # fast: FP8 forward + backward at least this much faster
    recipe: str = "tensorwise"  # activation/weight scaling: tensorwise | rowwise
    backend: str = "auto"  # auto (torchao where installed, else scaled_mm) | torchao | scaled_mm
    compile: bool = True  # torch.compile the quantization (fused amax/scale/cast) on CUDA
    speed_reps: int = 10  # timed forward + backward passes per layer and precision
    outlier_k: float = 6.0  # an outlier lies more than k standard deviations from the mean
    # model mods (lrm.fp8.mods), applied with the plan by train.fp8
    fuse_norm: bool = False  # the LayerNorm feeding an FP8 Linear casts its output to e4m3 itself
    bf16_residual: bool = False  # Wukong's residual stream (add, LayerNorm) in bf16 under autocast

    def __post_init__(self) -> None:
        _check(1 <= self.min_batches <= self.max_batches, "min_batches/max_batches",
               "need 1 <= min_batches <= max_batches")
        _check(self.ci_db > 0, "ci_db", "must be > 0")
        _check(self.budget_s > 0, "budget_s", "must be > 0")
        _check(self.slow_device_batches >= 1, "slow_device_batches", "must be >= 1")
        _check(0 < self.confidence < 1, "confidence", "must be in (0, 1)")
        for k in ("rows", "speed_reps"):
            _check(getattr(self, k) >= 1, k, "must be >= 1")
        _check(self.min_speedup > 0, "min_speedup", "must be > 0")
        _check(self.outlier_k > 0, "outlier_k", "must be > 0")
        _check(self.recipe in ("tensorwise", "rowwise"), "recipe",
               f"must be tensorwise or rowwise, got {self.recipe!r}")
        _check(self.backend in ("auto", "torchao", "scaled_mm"), "backend",
               f"must be auto, torchao or scaled_mm, got {self.backend!r}")
        _check(not self.fuse_norm or (self.recipe == "tensorwise" and self.backend != "torchao"),
               "fuse_norm", "needs recipe tensorwise and backend scaled_mm or auto (the "
               "norm hands the Linear one scale per tensor; torchao's Linear quantizes itself)")


@dataclass(kw_only=True)
class SplitConfig:
    """Which days train and which day is held out (the baselines of stage `train`)."""

    days: list[int] = field(default_factory=list)  # train days; empty: every day before eval_day
    eval_day: int = -1  # held-out day; negative counts from the last day (-1: the last)
    # the sessions on these verticals (the schema's vertical column) train and are held out:
    # a vertical model's rows (ExFM's students); empty: every row
    verticals: list[int] = field(default_factory=list)  # only these verticals (empty: all)

    def __post_init__(self) -> None:
        _check(all(d >= 0 for d in self.days), "days", f"days are >= 0, got {self.days}")
        _check(len(set(self.days)) == len(self.days), "days", f"repeated days in {self.days}")
        _check(all(v >= 0 for v in self.verticals), "verticals",
               f"verticals are ids >= 0, got {self.verticals}")


@dataclass(kw_only=True)
class CheckpointConfig:
    """Periodic training checkpoints (lrm.checkpoint): incremental chains, when to save, how
    rows are stored and how many chains to keep."""

    every: int = 100  # optimizer steps between checkpoints (0: only at the end)
    keep: int = 2  # chains kept (a chain: a full baseline and the deltas after it)
    deltas: int = 10  # deltas after a baseline before the next baseline (0: every one full)
    delta_budget: float = 1.0  # new baseline when a chain's deltas pass this x its baseline
    quantize: str = "none"  # embedding rows stored as: none (fp32), int8 or int4 (row-wise)
    background: bool = True  # write in a background thread (training waits only for the copy)

    def __post_init__(self) -> None:
        _check(self.every >= 0, "every", "must be >= 0 (0: only at the end)")
        _check(self.keep >= 1, "keep", "must be >= 1")
        _check(self.deltas >= 0, "deltas", "must be >= 0 (0: every checkpoint is full)")
        _check(self.delta_budget > 0, "delta_budget", "must be > 0")
        _check(self.quantize in ("none", "int8", "int4"), "quantize",
               f"{self.quantize!r} is not one of none, int8, int4")


@dataclass(kw_only=True)
class TopologyConfig:
    """The machines a sharding plan is for (lrm.sharding.topology); planning needs none of them."""

    world_size: int = 1  # ranks the plan places tables on (train under torchrun with as many)
    ranks_per_host: int = 0  # ranks sharing a host and its fast links; 0: every rank on one host
    compute_device: str = "cpu"  # cpu | cuda: what a rank computes on (decides the sharding types)
    hbm_gb: float = 80.0  # GPU memory per rank, GiB (cuda ranks keep their tables there)
    host_gb: float = 4.0  # host memory per rank, GiB (cpu ranks keep their tables there)
    reserve: float = 0.15  # share of a rank's memory kept for the dense part and activations
    intra_host_gbps: float = 2.0  # GB/s between two ranks of a host (gloo on loopback; NVLink: 300)
    inter_host_gbps: float = 12.5  # GB/s between hosts (100 Gb/s Ethernet; InfiniBand: 50)
    hbm_gbps: float = 3350.0  # GPU memory bandwidth, GB/s (cost model of a GPU without calibration)

    def __post_init__(self) -> None:
        _check(self.world_size >= 1, "world_size", "must be >= 1")
        _check(self.ranks_per_host >= 0, "ranks_per_host", "must be >= 0 (0: one host)")
        _check(self.ranks_per_host == 0 or self.world_size % self.ranks_per_host == 0,
               "ranks_per_host", f"{self.ranks_per_host} does not divide world_size "
               f"{self.world_size}")
        _check(self.compute_device in ("cpu", "cuda"), "compute_device", "must be cpu or cuda")
        for k in ("hbm_gb", "host_gb", "intra_host_gbps", "inter_host_gbps", "hbm_gbps"):
            _check(getattr(self, k) > 0, k, "must be > 0")
        _check(0 <= self.reserve < 1, "reserve", "must be in [0, 1)")


SHARDING_PLANNERS = ("lrm", "greedy", "torchrec")


@dataclass(kw_only=True)
class ShardingConfig:
    """Stage shard_plan (lrm.sharding): table statistics -> cost model -> plan per model."""

    topology: TopologyConfig = field(default_factory=TopologyConfig)
    planner: str = "lrm"  # lrm (greedy, then splits and moves) | greedy (baseline) | torchrec
    towers: bool = False  # DMT: one tower of tables per host, so its lookups stay in the host
    stats_batches: int = 32  # batches of train.batch_size impressions read for the statistics
    time_limit: float = 5.0  # seconds the lrm planner may search per model

    def __post_init__(self) -> None:
        _check(self.planner in SHARDING_PLANNERS, "planner",
               f"must be one of {list(SHARDING_PLANNERS)}, got {self.planner!r}")
        _check(self.stats_batches >= 1, "stats_batches", "must be >= 1")
        _check(self.time_limit > 0, "time_limit", "must be > 0")


def day_range(text: str) -> tuple[int, int]:
    """'3..5' -> (3, 5); '4' -> (4, 4); negatives count from the last day ('-2..-1')."""
    a, sep, b = text.strip().partition("..")
    try:
        lo, hi = int(a), int(b if sep else a)
    except ValueError:
        raise ValueError(f"{text!r} is not a day range such as 3..5 (or -2..-1)") from None
    if (lo < 0) == (hi < 0) and lo > hi:
        raise ValueError(f"{text!r}: the first day comes after the last")
    return lo, hi


# the fewest bootstrap resamples of a 95% interval: each 2.5% tail holds one (1 / 0.025)
MIN_RESAMPLES = 40


@dataclass(kw_only=True)
class EvalConfig:
    """Offline evaluation of a saved model on a held-out day (lrm.train.evaluate)."""

    day: int = -1  # negative counts from the last day (-1: the last)
    days: str = ""  # held-out days A..B (inclusive; -1: the last): each scored, then pooled
    batch_size: int = 8192  # impressions per forward
    rows: int = 0  # score the day's first N rows (0: every row)
    bootstrap: int = 200  # resamples for the 95% confidence intervals (0: none; else >= 40)

    def __post_init__(self) -> None:
        if self.days:
            try:
                day_range(self.days)
            except ValueError as e:
                raise ConfigError(f"days: {e}") from None
            _check(self.day == -1, "day", f"{self.day} with days {self.days!r}: give one of "
                                          f"them (days: each of A..B, then pooled)")
        _check(self.batch_size >= 1, "batch_size", "must be >= 1")
        _check(self.rows >= 0, "rows", "must be >= 0 (0: every row)")
        _check(self.bootstrap == 0 or self.bootstrap >= MIN_RESAMPLES, "bootstrap",
               f"must be 0 (no intervals) or >= {MIN_RESAMPLES} (fewer resamples leave the "
               f"95% interval's 2.5% tails without one each; it would be printed as one)")


@dataclass(kw_only=True)
class DistillConfig:
    """How an ExFM student learns from the teacher (lrm.exfm.distill); one ablation variant.

    distill false is the labels-only student; aux_head false puts the distillation loss on
    the serving head; adapter false distills toward the raw teacher logit.
    """

    distill: bool = True  # a distillation loss against the teacher's soft labels
    aux_head: bool = True  # ... on an auxiliary head (false: on the serving head)
    adapter: bool = True  # the student adapter turns the teacher's logit into the target
    weight: float = 3.0  # of the distillation loss (synthetic log: 3 beat 1, NE -0.2%)

    def __post_init__(self) -> None:
        _check(self.weight >= 0, "weight", "must be >= 0")
        if not self.distill:  # nothing to distill: no auxiliary head, no adapter either
            self.aux_head = self.adapter = False


@dataclass(kw_only=True)
class ExFMConfig:
    """When the foundation model (the teacher) trains and which of its versions logs each
    day's logits (lrm.exfm.schedule): its first version on days [0, T), a new one every
    `teacher_every` days, each logging the days from `teacher_lag` after its last day on."""

    # T: the first version trains on days [0, T). 2, so that in the default 7-day world the
    # variants distill on days 3-5 and the pick's validation day (5) comes after two days
    # of it, as the held-out day does: after one (T = 3) the serving head leads and the
    # auxiliary head falls behind (its head starts fresh), the order the held-out day
    # reverses. Measured (bench/exfm.py, 3 seeds): served variants' gain over labels only
    # 0.09-0.62% -> 0.14-0.94%, and the FM's day-6 lead on feed 1.15% -> 1.51%
    teacher_days: int = 2  # T: the FM's first version trains on days [0, T)
    # days between versions (0: one version, never retrained). Daily by default: measured on
    # the default world (one seed), day 6's FM NE per vertical (feed/search/video) was
    # 0.9491/0.9246/0.9565 with a version every 3 days (day 6 logged by one trained on days
    # 0-2) and 0.9375/0.9104/0.9491 every day (by one through day 4); the teacher stage
    # takes 116 s instead of 39 s (make run, 2 cores)
    teacher_every: int = 1  # days between FM versions (0: one version, never retrained)
    # days from a version's last training day to the first day it logs: 1 is a fresh
    # teacher (day D by the version trained through D - 1); 2 the FM lags a day more
    teacher_lag: int = 2  # day D's logits come from a version trained through D - lag

    def __post_init__(self) -> None:
        _check(self.teacher_days >= 1, "teacher_days", "must be >= 1")
        _check(self.teacher_every >= 0, "teacher_every", "must be >= 0 (0: never again)")
        _check(self.teacher_lag >= 1, "teacher_lag", "must be >= 1 (1: the day after its "
               "last training day)")


@dataclass(kw_only=True)
class TeacherStageConfig:
    """Stage `teacher` (ExFM): the Wukong teacher (model.teacher) on days [0, T)."""

    # keys of `train` to override, for the FM and the baseline teacher (`lrm train --model
    # teacher`) alike. The batch is smaller (4x the steps in one pass: 3 seeds, -0.2 to
    # -0.6%), and the dense part learns at 5e-4, not the students' 3e-3: Wukong's
    # interaction stack overshoots there (the baseline teacher's day-6 NE on the default
    # world 0.9813 at 3e-3, 0.9018 at 1e-3 in an older world; now 0.9069 at 1e-3, 0.8921 at
    # 5e-4, make run's baseline teacher). 5e-4 against 1e-3, 3 seeds where stated:
    # the default world's FM (versions every day, day 6 feed/search/video) 0.9381 / 0.9062 /
    # 0.9515 -> 0.9276 / 0.9002 / 0.9418 (one seed); the Criteo sample 0.8853 -> 0.8830; the
    # MIND sample 0.9964 -> 0.9976, every seed still ahead of torchrec's DLRM (0.9991).
    # 3e-4 gains a little more on the synthetic world but loses the DLRM on MIND (0.9990).
    # The tables learn at `train`'s 0.05: at 0.15 the synthetic teacher gains (0.9084 ->
    # 0.9018, one seed) but the MIND teacher loses to the DLRM (3 seeds: 1.0002 against
    # 0.9991). Issues 26 and 27.
    # What a version keeps is the moving average of its dense weights (`train`'s ema_decay
    # 0.98, lrm.train.average; the FM's before it was every model's), not its last noisy
    # steps: on the default world (one seed) the FM's versions predicted 0.94-1.23 of the
    # next day's clicks, now 0.98-1.04, and scored 0.9244 / 0.8998 / 0.9390 on day 6, now
    # 0.9221 / 0.9005 / 0.9365; 3 seeds from scratch:
    # MIND 0.9976 -> 0.9958, Criteo 0.8830 -> 0.8839 (the DLRM: 0.9991, 0.9531).
    train: TrainOverrides = field(default_factory=lambda: TrainOverrides(
        log_every=20, batch_size=512, lr=5e-4))
    registry_name: str = "lrm-teacher"  # MLflow registered model ("": do not register)


@dataclass(kw_only=True)
class AugmentConfig:
    """Stage `augment` (ExFM's data augmentation system, lrm.exfm.augment)."""

    # the days to log; empty: every day some version of the teacher serves (lrm.exfm.schedule)
    days: list[int] = field(default_factory=list)  # days to log (empty: every day served)
    batch_size: int = 8192  # impressions per teacher forward

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "batch_size", "must be >= 1")
        _check(all(d >= 0 for d in self.days), "days", f"days are >= 0, got {self.days}")


_SAFE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def default_variants() -> dict[str, DistillConfig]:
    return {"labels_only": DistillConfig(distill=False, aux_head=False, adapter=False),
            "distill_serving": DistillConfig(aux_head=False, adapter=False),
            "aux_head": DistillConfig(adapter=False),
            "aux_adapter": DistillConfig()}


@dataclass(kw_only=True)
class StudentStageConfig:
    """Stage `student` (ExFM): student sizes x variants, trained day by day (lrm.exfm.students).

    Tables (rows, hashing) come from the `model.tables` section, shared with the teacher.
    """

    days: list[int] = field(default_factory=list)  # train days; empty: T .. the day before the last
    train: TrainOverrides = field(  # keys of `train` to override
        default_factory=lambda: TrainOverrides(log_every=20))
    models: dict[str, StudentModelConfig] = field(default_factory=lambda: {  # sizes
        "small": StudentModelConfig(),
        "tiny": StudentModelConfig(embedding_dim=8, bottom_mlp=[32], top_mlp=[64, 32])})
    variants: dict[str, DistillConfig] = field(default_factory=default_variants)  # ablation
    # which surfaces get vertical models of their own: those named here, or with none named
    # every one holding at least `min_share` of the train days' impressions. The others
    # serve the foundation model's own prediction (it trains on every surface, theirs too:
    # docs/exfm.md says why not a shared VM); on an ordinary log every surface has a VM
    verticals: list[str] = field(default_factory=list)  # surfaces with VMs (empty: min_share)
    min_share: float = 0.01  # a surface's share of the impressions below which it has no VM
    # the stream's cost: every variant of every VM trains only every `ablation_every` days
    # (the pick's evidence); the days between, the served variant and labels only (the
    # control). 1: the whole ablation every day (a production stream: 7)
    ablation_every: int = 1  # stream days between two days of the whole ablation

    def __post_init__(self) -> None:
        _check(bool(self.models), "models", "list at least one student")
        _check(0 <= self.min_share < 1, "min_share", "must be in [0, 1) (0: every surface)")
        _check(self.ablation_every >= 1, "ablation_every", "must be >= 1 (1: every day)")
        for key in ("models", "variants"):  # in folder names and MLflow model names
            bad = [k for k in getattr(self, key) if not _SAFE_KEY.fullmatch(k)]
            _check(not bad, key, f"names {bad} may hold only letters, digits, '_', '.' "
                   f"and '-', and start with a letter or digit (they name folders and "
                   f"registered models)")
        _check(bool(self.variants), "variants", "list at least one variant")
        _check(all(d >= 0 for d in self.days), "days", f"days are >= 0, got {self.days}")


@dataclass(kw_only=True)
class PickConfig:
    """How `registry.variant: auto` chooses a VM's served variant (lrm.exfm.pick): the last
    `days` evaluation days before the held-out one pooled (in the stream, the days before),
    each candidate against `prior` on the same rows (paired bootstrap intervals); `prior`
    serves while no candidate beats it beyond the noise."""

    # a small surface's few hundred rows a day need several (3 left the FM's lead of 5-10%
    # on 1,000-row surfaces unseen on most days: docs/results.md)
    days: int = 5  # validation days pooled, the newest before the held-out one
    prior: str = ""  # the variant served on thin evidence ("": the first that distils)
    # the foundation model's own prediction is a candidate too: it serves a surface where
    # it beats the VM chosen beyond the noise, and a surface with no VM (students.min_share)
    fm: bool = True  # the FM's own prediction may serve a surface (false: VM variants only)
    # where neither the FM nor the chosen VM is better beyond the noise: true serves the FM
    # (the "the FM where no VM beats it"), false the VM (its compute is cheaper).
    # Chosen on two field exports' days 9-10 (pick_regret 1.0117 -> 1.0028, ten VMs of
    # 800-18k rows a day), then judged on days it never saw (the issue-shaped export carried
    # on to days 11-12): 1.0053 -> 1.0030, the best fixed candidate in hindsight 1.0026
    # (docs/results.md). A surface that cannot pay for the FM: `fm: false`
    fm_ties: bool = True  # a tie between the FM and the chosen VM goes to the FM

    def __post_init__(self) -> None:
        _check(self.days >= 1, "days", "must be >= 1")


@dataclass(kw_only=True)
class RegistryConfig:
    """The MLflow model registry (lrm.registry): what registers, and when @champion moves.

    Every new version gets @challenger; @champion moves to it only when its NE on the
    evaluation data beats the champion's NE on the same data by at least `margin`.
    """

    student_prefix: str = "lrm-student-"  # student NAME registers as PREFIX + NAME
    # auto: each vertical model serves the variant its validation days choose beyond the
    # noise (lrm.exfm.pick), or the foundation model's prediction where no VM beats it;
    # fm: the FM's prediction for every surface; else a key of students.variants
    variant: str = "auto"  # the served variant: auto, fm or a key of students.variants
    margin: float = 0.001  # absolute NE a challenger must gain over the champion to replace it
    pick: PickConfig = field(default_factory=lambda: PickConfig())  # auto's evidence

    def __post_init__(self) -> None:
        _check(bool(self.student_prefix), "student_prefix", "must not be empty")
        _check(self.margin >= 0, "margin", "must be >= 0")


def _check_range(values: list[float], key: str, *, floor: float, integer: bool = False
                 ) -> None:
    """A searched range: [] (not searched) or [low, high], floor <= low <= high."""
    what = "integers" if integer else "numbers"
    _check(len(values) in (0, 2), key, f"must be [low, high] (or [] to leave it as it is), "
                                       f"got {values}")
    if values:
        low, high = values
        _check(not integer or all(float(v).is_integer() for v in values), key,
               f"must be {what}, got {values}")
        _check(floor <= low <= high, key, f"needs {floor:g} <= low <= high, got {values}")


@dataclass(kw_only=True)
class TuneSpace:
    """What `lrm tune` searches (lrm.tune): a range [low, high] (rates on a log scale) or
    a list of choices per training param; [] leaves the param as the params state it."""

    lr: list[float] = field(default_factory=lambda: [3e-4, 1e-2])  # dense AdamW rate [low, high]
    embedding_lr: list[float] = field(  # the tables' row-wise Adagrad rate [low, high]
        default_factory=lambda: [0.01, 0.3])
    # not searched by default: the validation days prefer the passes and the later held-out
    # day did not, on MovieLens 100K (the best of 12 trials 0.9-1.6% worse than the defaults
    # there, with the newest rows trained after early stopping: docs/tune.md)
    epochs: list[int] = field(default_factory=list)  # passes [low, high] ([]: not searched)
    embedding_dim: list[int] = field(  # the model's embedding dim: choices
        default_factory=lambda: [8, 16, 32, 64])
    width: list[float] = field(  # x every hidden layer's width of the model: choices
        default_factory=lambda: [0.5, 1.0, 2.0])

    def __post_init__(self) -> None:
        _check_range(self.lr, "lr", floor=1e-8)
        _check_range(self.embedding_lr, "embedding_lr", floor=1e-8)
        _check_range(self.epochs, "epochs", floor=1, integer=True)
        _check(all(d >= 4 and d % 4 == 0 for d in self.embedding_dim), "embedding_dim",
               f"choices are dims that are multiples of 4 (fbgemm's tables take no other), "
               f"got {self.embedding_dim}")
        _check(all(w > 0 for w in self.width), "width",
               f"choices are factors > 0, got {self.width}")
        for k in ("embedding_dim", "width"):
            v = getattr(self, k)
            _check(len(set(v)) == len(v), k, f"repeated choices in {v}")
        _check(any((self.lr, self.embedding_lr, self.epochs, self.embedding_dim, self.width)),
               "space", "searches nothing: give at least one range or list of choices")


@dataclass(kw_only=True)
class TuneConfig:
    """Stage `tune` (lrm.tune): Optuna searches `space` for one model kind, each trial
    trained on the days before the validation days and scored on them; the held-out
    `split.eval_day` stays unseen (the tuned params are judged there)."""

    trials: int = 20  # trials at most (0: no limit, then minutes must be set)
    minutes: float = 0.0  # wall-clock budget: no trial starts after it (0: none)
    valid_days: int = 1  # the days just before split.eval_day that score each trial
    seed: int = 0  # the sampler's seed (each trial trains with train.seed)
    # the logs pipeline's tune nodes (pipelines/logs/dvc.yaml): true, they search and the
    # baselines train with the result; false, they write a params file that changes nothing
    in_pipeline: bool = False  # the logs pipeline searches before training (false: skipped)
    space: TuneSpace = field(default_factory=TuneSpace)

    def __post_init__(self) -> None:
        _check(self.trials >= 0, "trials", "must be >= 0 (0: no limit)")
        _check(self.minutes >= 0, "minutes", "must be >= 0 (0: no limit)")
        _check(self.trials > 0 or self.minutes > 0, "trials/minutes",
               "give a budget: trials > 0 or minutes > 0")
        _check(self.valid_days >= 1, "valid_days", "must be >= 1")


STREAM_SOURCES = ("synthetic", "folder")


@dataclass(kw_only=True)
class StreamingConfig:
    """The streaming retraining flow (flows/streaming.py, lrm.streaming) and its deployment.

    Each run processes the next `days` days: get the day, dedup, (the teacher on its own
    cadence), augment with the teacher's champion, each student resumed from its checkpoint
    chain and trained on the day, evaluated, registered, promoted only when NE improves.
    """

    root: str = "stream"  # the stream's folder: its days, checkpoints, models and reports
    # where days come from: synthetic (the next day of `generate`'s world) or folder (each new
    # file dropped into `watch` is the next day: impressions Parquet, a click log through
    # `ingest.logs` where that maps one, else Criteo TSV; lrm.streaming.sources)
    source: str = "synthetic"  # synthetic (generate's world) | folder (files dropped in `watch`)
    watch: str = ""  # the folder source's inbox ("": ROOT/incoming)
    days: int = 1  # new days one run processes (`python -m flows.streaming --days N` overrides)
    cron: str = "0 2 * * *"  # the deployment's schedule (`lrm serve --cron` overrides)
    holdout: float = 0.2  # day D+1 not there yet: D's last share of sessions, held out to evaluate
    # seconds an inbox file must go unchanged (size and mtime) before it is taken: a file still
    # being written waits, and the files after it too (a file renamed in whole is taken at once
    # when its mtime is older; lrm.streaming.sources)
    settle: float = 60.0
    # where the models' tables go: a plan file of `lrm shard-plan` (its entries teacher and
    # students.NAME), as --plan gives the stages; "": torchrec's planner (lrm.sharding)
    plan: str = ""  # a sharding plan file for the stream's models ("": the default placement)
    # the day's vertical models trained at once, each in a worker process of its own (one
    # Prefect task each) with the cores shared among them; 1: one after another in the
    # flow's process. More surfaces than cores: a production stream sets the cores it has
    workers: int = 1  # vertical models of a day trained at once (worker processes)

    def __post_init__(self) -> None:
        _check(bool(self.root), "root", "must not be empty")
        _check(self.workers >= 1, "workers", "must be >= 1 (1: one after another)")
        _check(self.source in STREAM_SOURCES, "source",
               f"must be one of {list(STREAM_SOURCES)}, got {self.source!r}")
        _check(self.days >= 1, "days", "must be >= 1")
        _check(len(self.cron.split()) == 5, "cron",
               f"must be a 5-field cron expression, got {self.cron!r}")
        _check(0 < self.holdout < 1, "holdout", "must be in (0, 1)")
        _check(self.settle >= 0, "settle", "must be >= 0 (seconds)")


# the section whose `train` keys override `train` for each kind of model that trains: a
# baseline student takes `train` as it is; the teacher (the FM and a baseline teacher) and the
# ExFM students ("students") take their sections' overrides (ParamsConfig.train_for)
TRAIN_OVERRIDES: dict[str, str | None] = {"student": None, "teacher": "teacher.train",
                                          "students": "students.train"}


def train_keys(kind: str) -> tuple[str, ...]:
    """The params keys `ParamsConfig.train_for(kind)` reads (what a stage lists for DVC)."""
    if kind not in TRAIN_OVERRIDES:
        raise ConfigError(f"no training values for {kind!r}: one of {list(TRAIN_OVERRIDES)}")
    over = TRAIN_OVERRIDES[kind]
    return ("train",) if over is None else ("train", over)


@dataclass(kw_only=True)
class ParamsConfig:
    """The whole params.yaml: one field per section. Its defaults are the built-in values,
    and params.yaml states every one of them (tests/test_config.py checks they agree)."""

    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    evaluate: EvalConfig = field(default_factory=EvalConfig)
    exfm: ExFMConfig = field(default_factory=ExFMConfig)
    teacher: TeacherStageConfig = field(default_factory=TeacherStageConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    students: StudentStageConfig = field(default_factory=StudentStageConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    fp8: FP8Config = field(default_factory=FP8Config)
    tune: TuneConfig = field(default_factory=TuneConfig)

    def get(self, key: str) -> Any:
        """The value at dotted `key` (e.g. "model.student")."""
        obj: Any = self
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj

    def train_for(self, kind: str) -> TrainConfig:
        """The training values `kind` trains with (TRAIN_OVERRIDES): `train` under its
        section's overrides. The one place they are applied: the stages take the result
        (stagekit's `Stage.trains`), the stream checks a new day by it."""
        _, *over = train_keys(kind)
        return with_overrides(self.train, self.get(over[0]), over[0]) if over else self.train


def section_type(key: str, root: type = ParamsConfig) -> type:
    """The dataclass (or type) at dotted `key` of the params schema."""
    tp: Any = root
    for part in key.split("."):
        if not dataclasses.is_dataclass(tp):
            raise KeyError(key)
        hints = typing.get_type_hints(tp)
        if part not in hints:
            raise KeyError(key)
        tp = hints[part]
    return tp
