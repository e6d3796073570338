"""Small hand-built batches: the same impressions in the plain and the deduplicated form."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from torchrec import KeyedJaggedTensor

from lrm.config import ModelConfig, TableConfig
from lrm.data.batch import Batch
from lrm.data.schema import FeatureSchema, criteo_schema, synthetic_schema

VOCAB = {"user_id": 50, "user_age": 8, "user_gender": 3, "user_geo": 20, "user_device": 4,
         "session_hour": 24, "user_history": 40, "ad_id": 40, "advertiser_id": 10,
         "ad_category": 6, "ad_format": 3, "vertical": 3}


def _kjt(keys: list[str], rows: list[dict[str, list[int]]]) -> KeyedJaggedTensor:
    """A KJT from rows of {key: ids}, key-major as KJTs are laid out."""
    lengths = [len(r[k]) for k in keys for r in rows]
    values = [v for k in keys for r in rows for v in r[k]]
    return KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values, dtype=torch.long),
                             lengths=torch.tensor(lengths, dtype=torch.long), stride=len(rows))


def make_batches(schema: FeatureSchema, sessions: int = 5, seed: int = 0,
                 rows: dict[str, int] | None = None) -> tuple[Batch, Batch]:
    """(plain, dedup) batches of the same impressions; impressions are shuffled across
    sessions, some ids are missing (empty bags) and sequences vary in length."""
    g = torch.Generator().manual_seed(seed)
    rows = rows or {f: VOCAB.get(f, 30) for f in schema.sparse_features}

    def ids(f: str, lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(0, rows[f], (n,), generator=g).tolist()

    user_rows = []
    for _ in range(sessions):
        r = {f: ids(f, 0, 1) for f in schema.user_sparse}  # 0: missing
        r.update({f: ids(f, 0, 6) for f in schema.user_seq})
        user_rows.append(r)
    sizes = torch.randint(1, 5, (sessions,), generator=g)
    inverse = torch.repeat_interleave(torch.arange(sessions), sizes)
    inverse = inverse[torch.randperm(len(inverse), generator=g)]
    B = len(inverse)
    item_rows = [{f: ids(f, 0, 1) for f in schema.item_sparse} for _ in range(B)]
    dense = torch.randn(B, len(schema.dense), generator=g)
    labels = (torch.rand(B, generator=g) < 0.3).float()
    item = _kjt(list(schema.item_sparse), item_rows)
    ukeys = list(schema.user_features)
    dedup = Batch(dense=dense, item=item, user=_kjt(ukeys, user_rows), labels=labels,
                  inverse=inverse)
    plain = Batch(dense=dense, item=item, user=_kjt(ukeys, [user_rows[i] for i in inverse]),
                  labels=labels)
    return plain, dedup


@pytest.fixture
def batches() -> Callable[..., tuple[Batch, Batch]]:
    return make_batches


@pytest.fixture
def shared_batches(tmp_path: Path) -> Callable[..., list[tuple[Batch, Batch]]]:
    """(windows form, session form) loader batches of a small deduplicated dataset whose
    users' histories slide (so the windows form shares them): `fn(hash_sizes, batch)`."""
    from lrm.config import DedupConfig
    from lrm.data import dedup
    from lrm.data.loader import BatchLoader
    from lrm.data.schema import part_path
    from tests.data.test_dedup import make_impressions

    path = part_path(tmp_path / "raw", 0)
    path.parent.mkdir(parents=True)
    pq.write_table(make_impressions(80, seed=4, users=6), path)
    dedup.dedup_dataset(tmp_path / "raw", tmp_path / "sessions", DedupConfig())

    def make(hash_sizes: dict[str, int], batch_size: int = 40) -> list[tuple[Batch, Batch]]:
        kw = dict(hash_sizes=hash_sizes, num_workers=0)
        shared = list(BatchLoader(tmp_path / "sessions", batch_size, windows=True, **kw))
        own = list(BatchLoader(tmp_path / "sessions", batch_size, windows=False, **kw))
        assert all(b.windows is not None for b in shared)
        return list(zip(shared, own, strict=True))

    return make


@pytest.fixture
def synthetic() -> FeatureSchema:
    return synthetic_schema(VOCAB)


@pytest.fixture
def criteo() -> FeatureSchema:
    return criteo_schema()


@pytest.fixture
def small_cfg() -> ModelConfig:
    """Default model shapes with small hashed tables (Criteo's ids are hashed)."""
    return ModelConfig(tables=TableConfig(hash_size=30))
