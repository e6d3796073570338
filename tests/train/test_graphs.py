"""CUDA graphs of the dense MLPs: which modules are graphed, and (on a GPU) that a graphed
step computes what the eager step computes, for every model the stages train, falling back to
eager wherever the capture does not apply. The GPU tests (skipped without a GPU) ran on an
H100, and each went red there with a bug planted: the comparisons with the capture made
without autocast (and the fallback one with the shape check dropped), the training run with
the loop's call of graph_mlps taken out."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch import nn

from lrm.config import DistillConfig, ModelConfig
from lrm.data.schema import read_schema, synthetic_schema
from lrm.exfm.distill import ExFMLoss, student_config
from lrm.fp8.linear import to_fp8
from lrm.models import build_model
from lrm.models.precision import autocast
from lrm.train import TrainJob, train
from lrm.train.graphs import graph_mlps, graphable
from lrm.train.job import bce_loss
from tests.models.conftest import VOCAB, make_batches
from tests.conftest import SMALL_MODEL, tiny_train

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
    runs = {}
    for graphs in (True, False):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lrm"):
            cfg = tiny_train(steps=12, device="cuda", cuda_graphs=graphs)
            runs[graphs] = train(TrainJob(kind="student", train=cfg, model=SMALL_MODEL,
                                          data=datasets["sessions"], out=tmp_path / str(graphs)))
        assert ("CUDA graphs of ['bottom', 'top']" in caplog.text) == graphs
    # the tables' backward on a GPU is not deterministic: close, not equal
    assert runs[True].eval["ne"] == pytest.approx(runs[False].eval["ne"], abs=2e-3)


@GPU
@pytest.mark.parametrize("kind", ["teacher", "exfm_student"])
def test_every_model_the_stages_train_steps_the_same_with_graphs(kind):
    """The teacher (its `dense` and `top` MLPs) and an ExFM student under its distillation
    loss (aux head included) take the same steps with their MLPs graphed as without."""
    dev = torch.device("cuda")
    schema = synthetic_schema(VOCAB)
    _, b = make_batches(schema, sessions=40)
    g = torch.Generator().manual_seed(2)
    b = dataclasses.replace(b, teacher_logits=torch.randn(b.size, generator=g) - 2).to(dev)
    if kind == "teacher":
        cfg, name, loss_fn = SMALL_MODEL, "teacher", bce_loss
    else:
        dc = DistillConfig()
        cfg = ModelConfig(student=student_config(SMALL_MODEL.student, dc))
        name, loss_fn = "student", ExFMLoss(dc)
    models = []
    for graphs in (False, True):
        torch.manual_seed(0)
        m = build_model(name, schema, cfg, device=dev, dense_device=dev)
        names = graph_mlps(m, b.size, dev, amp=True) if graphs else []
        models.append(m)
    assert names == graphable(models[1]) and names
    for step in range(3):
        losses, grads = [], []
        for m in models:
            m.zero_grad(set_to_none=True)
            with autocast(dev, True):
                loss, _ = loss_fn(m, b)
            loss.backward()
            losses.append(loss.detach())
            grads.append({k: p.grad for k, p in m.named_parameters() if p.grad is not None})
            with torch.no_grad():  # a step of plain SGD: the next step sees new weights
                for p in m.parameters():
                    if p.grad is not None:
                        p.sub_(0.1 * p.grad)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-3, atol=1e-4)
        assert grads[0].keys() == grads[1].keys()
        for k in grads[0]:
            torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-3, atol=1e-4,
                                       msg=lambda m, k=k: f"step {step}, {k}: {m}")
    assert all(getattr(models[1], n).forward.replays > 0 for n in names)
