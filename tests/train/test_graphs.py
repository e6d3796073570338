"""CUDA graphs of the dense MLPs: which modules are graphed, and (on a GPU) that a graphed
step computes what the eager step computes, falling back to eager wherever the capture does
not apply."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import dataclasses

from lrm.config import ModelConfig
from lrm.data.schema import read_schema
from lrm.fp8.linear import to_fp8
from lrm.models import build_model
from lrm.train.graphs import graph_mlps, graphable
from tests.train.conftest import SMALL_MODEL, tiny_train

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA graphs)")


def test_plain_mlps_are_graphable_and_layer_stacks_or_fp8_layers_are_not(datasets):
    schema, _ = read_schema(datasets["sessions"])
    student = build_model("student", schema, SMALL_MODEL, device="meta")
    assert graphable(student) == ["bottom", "top"]
    teacher = build_model("teacher", schema, SMALL_MODEL, device="meta")
    assert graphable(teacher) == ["dense", "top"]  # not Wukong's `layers`
    exfm = build_model("student", schema, ModelConfig(student=dataclasses.replace(
        SMALL_MODEL.student, aux_head=True, aux_mlp=[8])), device="meta")
    assert "aux_head" in graphable(exfm)
    # an FP8-dispatched layer (an nn.Linear subclass) keeps its MLP eager
    student.top[0] = to_fp8(nn.Linear(student.top[0].in_features, student.top[0].out_features),
                            backend="scaled_mm", compile=False)
    assert graphable(student) == ["bottom"]
    # on a CPU nothing is captured and every forward stays the module's own
    before = {n: "forward" in vars(getattr(student, n)) for n in ("bottom", "top")}
    assert graph_mlps(student, 64, torch.device("cpu"), amp=True) == []
    assert {n: "forward" in vars(getattr(student, n)) for n in ("bottom", "top")} == before


def _mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU()).cuda()


@GPU
@pytest.mark.parametrize("amp", [True, False])
def test_a_graphed_mlp_trains_as_the_eager_one_and_falls_back_off_its_capture(amp):
    """Forward, input gradient and weight gradients equal the eager module's, on new inputs
    every call (the graph copies them in), for an input that needs a gradient (the top MLP)
    and one that does not (the bottom); another batch size, eval mode and no_grad run eager."""
    dev = torch.device("cuda")
    eager, graphed = _mlp(0), _mlp(0)
    root = nn.Module()
    root.top = graphed
    assert graph_mlps(root, 16, dev, amp) == ["top"]
    ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else \
        (lambda: torch.autocast("cuda", enabled=False))
    for step, (rows, grad_in) in enumerate([(16, True), (16, False), (16, True), (8, True)]):
        x = torch.randn(rows, 24, device=dev, dtype=torch.bfloat16 if amp and step == 2
                        else torch.float32)
        outs, grads = [], []
        for m in (eager, graphed):
            m.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(grad_in)
            with ctx():
                y = m(xi)
            (y.float() * torch.arange(y.shape[1], device=dev)).sum().backward()
            outs.append(y)
            grads.append([xi.grad] + [p.grad for p in m.parameters()])
        # the same kernels: equal up to cuBLAS's choice of algorithm inside a capture,
        # far closer than bf16's rounding (a capture without autocast misses by ~4e-3)
        same = dict(rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(outs[1], outs[0], **same)
        for a, b in zip(*grads, strict=True):
            assert (a is None) == (b is None), step
            if a is not None:
                torch.testing.assert_close(b, a, **same)
    assert graphed.forward.replays == 3  # the batch of 8 ran eager
    with torch.no_grad(), ctx():
        x16 = torch.randn(16, 24, device=dev)
        torch.testing.assert_close(graphed(x16), eager(x16))
        graphed.eval(), eager.eval()
    with ctx():
        torch.testing.assert_close(graphed(x16), eager(x16))
    assert graphed.forward.replays == 3


@GPU
def test_training_on_a_gpu_with_graphs_matches_training_without(datasets, tmp_path, caplog):
    from lrm.train import train

    runs = {}
    for graphs in (True, False):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lrm"):
            runs[graphs] = train("student", tiny_train(steps=12, device="cuda",
                                                       cuda_graphs=graphs),
                                 SMALL_MODEL, datasets["sessions"], out=tmp_path / str(graphs))
        assert ("CUDA graphs of ['bottom', 'top']" in caplog.text) == graphs
    # the tables' backward on a GPU is not deterministic: close, not equal
    assert runs[True].eval["ne"] == pytest.approx(runs[False].eval["ne"], abs=2e-3)
