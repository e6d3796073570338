"""ExFM's student loss: each part switched off changes the loss exactly as documented."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lrm.config import DistillConfig, ModelConfig, StudentModelConfig
from lrm.data.batch import Batch
from lrm.models import build_model
from lrm.models.exfm import StudentOutputs
from lrm.exfm.distill import ExFMLoss, distill_target, distillation, exfm_loss, \
    student_config
from tests.models.conftest import VOCAB, make_batches

SIZE = StudentModelConfig(embedding_dim=8, bottom_mlp=[16], top_mlp=[32, 16])


@pytest.fixture
def batch() -> Batch:
    from lrm.data.schema import synthetic_schema

    _, b = make_batches(synthetic_schema(VOCAB), sessions=6)
    g = torch.Generator().manual_seed(2)
    return dataclasses.replace(b, teacher_logits=torch.randn(b.size, generator=g) - 2)


def _outputs(n: int, seed: int = 0) -> StudentOutputs:
    g = torch.Generator().manual_seed(seed)
    return StudentOutputs(serving=torch.randn(n, generator=g), aux=torch.randn(n, generator=g),
                          adapter=torch.randn(n, generator=g) - 1)


def _bce(x, y):
    return F.binary_cross_entropy_with_logits(x, y)


def test_labels_only_is_the_serving_bce(batch):
    out = _outputs(batch.size)
    parts = exfm_loss(out, batch, DistillConfig(distill=False))
    expect = _bce(out.serving, batch.labels)
    assert torch.equal(parts.total, expect) and torch.equal(parts.serving, expect)
    assert parts.distill == 0 and parts.adapter == 0
    # labels only needs no teacher at all
    no_teacher = dataclasses.replace(batch, teacher_logits=None)
    assert torch.equal(exfm_loss(out, no_teacher, DistillConfig(distill=False)).total, expect)


def test_adapter_off_distills_toward_the_raw_teacher_logit(batch):
    out = _outputs(batch.size)
    cfg = DistillConfig(adapter=False, weight=2.0)
    assert torch.equal(distill_target(out, batch, cfg), batch.teacher_logits)
    parts = exfm_loss(out, batch, cfg)
    soft = torch.sigmoid(batch.teacher_logits)
    assert torch.allclose(parts.distill, _bce(out.aux, soft))
    assert parts.adapter == 0
    assert torch.allclose(parts.total, _bce(out.serving, batch.labels) + 2.0 * parts.distill)


def test_adapter_on_distills_toward_the_adapters_output_and_trains_it_on_labels(batch):
    out = _outputs(batch.size)
    cfg = DistillConfig(weight=0.5)
    target = distill_target(out, batch, cfg)
    assert torch.equal(target, out.adapter) and not target.requires_grad
    parts = exfm_loss(out, batch, cfg)
    assert torch.allclose(parts.distill, _bce(out.aux, torch.sigmoid(out.adapter)))
    assert torch.allclose(parts.adapter, _bce(out.adapter, batch.labels))
    assert torch.allclose(parts.total, parts.serving + 0.5 * parts.distill + parts.adapter)


def test_aux_head_off_distills_on_the_serving_head(batch):
    out = _outputs(batch.size)
    parts = exfm_loss(out, batch, DistillConfig(aux_head=False, adapter=False))
    assert torch.allclose(parts.distill, _bce(out.serving, torch.sigmoid(batch.teacher_logits)))
    # with the aux head, the serving head's own term is unchanged and the aux one differs
    with_aux = exfm_loss(out, batch, DistillConfig(adapter=False))
    assert torch.equal(with_aux.serving, parts.serving)
    assert not torch.allclose(with_aux.distill, parts.distill)


def test_weight_zero_leaves_labels_and_adapter(batch):
    out = _outputs(batch.size)
    parts = exfm_loss(out, batch, DistillConfig(weight=0.0))
    assert torch.allclose(parts.total, parts.serving + parts.adapter)


def test_missing_parts_and_teacher_are_errors(batch):
    out = _outputs(batch.size)
    with pytest.raises(ValueError, match="teacher_logits"):
        exfm_loss(out, dataclasses.replace(batch, teacher_logits=None),
                  DistillConfig(adapter=False))
    with pytest.raises(ValueError, match="auxiliary head"):
        exfm_loss(dataclasses.replace(out, aux=None), batch, DistillConfig(adapter=False))
    with pytest.raises(ValueError, match="adapter"):
        exfm_loss(dataclasses.replace(out, adapter=None), batch, DistillConfig())


def test_exfm_loss_fn_runs_a_real_student(batch):
    from lrm.data.schema import synthetic_schema

    schema = synthetic_schema(VOCAB)
    for cfg in (DistillConfig(distill=False), DistillConfig(aux_head=False, adapter=False),
                DistillConfig(adapter=False), DistillConfig()):
        torch.manual_seed(0)
        model = build_model("student", schema, ModelConfig(student=student_config(SIZE, cfg)))
        fn = ExFMLoss(cfg)
        loss, log_loss = fn(model, batch)
        assert torch.isfinite(loss) and fn.last is not None
        assert torch.allclose(log_loss, _bce(model(batch), batch.labels))
        loss.backward()
    plain = build_model("student", schema, ModelConfig(student=SIZE))
    with pytest.raises(TypeError, match="ExFM student"):
        ExFMLoss(DistillConfig())(plain, batch)


def test_config_validation():
    from lrm.errors import ConfigError

    with pytest.raises(ConfigError, match="weight"):
        DistillConfig(weight=-1.0)
    off = DistillConfig(distill=False)  # labels only: no part is built or trained
    assert not off.aux_head and not off.adapter


def test_a_variant_grows_its_parts_on_the_labels_only_model(datasets, student_dir, tmp_path):
    """A variant's job goes on from the labels-only model (lrm.exfm.students): the weights it
    shares carried over, only its auxiliary head and adapter fresh. Plant: growth=None in
    `distillation` (refused), or no GROWN prefixes (its fresh parts refused)."""
    from lrm.errors import ConfigError
    from lrm.exfm.augment import augment_dataset
    from lrm.models.saved import load_model, read_card
    from lrm.train import build_job, train
    from tests.conftest import LOADER, tiny_train
    from tests.exfm.conftest import random_teacher

    aug = tmp_path / "aug"
    augment_dataset(random_teacher(datasets["sessions"], tmp_path / "fm"), datasets["sessions"],
                    aug, batch_size=1024)
    labels = read_card(student_dir).model
    d = distillation(labels, DistillConfig())
    assert d.model.student.aux_head and d.model.student.adapter
    assert d.teacher_column == "teacher_logit" and isinstance(d.loss, ExFMLoss)
    still = dict(lr=1e-12, embedding_lr=1e-12)  # the shared weights must come over as they are
    job = build_job("student", train=tiny_train(steps=2, **still), model=d.model, data=aug,
                    loader=LOADER, start="warm", init_from=student_dir, loss=d.loss,
                    teacher_column=d.teacher_column, growth=d.growth, out=tmp_path / "grown")
    train(job)
    before, _ = load_model(student_dir)
    after, card = load_model(tmp_path / "grown")
    assert card.model == d.model
    grown = {k for k in after.state_dict() if k not in before.state_dict()}
    assert grown and all(k.startswith(("aux_head.", "adapter.")) for k in grown)
    for k, v in before.state_dict().items():
        torch.testing.assert_close(after.state_dict()[k], v, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="another config"):  # no growth: another model
        train(job.but(growth=None, out=tmp_path / "refused"))
    with pytest.raises(ConfigError, match="do not fit"):  # grown parts not named fresh
        train(job.but(growth=dataclasses.replace(d.growth, prefixes=()),
                      out=tmp_path / "refused"))
    plain = distillation(labels, DistillConfig(distill=False))  # labels only: nothing grows
    assert plain.model == labels and plain.teacher_column is None
