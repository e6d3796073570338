"""The output bias starts at the logit of the training CTR: a fresh model predicts the base
rate on average instead of 0.5."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lrm.config import ModelConfig
from lrm.metrics import calibration, normalized_entropy
from lrm.models import build_model


def test_a_fresh_model_starts_near_the_base_rate(synthetic, batches):
    _, b = batches(synthetic, sessions=200)
    labels = torch.zeros_like(b.labels)
    labels[::25] = 1.0  # a CTR of 4%
    b = dataclasses.replace(b, labels=labels)
    ctr = float(labels.mean())
    for kind in ("student", "teacher"):
        torch.manual_seed(0)
        model = build_model(kind, synthetic, ModelConfig())
        with torch.no_grad():
            before = model(b)
            model.init_output_bias(ctr)
            after = model(b)
        assert float(model.head.bias) == pytest.approx(math.log(ctr / (1 - ctr)), rel=1e-6)
        # at p ~ 0.5 a CTR of a few percent costs an NE of several; at the base rate ~1
        assert normalized_entropy(before, b.labels) > 3
        assert normalized_entropy(after, b.labels) < 1.05, kind
        assert 0.8 < calibration(after, b.labels) < 1.25, kind
    model.init_output_bias(0.0)  # a day without a click: finite, not -inf
    assert math.isfinite(float(model.head.bias))


def test_the_exfm_auxiliary_head_starts_at_the_base_rate_too(synthetic, batches):
    """It predicts a click probability as well (the teacher's); left at p = 0.5, its first
    distillation gradients pulled the shared trunk off (the serving head then stayed at the
    base rate on the default synthetic day)."""
    from lrm.config import DistillConfig, StudentModelConfig
    from lrm.exfm.distill import student_config

    _, b = batches(synthetic, sessions=200)
    labels = torch.zeros_like(b.labels)
    labels[::25] = 1.0
    b = dataclasses.replace(b, labels=labels)
    cfg = student_config(StudentModelConfig(aux_mlp=[8]), DistillConfig(adapter=False))
    torch.manual_seed(0)
    model = build_model("student", synthetic, ModelConfig(student=cfg))
    with torch.no_grad():
        model.init_output_bias(float(labels.mean()))
        out = model(b, all_heads=True)
    for head in (out.serving, out.aux):
        assert normalized_entropy(head, b.labels) < 1.05
