"""Embedding tables from a FeatureSchema, and the two EmbeddingBagCollections that use them.

One table per sparse feature by default; `TableConfig.shared` lets features share a table
(e.g. `user_history` looked up in the `ad_id` table). A table has min(vocab, max_rows)
rows where the schema knows the feature's vocab, else `hash_size` rows (Criteo's hashed
ids); `hash_sizes` tells the loader the id space of every feature.

The tables are split over two plain `EmbeddingBagCollection`s so that user-side features
are looked up once per row of `batch.user` (one per unique session under RecD) and
expanded to impressions afterwards; DistributedModelParallel shards both. A table shared
between a user-side and an item-side feature lives in the item-side collection, whose
input then carries B + U rows: the B impressions' item features, then the U sessions'
user features of those shared tables (empty bags elsewhere), so the shared rows are still
pooled once per session. A schema with no user-side features (Criteo) has no user EBC.
Embeddings are read out of an EBC's KeyedTensor by feature name (`by_key`): a sharded EBC
returns its features in shard order, not in table order.

Shared histories (`batch.windows`, lrm.data.batch): the EBCs pool each history segment
once (a user's sessions in the batch share them) and `pool_windows` sums each session's
segments (a difference of prefix sums) into its window, the mean where the table pools by
mean: the session's pooled history, as if looked up on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor
from torchrec.modules.embedding_configs import PoolingType

from lrm.config import TableConfig
from lrm.data.batch import Batch, Windows
from lrm.data.schema import FeatureSchema
from lrm.errors import ConfigError

_POOLING = {"mean": PoolingType.MEAN, "sum": PoolingType.SUM}


def table_name(owner: str) -> str:
    return f"t_{owner}"


def embedding_tables(schema: FeatureSchema, cfg: TableConfig, dim: int) -> list[EmbeddingBagConfig]:
    """One EmbeddingBagConfig per table, in schema feature order of the tables' owners."""
    features = schema.sparse_features
    for f, owner in cfg.shared.items():
        for name in (f, owner):
            if name not in features:
                raise ConfigError(f"model.tables.shared.{f}: {name!r} is not a sparse feature "
                                  f"of the {schema.name!r} schema ({', '.join(features)})")
    # each table in the schema position of its owner, the owner first among its features
    members = {f: [f] + [g for g in features if cfg.shared.get(g) == f]
               for f in features if f not in cfg.shared}
    tables = []
    for owner, feats in members.items():
        rows = max(min(schema.vocab[f], cfg.max_rows) if f in schema.vocab else cfg.hash_size
                   for f in feats)
        # every table pools like the sequences: a single-id feature's bag holds 0 or 1 ids,
        # which mean and sum pool alike, and one pooling mode lets all the tables of a side
        # share one fused kernel (fbgemm runs one pooling mode per TBE)
        tables.append(EmbeddingBagConfig(
            name=table_name(owner), num_embeddings=rows, embedding_dim=dim,
            feature_names=list(feats), pooling=_POOLING[cfg.seq_pooling],
        ))
    return tables


def hash_sizes(tables: list[EmbeddingBagConfig]) -> dict[str, int]:
    """feature -> rows of its table: the loader maps that feature's ids into [0, rows)."""
    return {f: t.num_embeddings for t in tables for f in t.feature_names}


def split_tables(schema: FeatureSchema, tables: list[EmbeddingBagConfig]
                 ) -> tuple[list[EmbeddingBagConfig], list[EmbeddingBagConfig]]:
    """(user-side tables, item-side tables); a table shared across sides is item-side."""
    user = set(schema.user_features)
    user_t = [t for t in tables if set(t.feature_names) <= user]
    return user_t, [t for t in tables if not set(t.feature_names) <= user]


@dataclass(frozen=True)
class _Layout:
    """Which features each EBC looks up."""

    user_keys: list[str]  # keys of the user EBC (user features of user-only tables)
    item_keys: list[str]  # item features, in item-EBC output order
    cross_keys: list[str]  # user features of tables shared with item features


def _layout(schema: FeatureSchema, user_t: list[EmbeddingBagConfig],
            item_t: list[EmbeddingBagConfig]) -> _Layout:
    user = set(schema.user_features)
    out = [f for t in item_t for f in t.feature_names]  # EBC output order
    return _Layout(
        user_keys=[f for t in user_t for f in t.feature_names],
        item_keys=[f for f in out if f not in user],
        cross_keys=[f for f in out if f in user],
    )


def side_features(schema: FeatureSchema, tables: list[EmbeddingBagConfig]
                  ) -> tuple[list[str], list[str]]:
    """(user-side, item-side) feature names in the order SparseEmbeddings returns them."""
    lay = _layout(schema, *split_tables(schema, tables))
    return lay.user_keys + lay.cross_keys, lay.item_keys


@torch.fx.wrap
def select_keys(kjt: KeyedJaggedTensor, keys: list[str]) -> KeyedJaggedTensor:
    """`kjt` restricted to (and ordered as) `keys`; `kjt` itself when it already is."""
    have = kjt.keys()
    if have == keys:
        return kjt
    try:
        return kjt.permute([have.index(k) for k in keys])
    except ValueError:
        missing = sorted(set(keys) - set(have))
        raise KeyError(f"batch KJT lacks features {missing}; it has {have}") from None


@torch.fx.wrap
def stack_rows(item: KeyedJaggedTensor, user: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """One KJT of stride B + U: item's keys on rows [0, B), user's keys on rows [B, B + U)."""
    B, U = item.stride(), user.stride()
    ni, nu = len(item.keys()), len(user.keys())
    il, ul = item.lengths(), user.lengths()
    lengths = torch.cat([
        torch.cat([il.view(ni, B), il.new_zeros(ni, U)], 1).flatten(),
        torch.cat([il.new_zeros(nu, B), ul.view(nu, U).to(il.dtype)], 1).flatten(),
    ])
    # the inputs' values per key where known (the loader's are): no device read for them
    known = item.length_per_key_or_none(), user.length_per_key_or_none()
    return KeyedJaggedTensor(keys=item.keys() + user.keys(),
                             values=torch.cat([item.values(), user.values()]),
                             lengths=lengths, stride=B + U,
                             length_per_key=None if None in known else known[0] + known[1])


@torch.fx.wrap
def by_key(pooled: KeyedTensor, keys: list[str], dim: int) -> torch.Tensor:
    """[rows, len(keys), dim] in `keys` order.

    A sharded EBC returns its keys in shard order, not the unsharded table order, so the
    embeddings are always picked by name (a no-op view when the order already matches).
    """
    if pooled.keys() == keys:
        values = pooled.values()
    else:
        values = KeyedTensor.regroup([pooled], [keys])[0]
    return values.view(values.shape[0], len(keys), dim)


@torch.fx.wrap
def pool_windows(x: torch.Tensor, keys: list[str], windows: Windows | None,
                 mean: list[bool]) -> torch.Tensor:
    """User rows [U + G, len(keys), d] of a lookup -> the sessions' rows [U, len(keys), d].

    A key given as segments gets each session's window: the sum of its segments (the
    pooled means times their lengths where the table pools by mean) as a difference of
    prefix sums (float64, so the difference loses nothing), then over the window's length
    where `mean`. Other keys keep rows [0, U). No windows: `x` itself. Whole columns are
    written into one copy (a slice per column would cost a full-size gradient each) and
    no index is built on the host (no copy to the device inside a step).
    """
    if windows is None:
        return x
    U = windows.sessions
    out = x[:U].clone()
    for j, key in enumerate(keys):
        if key not in windows.keys:
            continue
        k = windows.keys.index(key)
        seg = x[U:, j].double()  # [G, d]
        if mean[j]:
            seg = seg * windows.segment_lengths[k].double().unsqueeze(1)
        cum = torch.cat([seg.new_zeros(1, seg.shape[1]), seg.cumsum(0)])
        win = cum.index_select(0, windows.end[k]) - cum.index_select(0, windows.first[k])
        if mean[j]:
            win = win / windows.lengths[k].double().clamp(min=1).unsqueeze(1)
        out[:, j] = win.to(x.dtype)
    return out


@torch.fx.wrap
def _rows(x: torch.Tensor, item: KeyedJaggedTensor, first: bool) -> torch.Tensor:
    """The first B (item) rows or the rest (user rows) of a `stack_rows` lookup."""
    B = item.stride()
    return x[:B] if first else x[B:]


class SparseEmbeddings(nn.Module):
    """Pooled embeddings of a batch: user-side per row of `batch.user`, item-side per impression.

    forward(batch) -> (user [U, n_user, d], item [B, n_item, d]); user rows are not yet
    expanded (call `batch.expand_user`), so work that depends only on the session can stay
    per session. `user_features` / `item_features` name the embeddings in that order. With
    no user-side features, user is [B, 0, d].

    The batch KJTs go to the EBCs as they are (an EBC, sharded or not, takes its features by
    name and ignores other keys), so DMP's TrainPipelineSparseDist can pipeline their input
    dist; only the input of an item EBC that holds cross-side shared tables is built per
    batch (`stack_rows`), and that EBC is then not pipelined.
    """

    def __init__(self, schema: FeatureSchema, tables: list[EmbeddingBagConfig],
                 device: torch.device | str | None = "cpu") -> None:
        super().__init__()
        dims = {t.embedding_dim for t in tables}
        if len(dims) != 1:
            raise ValueError(f"all tables must share one embedding dim, got {sorted(dims)}")
        self.dim = dims.pop()
        user_t, item_t = split_tables(schema, tables)
        if not item_t:
            raise ValueError(f"schema {schema.name!r} has no item-side sparse features")
        device = torch.device(device) if device is not None else None
        self.user_ebc = EmbeddingBagCollection(user_t, device=device) if user_t else None
        self.item_ebc = EmbeddingBagCollection(item_t, device=device)
        self._layout = lay = _layout(schema, user_t, item_t)
        self.user_features, self.item_features = lay.user_keys + lay.cross_keys, lay.item_keys
        by_mean = {f for t in tables if t.pooling == PoolingType.MEAN for f in t.feature_names}
        self._mean = {k: [f in by_mean for f in keys] for k, keys in
                      (("user", lay.user_keys), ("cross", lay.cross_keys))}

    @property
    def num_user(self) -> int:
        return len(self.user_features)

    @property
    def num_item(self) -> int:
        return len(self.item_features)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        lay, d = self._layout, self.dim
        user_parts = []
        if self.user_ebc is not None:  # extra (cross-side) keys of batch.user are ignored
            user_parts.append(pool_windows(by_key(self.user_ebc(batch.user), lay.user_keys, d),
                                           lay.user_keys, batch.windows, self._mean["user"]))
        if not lay.cross_keys:
            item = by_key(self.item_ebc(batch.item), lay.item_keys, d)
        else:
            kjt = stack_rows(select_keys(batch.item, lay.item_keys),
                             select_keys(batch.user, lay.cross_keys))
            pooled = self.item_ebc(kjt)
            item = _rows(by_key(pooled, lay.item_keys, d), batch.item, first=True)
            user_parts.append(pool_windows(
                _rows(by_key(pooled, lay.cross_keys, d), batch.item, first=False),
                lay.cross_keys, batch.windows, self._mean["cross"]))
        if not user_parts:
            return item[:, :0], item
        return (torch.cat(user_parts, 1) if len(user_parts) > 1 else user_parts[0]), item
