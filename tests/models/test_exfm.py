"""ExFM's student parts: the auxiliary head's gradient stays off the serving head, the
adapter starts as the identity, and the ExFM student is the plain student plus two parts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lrm.config import DistillConfig, ModelConfig, StudentModelConfig
from lrm.models import DLRMStudent, build_model
from lrm.models.exfm import ExFMStudent, StudentAdapter, StudentOutputs
from lrm.exfm.distill import exfm_loss, student_config


def _cfg(**parts: bool) -> ModelConfig:
    size = StudentModelConfig(embedding_dim=8, bottom_mlp=[16], top_mlp=[32, 16])
    return ModelConfig(student=dataclasses.replace(size, **parts))


def _with_teacher(batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    return dataclasses.replace(batch, teacher_logits=torch.randn(batch.size, generator=g) - 3)


def _build(schema, **parts: bool):
    torch.manual_seed(0)
    return build_model("student", schema, _cfg(**parts))


def test_build_model_adds_parts_and_keeps_the_plain_students_weights(synthetic):
    plain = _build(synthetic)
    full = _build(synthetic, aux_head=True, adapter=True)
    assert type(plain) is DLRMStudent and isinstance(full, ExFMStudent)
    ps, fs = plain.state_dict(), full.state_dict()
    extra = set(fs) - set(ps)
    assert extra and all(k.startswith(("aux_head.", "adapter.")) for k in extra)
    assert set(ps) <= set(fs)
    for k, v in ps.items():  # same names, same initialization under one seed
        assert torch.equal(v, fs[k]), k
    assert _build(synthetic, adapter=True).aux_head is None
    assert _build(synthetic, aux_head=True).adapter is None


def test_forward_is_the_serving_head_and_all_heads_gives_every_output(synthetic, batches):
    _, batch = batches(synthetic)
    batch = _with_teacher(batch)
    model = _build(synthetic, aux_head=True, adapter=True)
    out = model(batch, all_heads=True)
    assert isinstance(out, StudentOutputs)
    assert torch.equal(model(batch), out.serving)
    assert out.aux.shape == out.adapter.shape == (batch.size,)
    # the adapter starts as the identity on the teacher's logit
    assert torch.equal(out.adapter, batch.teacher_logits)
    with pytest.raises(ValueError, match="teacher_logits"):
        model(dataclasses.replace(batch, teacher_logits=None), all_heads=True)


def _grads(loss, params):
    return torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)


def test_aux_head_gradient_reaches_the_trunk_but_not_the_serving_head(synthetic, batches):
    _, batch = batches(synthetic)
    batch = _with_teacher(batch)
    model = _build(synthetic, aux_head=True, adapter=True)
    parts = exfm_loss(model(batch, all_heads=True), batch, DistillConfig())
    head = list(model.head.parameters())
    trunk = list(model.top.parameters()) + list(model.bottom.parameters())
    aux = list(model.aux_head.parameters())
    adapter = list(model.adapter.parameters())
    tables = [p for n, p in model.named_parameters() if n.startswith("embeddings.")]

    g = _grads(parts.distill, head + trunk + aux + adapter + tables)
    g_head, rest = g[:len(head)], g[len(head):]
    assert all(x is None for x in g_head)  # not even part of the graph
    g_trunk = rest[:len(trunk)]
    assert all(x is not None and x.abs().sum() > 0 for x in g_trunk)  # flows into the trunk
    g_aux = rest[len(trunk):len(trunk) + len(aux)]
    assert all(x is not None and x.abs().sum() > 0 for x in g_aux)
    g_adapter = rest[len(trunk) + len(aux):len(trunk) + len(aux) + len(adapter)]
    assert all(x is None for x in g_adapter)  # the target is detached
    g_tables = rest[len(trunk) + len(aux) + len(adapter):]
    assert any(x is not None and x.abs().sum() > 0 for x in g_tables)

    # the serving loss does not train the auxiliary head or the adapter
    assert all(x is None for x in _grads(parts.serving, aux + adapter))
    # the adapter learns from the labels only
    assert all(x is None for x in _grads(parts.adapter, head + trunk + aux))
    assert all(x is not None for x in _grads(parts.adapter, adapter))
    # and the total's gradient on the serving head is the serving loss's alone
    for a, b in zip(_grads(parts.total, head), _grads(parts.serving, head), strict=True):
        assert torch.allclose(a, b)


def test_without_aux_head_distillation_pulls_the_serving_head(synthetic, batches):
    _, batch = batches(synthetic)
    batch = _with_teacher(batch)
    cfg = DistillConfig(aux_head=False, adapter=False)
    model = build_model("student", synthetic, _cfg(**dict(
        aux_head=False, adapter=False)))
    # a plain DLRM has no all_heads: distillation on the serving head needs no extra part
    out = StudentOutputs(serving=model(batch), aux=None, adapter=None)
    parts = exfm_loss(out, batch, cfg)
    g = _grads(parts.distill, list(model.head.parameters()))
    assert all(x is not None and x.abs().sum() > 0 for x in g)


def test_student_config_follows_the_variant():
    size = StudentModelConfig(embedding_dim=4, top_mlp=[8])
    assert not student_config(size, DistillConfig(distill=False)).aux_head
    assert not student_config(size, DistillConfig(distill=False)).adapter
    full = student_config(size, DistillConfig())
    assert full.aux_head and full.adapter and full.embedding_dim == 4 and full.top_mlp == [8]
    only_aux = student_config(size, DistillConfig(adapter=False))
    assert only_aux.aux_head and not only_aux.adapter


def test_adapter_is_residual_and_learns_a_correction():
    torch.manual_seed(0)
    a = StudentAdapter(n_context=3, hidden=[8])
    t, x = torch.randn(64) - 3, torch.randn(64, 3)
    assert torch.equal(a(t, x), t)
    y = (torch.rand(64) < 0.5).float()  # labels far from the teacher: the adapter moves
    opt = torch.optim.Adam(a.parameters(), lr=0.05)
    for _ in range(50):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(a(t, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.allclose(a(t, x), t)
