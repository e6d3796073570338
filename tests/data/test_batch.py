"""Batch on real loader output: RecD form vs plain form through torchrec's modules, and
the moves (to, pin_memory, record_stream) carrying every field."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pyarrow.parquet as pq
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lrm.config import DedupConfig
from lrm.data import dedup
from lrm.data.batch import Batch, Windows
from lrm.data.loader import BatchLoader
from lrm.data.schema import criteo_schema, part_path, synthetic_schema
from tests.data.test_dedup import make_impressions

SIZE = 13  # every feature hashed into a table of SIZE rows


def _write(root, schema, n_sessions=60, layout="impressions"):
    """A one-day dataset; `sessions`: deduplicated (a user's histories shared)."""
    t = make_impressions(n_sessions, seed=3, schema=schema, users=6)
    path = part_path(root / "raw", 0)
    path.parent.mkdir(parents=True)
    pq.write_table(t, path)
    if layout == "sessions":
        dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return root / ("raw" if layout == "impressions" else "sessions")


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


@pytest.mark.parametrize("layout", ["impressions", "sessions"])
@pytest.mark.parametrize("schema", [synthetic_schema(), criteo_schema()], ids=["synthetic",
                                                                               "criteo"])
def test_variable_batch_kjt_pools_like_the_plain_batch(tmp_path, schema, layout):
    root = _write(tmp_path / "d", schema, layout=layout)
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
        assert bd.windows is None  # from the impressions layout: the session form
        pooled = ebc(bd.user).values()  # [U, dims]: one lookup per session
        assert pooled.shape[0] == bd.num_sessions <= bd.size
        torch.testing.assert_close(bd.expand_user(pooled), ebc(bp.user).values(), rtol=0,
                                   atol=1e-6)
        assert bp.expand_user(pooled) is pooled  # the plain form needs no expansion


def test_session_form_gives_every_session_its_own_history(tmp_path):
    """The windows form (a user's history as shared segments) turned back into one list
    per session is the loader's session form, batch by batch; so is torchrec's view."""
    root = _write(tmp_path / "d", synthetic_schema(), layout="sessions")
    hs = dict.fromkeys(synthetic_schema().sparse_features, SIZE)
    shared = list(BatchLoader(root, 32, hash_sizes=hs, windows=True))
    own = list(BatchLoader(root, 32, hash_sizes=hs, windows=False))
    ebc = _ebc(synthetic_schema().sparse_features)
    for bw, bs in zip(shared, own, strict=True):
        assert bw.windows is not None and bs.windows is None
        assert bs.session_form() is bs
        sf = bw.session_form()
        assert sf.windows is None and sf.num_sessions == bw.num_sessions == bs.num_sessions
        assert sf.user.keys() == bs.user.keys() and sf.user.stride() == bs.user.stride()
        assert torch.equal(sf.user.lengths(), bs.user.lengths().to(sf.user.lengths().dtype))
        assert torch.equal(sf.user.values(), bs.user.values())
        torch.testing.assert_close(ebc(bw.variable_batch_kjt()).values(),
                                   ebc(bs.variable_batch_kjt()).values(), rtol=0, atol=0)


def _full_batch(tmp_path) -> Batch:
    """A RecD batch from the loader with every optional field set (teacher_logits too)."""
    root = _write(tmp_path / "d", synthetic_schema(), layout="sessions")
    b = next(iter(BatchLoader(root, 16, windows=True)))
    b = dataclasses.replace(b, teacher_logits=torch.linspace(-2, 2, b.size))
    assert all(getattr(b, f.name) is not None for f in dataclasses.fields(Batch))
    return b


def _tensors(value) -> list[torch.Tensor]:
    """The tensors a Batch field holds (a KJT: its values and lengths)."""
    if isinstance(value, KeyedJaggedTensor):
        return [value.values(), value.lengths()]
    if isinstance(value, Windows):
        return list(value.tensors())
    return [value]


def test_batch_to_keeps_everything(tmp_path):
    b = _full_batch(tmp_path)
    c = b.to(torch.device("cpu"))
    assert c.size == b.size == 16 and c.deduped and c.num_sessions == b.num_sessions
    for f in dataclasses.fields(Batch):
        for x, y in zip(_tensors(getattr(b, f.name)), _tensors(getattr(c, f.name)),
                        strict=True):
            assert torch.equal(x, y), f.name


def test_batch_to_moves_every_field(tmp_path):
    """`meta` is a device every machine has: a field left behind stays on cpu."""
    b = _full_batch(tmp_path)
    m = b.to(torch.device("meta"))
    for f in dataclasses.fields(Batch):
        src, dst = getattr(b, f.name), getattr(m, f.name)
        assert dst is not None, f"{f.name} dropped"
        for x, y in zip(_tensors(src), _tensors(dst), strict=True):
            assert y.device.type == "meta", f"{f.name} not moved"
            assert (y.shape, y.dtype) == (x.shape, x.dtype), f.name
        if isinstance(src, KeyedJaggedTensor):
            assert (dst.keys(), dst.stride()) == (src.keys(), src.stride()), f.name
        if isinstance(src, Windows):
            assert (dst.sessions, dst.keys) == (src.sessions, src.keys)


def test_record_stream_records_every_tensor(tmp_path):
    b = _full_batch(tmp_path)
    stream = object()
    seen: dict[int, object] = {}
    with mock.patch.object(torch.Tensor, "record_stream",
                           lambda self, s: seen.__setitem__(id(self), s)):
        b.record_stream(stream)  # type: ignore[arg-type]
    for f in dataclasses.fields(Batch):
        for t in _tensors(getattr(b, f.name)):
            assert seen.get(id(t)) is stream, f"{f.name} not recorded on the stream"


def test_pin_memory_pins_every_tensor(tmp_path):
    """Pinning needs an accelerator: a stand-in pin_memory returns marked copies."""
    b = _full_batch(tmp_path)
    pinned: list[torch.Tensor] = []

    def pin(self: torch.Tensor) -> torch.Tensor:
        pinned.append(self.clone())
        return pinned[-1]

    with mock.patch.object(torch.Tensor, "pin_memory", pin):
        p = b.pin_memory()
    for f in dataclasses.fields(Batch):
        for x, y in zip(_tensors(getattr(b, f.name)), _tensors(getattr(p, f.name)),
                        strict=True):
            assert any(y is t for t in pinned), f"{f.name} not pinned"
            assert torch.equal(x, y), f.name
