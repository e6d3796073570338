"""Both models: dedup == plain, gradients reach every parameter, Criteo, sizes, determinism."""

from __future__ import annotations

import pytest
import torch

from lrm.config import ModelConfig, TableConfig, TeacherModelConfig
from lrm.models import DLRMStudent, Wukong, build_model, hash_sizes, num_parameters

KINDS = ["teacher", "student"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shared", [{}, {"user_history": "ad_id"}])
def test_dedup_equals_plain(kind, shared, synthetic, batches):
    torch.manual_seed(0)
    model = build_model(kind, synthetic, ModelConfig(tables=TableConfig(shared=shared)))
    plain, dedup = batches(synthetic, sessions=7, seed=1)
    assert dedup.num_sessions == 7 < dedup.size
    out = model(dedup)
    assert out.shape == (dedup.size,) and out.dtype == torch.float32
    torch.testing.assert_close(out, model(plain), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_shared_histories_score_like_the_session_form(kind, synthetic, shared_batches):
    torch.manual_seed(0)
    model = build_model(kind, synthetic, ModelConfig())
    for bw, bs in shared_batches(hash_sizes(model.embeddings.user_ebc.embedding_bag_configs()
                                            + model.embeddings.item_ebc.embedding_bag_configs())):
        torch.testing.assert_close(model(bw), model(bs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_every_parameter(kind, synthetic, batches):
    torch.manual_seed(0)
    model = build_model(kind, synthetic, ModelConfig())
    _, dedup = batches(synthetic, sessions=8, seed=2)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dedup), dedup.labels)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", KINDS)
def test_criteo_without_user_features(kind, criteo, small_cfg, batches):
    torch.manual_seed(0)
    model = build_model(kind, criteo, small_cfg)
    plain, _ = batches(criteo, sessions=6, seed=4)
    assert not plain.user.keys()
    out = model(plain)
    assert out.shape == (plain.size,) and torch.isfinite(out).all()
    out.sum().backward()


def test_teacher_is_bigger(synthetic, criteo):
    for schema in (synthetic, criteo):
        teacher = build_model("teacher", schema, ModelConfig())
        student = build_model("student", schema, ModelConfig())
        assert isinstance(teacher, Wukong) and isinstance(student, DLRMStudent)
        assert num_parameters(teacher) > 1.8 * num_parameters(student)
        assert num_parameters(teacher, embeddings=False) > 5 * num_parameters(
            student, embeddings=False)


@pytest.mark.parametrize("kind", KINDS)
def test_init_is_deterministic(kind, synthetic):
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        states.append(build_model(kind, synthetic, ModelConfig()).state_dict())
    for k, v in states[0].items():
        assert torch.equal(v, states[1][k]), k


@pytest.mark.parametrize("kind", KINDS)
def test_features_and_head(kind, synthetic, batches):
    model = build_model(kind, synthetic, ModelConfig())
    _, dedup = batches(synthetic, seed=6)
    h = model.forward_features(dedup)
    assert h.shape == (dedup.size, model.feature_dim)
    torch.testing.assert_close(model.head(h).squeeze(-1), model(dedup))


def test_full_fm_and_no_lcb(synthetic, batches):
    cfg = ModelConfig(teacher=TeacherModelConfig(fm_rank=0, lcb_embeddings=0, layers=2))
    model = build_model("teacher", synthetic, cfg)
    plain, dedup = batches(synthetic, seed=7)
    torch.testing.assert_close(model(dedup), model(plain), rtol=0, atol=1e-6)


def test_unknown_kind(synthetic):
    with pytest.raises(ValueError, match="unknown model kind"):
        build_model("giant", synthetic, ModelConfig())
