"""Tables from the schema, hash sizes for the loader, the two-EBC lookup, stacked rows."""

from __future__ import annotations

import pytest
import torch
from torchrec import KeyedJaggedTensor
from torchrec.modules.embedding_configs import PoolingType

from lrm.config import ModelConfig, TableConfig
from lrm.errors import ConfigError
from lrm.models import build_model
from lrm.models.tables import (SparseEmbeddings, embedding_tables, hash_sizes, split_tables,
                               stack_rows)


def test_one_table_per_feature(synthetic):
    cfg = TableConfig(max_rows=30, hash_size=7)
    tables = embedding_tables(synthetic, cfg, 8)
    assert [t.feature_names for t in tables] == [[f] for f in synthetic.sparse_features]
    sizes = hash_sizes(tables)
    assert sizes["user_id"] == 30 and sizes["user_age"] == 8  # min(vocab, max_rows)
    # every table pools like the sequences (one pooling mode: one fused kernel a side)
    assert {t.pooling for t in tables} == {PoolingType.MEAN}
    assert {t.pooling for t in embedding_tables(synthetic, TableConfig(seq_pooling="sum"),
                                                8)} == {PoolingType.SUM}
    user_t, item_t = split_tables(synthetic, tables)
    assert {f for t in user_t for f in t.feature_names} == set(synthetic.user_features)
    assert {f for t in item_t for f in t.feature_names} == set(synthetic.item_sparse)


def test_criteo_is_hashed_and_has_no_user_tables(criteo, small_cfg):
    tables = embedding_tables(criteo, TableConfig(hash_size=123), 4)
    assert set(hash_sizes(tables).values()) == {123} and len(tables) == 26
    model = build_model("student", criteo, small_cfg)
    assert model.embeddings.user_ebc is None


def test_shared_table_across_sides(synthetic, batches):
    cfg = TableConfig(shared={"user_history": "ad_id"})
    tables = embedding_tables(synthetic, cfg, 4)
    (shared,) = [t for t in tables if "ad_id" in t.feature_names]
    assert shared.feature_names == ["ad_id", "user_history"] and shared.name == "t_ad_id"
    sizes = hash_sizes(tables)
    assert sizes["user_history"] == sizes["ad_id"] == 40
    assert "user_history" not in hash_sizes(split_tables(synthetic, tables)[0])

    torch.manual_seed(0)
    emb = SparseEmbeddings(synthetic, tables)
    assert emb.user_features[-1] == "user_history"
    plain, dedup = batches(synthetic, sessions=6, seed=3)
    user, item = emb(dedup)
    assert user.shape == (6, len(synthetic.user_features), 4)
    assert item.shape == (dedup.size, len(synthetic.item_sparse), 4)
    # user_history is the mean of its ids' rows of the ad_id table
    w = emb.item_ebc.embedding_bags["t_ad_id"].weight
    hist = dedup.user.to_dict()["user_history"]
    for s in range(6):
        ids = hist.values()[hist.offsets()[s]:hist.offsets()[s + 1]]
        want = w[ids].mean(0) if len(ids) else torch.zeros(4)
        torch.testing.assert_close(user[s, -1], want)
    pu, pi = emb(plain)
    torch.testing.assert_close(pu, dedup.expand_user(user), rtol=0, atol=0)
    torch.testing.assert_close(pi, item, rtol=0, atol=0)


def test_stacked_rows_keep_the_values_per_key_the_loader_counted():
    item = KeyedJaggedTensor(keys=["ad_id", "ad_format"], values=torch.arange(5),
                             lengths=torch.tensor([1, 2, 1, 1]), stride=2,
                             length_per_key=[3, 2])
    user = KeyedJaggedTensor(keys=["user_history"], values=torch.arange(4),
                             lengths=torch.tensor([4]), stride=1, length_per_key=[4])
    stacked = stack_rows(item, user)
    assert stacked.stride() == 3 and stacked.keys() == ["ad_id", "ad_format", "user_history"]
    assert stacked.lengths().tolist() == [1, 2, 0, 1, 1, 0, 0, 0, 4]
    # on the meta device torchrec could only make the counts up: they travel with the KJT
    assert stacked.to(torch.device("meta")).length_per_key() == [3, 2, 4]
    unknown = KeyedJaggedTensor(keys=["ad_id"], values=torch.arange(2),
                                lengths=torch.tensor([1, 1]), stride=2)
    assert stack_rows(unknown, user).length_per_key() == [2, 4]  # counted when asked


def test_lookup_matches_the_weights(synthetic, batches):
    tables = embedding_tables(synthetic, TableConfig(), 4)
    emb = SparseEmbeddings(synthetic, tables)
    _, dedup = batches(synthetic, sessions=4, seed=5)
    user, item = emb(dedup)
    ad = dedup.item.to_dict()["ad_id"]
    w = emb.item_ebc.embedding_bags["t_ad_id"].weight
    for i in range(dedup.size):
        ids = ad.values()[ad.offsets()[i]:ad.offsets()[i + 1]]  # 0 or 1 id (missing: zeros)
        torch.testing.assert_close(item[i, emb.item_features.index("ad_id")], w[ids].sum(0))


@pytest.mark.parametrize("shared", [{"nope": "ad_id"}, {"user_history": "nope"}])
def test_shared_must_name_features(synthetic, shared):
    with pytest.raises(ConfigError, match="model.tables.shared"):
        embedding_tables(synthetic, TableConfig(shared=shared), 4)


def test_meta_tables_leave_dense_init_unchanged(synthetic):
    torch.manual_seed(0)
    cpu = build_model("teacher", synthetic, ModelConfig())
    torch.manual_seed(0)
    meta = build_model("teacher", synthetic, ModelConfig(), device="meta")
    for (name, p), (_, q) in zip(cpu.named_parameters(), meta.named_parameters(), strict=True):
        if name.startswith("embeddings."):
            assert q.is_meta
        else:
            assert torch.equal(p, q), name


@pytest.mark.parametrize("pooling", ["mean", "sum"])
@pytest.mark.parametrize("shared", [{}, {"user_history": "ad_id"}])
def test_shared_histories_pool_like_their_own_lists(synthetic, shared_batches, pooling, shared):
    """A user's history looked up once as segments, then summed per window, gives every
    session exactly its own list's pooled row, and the same gradients."""
    tables = embedding_tables(synthetic, TableConfig(shared=shared, seq_pooling=pooling), 4)
    torch.manual_seed(0)
    emb = SparseEmbeddings(synthetic, tables)
    hist = emb.user_features.index("user_history")
    pairs = shared_batches(hash_sizes(tables))
    assert sum(bw.user["user_history"].values().numel() for bw, _ in pairs) < sum(
        bs.user["user_history"].values().numel() for _, bs in pairs)  # fewer lookups
    for bw, bs in pairs:
        grads = []
        for b in (bw, bs):
            emb.zero_grad()
            user, item = emb(b)
            assert user.shape == (b.num_sessions, len(emb.user_features), 4)
            weight = torch.arange(user.numel(), dtype=user.dtype).view_as(user).cos()
            ((user * weight).sum() + item.sum()).backward()
            grads.append({n: p.grad.clone() for n, p in emb.named_parameters()})
            if b is bw:
                uw, iw = user.detach(), item.detach()
        torch.testing.assert_close(uw, user.detach(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(iw, item.detach(), rtol=0, atol=0)
        assert uw[:, hist].abs().sum() > 0
        for n in grads[0]:
            torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-6)
