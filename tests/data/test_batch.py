"""Batch on real loader output: RecD form vs plain form through torchrec's modules."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lrm.data.loader import BatchLoader
from lrm.data.schema import criteo_schema, part_path, synthetic_schema
from tests.data.test_dedup import make_impressions

SIZE = 13  # every feature hashed into a table of SIZE rows


def _write(root, schema, n_sessions=60):
    t = make_impressions(n_sessions, seed=3, schema=schema)
    path = part_path(root, 0)
    path.parent.mkdir(parents=True)
    pq.write_table(t, path)
    return root


def _ebc(features, dim=4):
    torch.manual_seed(0)
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=dim, num_embeddings=SIZE,
                           feature_names=[f]) for f in features])


def _pairs(root, schema, batch_size):
    hs = dict.fromkeys(schema.sparse_features, SIZE)
    recd = BatchLoader(root, batch_size, dedup=True, hash_sizes=hs)
    plain = BatchLoader(root, batch_size, dedup=False, hash_sizes=hs)
    return list(zip(recd, plain, strict=True))


@pytest.mark.parametrize("schema", [synthetic_schema(), criteo_schema()], ids=["synthetic",
                                                                               "criteo"])
def test_variable_batch_kjt_pools_like_the_plain_batch(tmp_path, schema):
    root = _write(tmp_path / "d", schema)
    ebc = _ebc(schema.sparse_features)
    pairs = _pairs(root, schema, 32)
    assert any(bd.num_sessions < bd.size for bd, _ in pairs) or not schema.user_features
    for bd, bp in pairs:
        vb = bd.variable_batch_kjt()
        assert vb.variable_stride_per_key()
        plain = KeyedJaggedTensor.concat([bp.user, bp.item]) if bp.user.keys() else bp.item
        got, want = ebc(vb), ebc(plain)
        assert got.keys() == want.keys() == list(schema.sparse_features)
        assert got.values().shape == (bd.size, 4 * len(schema.sparse_features))
        torch.testing.assert_close(got.values(), want.values(), rtol=0, atol=1e-6)


def test_user_side_pooled_once_per_session_then_expanded(tmp_path):
    schema = synthetic_schema()
    root = _write(tmp_path / "d", schema)
    ebc = _ebc(schema.user_features)
    for bd, bp in _pairs(root, schema, 24):
        pooled = ebc(bd.user).values()  # [U, dims]: one lookup per session
        assert pooled.shape[0] == bd.num_sessions <= bd.size
        torch.testing.assert_close(bd.expand_user(pooled), ebc(bp.user).values(), rtol=0,
                                   atol=1e-6)
        assert bp.expand_user(pooled) is pooled  # the plain form needs no expansion


def test_batch_to_keeps_everything(tmp_path):
    schema = synthetic_schema()
    root = _write(tmp_path / "d", schema)
    b = next(iter(BatchLoader(root, 16)))
    c = b.to(torch.device("cpu"))
    assert c.size == b.size == 16 and c.deduped and c.num_sessions == b.num_sessions
    assert torch.equal(c.inverse, b.inverse) and torch.equal(c.user.values(), b.user.values())
