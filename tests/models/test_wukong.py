"""lrm.models.wukong: what a layer's LayerNorm normalizes (model.teacher.norm)."""

from __future__ import annotations

import pytest
import torch

from lrm.config import ModelConfig, TeacherModelConfig
from lrm.errors import ConfigError
from lrm.models import build_model


def layer_outputs(model, batch) -> list[torch.Tensor]:
    """Each Wukong layer's output [B, n, d] on `batch`."""
    out: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda m, i, o: out.append(o.detach()))
             for layer in model.layers]
    with torch.no_grad():
        model(batch)
    for h in hooks:
        h.remove()
    return out


@pytest.mark.parametrize("norm", ["embedding", "layer", "none"])
def test_norm_is_over_each_embedding_the_layer_or_nothing(norm, synthetic, batches):
    torch.manual_seed(0)
    model = build_model("teacher", synthetic, ModelConfig(teacher=TeacherModelConfig(
        norm=norm, layers=2)))
    for table in model.embeddings.parameters():  # rows of order one: far above the norm's eps
        table.data.normal_()
    _, dedup = batches(synthetic, sessions=6, seed=3)
    for x in layer_outputs(model, dedup):  # gamma 1 and beta 0 at init: the bare statistics
        per_embedding = x.var(-1, unbiased=False), x.mean(-1)
        per_layer = x.flatten(1).var(-1, unbiased=False), x.flatten(1).mean(-1)
        unit = [torch.allclose(v, torch.ones_like(v), atol=0.01)
                and torch.allclose(m, torch.zeros_like(m), atol=1e-4)
                for v, m in (per_embedding, per_layer)]
        assert unit == {"embedding": [True, True], "layer": [False, True],
                        "none": [False, False]}[norm], norm
    out = model(dedup)
    assert out.shape == (dedup.size,) and torch.isfinite(out).all()


def test_an_unknown_norm_names_the_key():
    with pytest.raises(ConfigError, match="norm: must be one of"):
        TeacherModelConfig(norm="batch")
