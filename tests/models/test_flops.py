"""lrm.models.flops: forward FLOPs per impression, against counts by hand."""

from __future__ import annotations

import pytest
import torch

from lrm.config import ModelConfig, StudentModelConfig, TeacherModelConfig
from lrm.models import build_model
from lrm.models.flops import flops_per_example


def mlp_macs(n_in: int, widths: list[int]) -> int:
    macs = 0
    for w in widths:
        macs, n_in = macs + n_in * w, w
    return macs


def student_macs(schema, cfg: StudentModelConfig) -> int:
    """The DLRM student as it runs: bottom MLP, the two interaction products (user x user
    per session, the rest x everything per impression), top MLP, head."""
    d, n_user = cfg.embedding_dim, len(schema.user_features)
    n_rest = len(schema.item_sparse) + 1  # the items and the bottom MLP's output
    n = n_user + n_rest
    pairs = n * (n - 1) // 2
    return (mlp_macs(len(schema.dense), cfg.bottom_mlp + [d]) + n_user * d * n_user
            + n_rest * d * n + mlp_macs(pairs + d, cfg.top_mlp) + cfg.top_mlp[-1])


def teacher_macs(schema, cfg: TeacherModelConfig) -> int:
    """Wukong: the dense MLP, then per layer the FM block (X (Xᵀ Y) or X Xᵀ, its MLP), the
    linear compress and the residual map, then the top MLP and the head."""
    d, k = cfg.embedding_dim, cfg.fm_rank
    n = len(schema.sparse_features) + cfg.dense_embeddings
    macs = mlp_macs(len(schema.dense), cfg.dense_mlp + [cfg.dense_embeddings * d])
    for _ in range(cfg.layers):
        n_out = cfg.fm_embeddings + cfg.lcb_embeddings
        macs += (d * n * k + n * d * k) if k else n * d * n
        macs += mlp_macs(n * (k or n), cfg.fm_mlp + [cfg.fm_embeddings * d])
        macs += d * n * cfg.lcb_embeddings + (d * n * n_out if n != n_out else 0)
        n = n_out
    return macs + mlp_macs(n * d, cfg.top_mlp) + cfg.top_mlp[-1]


@pytest.mark.parametrize("cfg", [StudentModelConfig(),
                                 StudentModelConfig(embedding_dim=8, bottom_mlp=[32, 16],
                                                    top_mlp=[64, 32])])
def test_student_flops_are_its_multiply_adds_twice(synthetic, cfg):
    model = build_model("student", synthetic, ModelConfig(student=cfg))
    assert flops_per_example(model, synthetic) == 2 * student_macs(synthetic, cfg)


@pytest.mark.parametrize("cfg", [TeacherModelConfig(), TeacherModelConfig(fm_rank=0),
                                 TeacherModelConfig(layers=2, fm_embeddings=8,
                                                    lcb_embeddings=5, fm_rank=4,
                                                    embedding_dim=16)])
def test_teacher_flops_are_its_multiply_adds_twice(synthetic, cfg):
    model = build_model("teacher", synthetic, ModelConfig(teacher=cfg))
    assert flops_per_example(model, synthetic) == 2 * teacher_macs(synthetic, cfg)


def test_flops_are_per_impression_and_leave_the_model_as_it_was(synthetic):
    torch.manual_seed(0)
    model = build_model("teacher", synthetic, ModelConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert flops_per_example(model, synthetic, size=3) == flops_per_example(model, synthetic,
                                                                            size=11)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
