"""Model mods: the padded interaction equals the unpadded one; the LayerNorm -> FP8 fusion and
the bf16 residual keep the state dict and stay within the error of the precision they use."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lrm.config import FP8Config, ModelConfig, TeacherModelConfig
from lrm.errors import ConfigError
from lrm.fp8 import dispatch as D
from lrm.fp8 import report as R
from lrm.fp8.formats import RECIPES
from lrm.fp8.linear import Fp8Linear, Quantized
from lrm.fp8.mods import apply_mods, bf16_residual, fuse_norm
from lrm.fp8.norm import QuantizedLayerNorm, StreamLayerNorm
from lrm.fp8.probe import Probe, error_metrics
from lrm.models import build_model
from lrm.models.dlrm import DotInteraction
from lrm.models.matmul import BatchedMatmul
from tests.conftest import SMALL_MODEL
from tests.fp8.conftest import a_batch


def test_batched_matmul_padding_is_the_same_product(monkeypatch):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 65, 13, generator=g), torch.randn(3, 13, 65, generator=g)
    shapes, matmul = [], torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda x, y: shapes.append((x.shape, y.shape)) or
                        matmul(x, y))
    padded = BatchedMatmul(pad=8)(a, b)
    assert shapes == [((3, 72, 16), (3, 16, 72))]  # 65 -> 72, 13 -> 16: the kernel's sizes
    monkeypatch.setattr(torch, "matmul", matmul)
    assert padded.shape == (3, 65, 65)
    torch.testing.assert_close(padded, torch.matmul(a, b), rtol=0, atol=1e-5)
    w = torch.randn(13, 5, generator=g)  # a shared 2-D right operand
    torch.testing.assert_close(BatchedMatmul(16)(a, w), a @ w, rtol=0, atol=1e-5)


def test_padded_interaction_equals_the_plain_one():
    g = torch.Generator().manual_seed(1)
    U, B, d = 4, 9, 6
    inverse = torch.randint(0, U, (B,), generator=g)
    user, rest = torch.randn(U, 7, d, generator=g), torch.randn(B, 5, d, generator=g)
    want = DotInteraction.plain(torch.cat([user[inverse], rest], 1))
    out = DotInteraction(7, 5, pad=8)(user, rest, lambda t: t.index_select(0, inverse))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)


def test_a_padded_student_is_the_same_model(datasets):
    from lrm.data.schema import read_schema

    schema, _ = read_schema(datasets["sessions"])
    cfg = dataclasses.replace(SMALL_MODEL, student=dataclasses.replace(
        SMALL_MODEL.student, interaction_pad=8))
    torch.manual_seed(0)
    plain = build_model("student", schema, SMALL_MODEL)
    torch.manual_seed(0)
    padded = build_model("student", schema, cfg)
    assert padded.interaction.dot_rest.pad == 8 and plain.interaction.dot_rest.pad == 1
    sd, psd = plain.state_dict(), padded.state_dict()
    assert list(sd) == list(psd) and all(torch.equal(sd[k], psd[k]) for k in sd)
    padded.load_state_dict(sd, strict=True)  # saved folders load either way
    batch = a_batch(datasets["sessions"], plain)
    with torch.no_grad():
        torch.testing.assert_close(padded(batch), plain(batch), rtol=0, atol=1e-5)



# -- the LayerNorm -> FP8 fusion and the bf16 residual (lrm.fp8.mods) -------------------------

TEACHER = ModelConfig(teacher=TeacherModelConfig(
    embedding_dim=16, dense_embeddings=2, dense_mlp=[16], layers=2, fm_embeddings=4,
    lcb_embeddings=4, fm_rank=4, fm_mlp=[32], top_mlp=[32, 16]))


@pytest.fixture(scope="module")
def teacher_and_batch(datasets):
    """A small Wukong teacher with trained-looking norms (γ, β away from 1, 0), a batch."""
    from lrm.data.schema import read_schema

    schema, _ = read_schema(datasets["sessions"])
    torch.manual_seed(0)
    model = build_model("teacher", schema, TEACHER)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.layers:
            layer.norm.weight.copy_(torch.rand(16, generator=g) + 0.5)
            layer.norm.bias.copy_(torch.randn(16, generator=g) * 0.3)
    return model, a_batch(datasets["sessions"], model, 256)


def _fp8_top(model):
    """A copy of `model` with top.0 in FP8 (scaled_mm, eager quantization)."""
    m = copy.deepcopy(model)
    top0 = m.top[0]
    D.dispatch(m, {"top.0": {"shape": {"k": top0.in_features, "n": top0.out_features}}},
               backend="scaled_mm", compile=False)
    return m


def _types(model):
    return {n: type(m) for n, m in model.named_modules()}


def _step(model, batch, autocast=False):
    """Forward + backward on a copy: (logits, top.0's output, parameter gradients)."""
    m = copy.deepcopy(model)
    seen = {}
    m.top[0].register_forward_hook(lambda mod, i, o: seen.update(top0=o.detach().float()))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = m(batch).float()
    F.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    return logits.detach(), seen["top0"], {n: p.grad for n, p in m.named_parameters()
                                           if p.grad is not None}


def _db(ref, got):
    return error_metrics(ref.reshape(len(ref), -1), got.reshape(len(got), -1))["sqnr_db"]


def test_fuse_norm_swaps_the_last_norm_only_and_keeps_the_state_dict(teacher_and_batch,
                                                                    datasets):
    from lrm.data.schema import read_schema

    plain, _ = teacher_and_batch
    assert fuse_norm(copy.deepcopy(plain)) == []  # top.0 not in FP8: nothing to fuse into
    fp8 = _fp8_top(plain)
    before, params = _types(fp8), dict(fp8.named_parameters())
    assert fuse_norm(fp8) == ["layers.1.norm"]
    after = _types(fp8)
    assert {n for n in before if before[n] is not after[n]} == {"layers.1.norm"}
    assert after["layers.1.norm"] is QuantizedLayerNorm
    assert dict(fp8.named_parameters()) == params  # the same Parameter objects
    sd = plain.state_dict()
    assert list(fp8.state_dict()) == list(sd)
    fp8.load_state_dict(sd, strict=True)
    schema, _ = read_schema(datasets["sessions"])
    assert fuse_norm(build_model("student", schema, SMALL_MODEL)) == []


def test_the_fused_teacher_is_within_the_fp8_error_the_probe_measures(teacher_and_batch):
    plain, batch = teacher_and_batch
    fp8 = _fp8_top(plain)
    fused = copy.deepcopy(fp8)
    fuse_norm(fused)
    # the probe on the top MLP, fed what the plain model feeds it (the last norm's output)
    seen = {}
    h = plain.top[0].register_forward_pre_hook(lambda m, i: seen.update(x=i[0].detach()))
    with torch.no_grad():
        plain(batch)
    h.remove()
    top = copy.deepcopy(plain.top)
    with Probe(top, FP8Config()) as probe, torch.no_grad():
        top(seen["x"])
    probe_db = probe.sites["0"].errors[RECIPES["tensorwise"]]["sqnr_db"].mean
    ref, fp8_, fused_ = _step(plain, batch), _step(fp8, batch), _step(fused, batch)
    assert set(fused_[2]) == set(ref[2])  # the gradient reaches every parameter
    layer = _db(ref[1], fused_[1])
    assert layer >= probe_db - 1.0  # top.0's output: within the error the probe measured
    assert layer >= _db(ref[1], fp8_[1]) - 1.0  # the bound's looser scale costs ~nothing
    assert _db(ref[0], fused_[0]) >= _db(ref[0], fp8_[0]) - 1.5  # the logits
    # its gradient went through the fused norm's backward: 16 values, so a noisy SQNR; the
    # bound's coarser scale may cost a dB or two, a wrong backward costs all of it (~0 dB)
    g = "layers.1.norm.weight"
    assert _db(ref[2][g], fused_[2][g]) >= min(_db(ref[2][g], fp8_[2][g]) - 3.0, 15)


def test_bf16_residual_keeps_the_stream_in_bf16_under_autocast_only(teacher_and_batch):
    plain, batch = teacher_and_batch
    mod = copy.deepcopy(plain)
    assert bf16_residual(mod) == ["layers.0.stream_in", "layers.0.norm",
                                  "layers.1.stream_in", "layers.1.norm"]
    assert list(mod.state_dict()) == list(plain.state_dict())
    assert all(isinstance(layer.norm, StreamLayerNorm) for layer in mod.layers)
    # float32 training (a CPU, or amp off): the very same numbers
    ref, got = _step(plain, batch), _step(mod, batch)
    assert torch.equal(ref[0], got[0]) and all(torch.equal(ref[2][n], got[2][n])
                                                for n in ref[2])
    # under autocast: every layer's input, its norm's input (the residual sum) and output
    # are bf16, and the model is as close to float32 as plain autocast is
    # every GEMM of a layer reads the stream as bf16 (cast once at the entry, not per GEMM)
    dtypes, gemm_inputs = [], set()
    for layer in mod.layers:
        layer.register_forward_hook(lambda m, i, o: dtypes.append((i[0].dtype, o.dtype)))
        layer.norm.register_forward_hook(lambda m, i, o: dtypes.append((i[0].dtype, o.dtype)))
        for gemm in (layer.fm_compress, layer.fm_dots, layer.lcb, layer.residual):
            if gemm is not None:
                gemm.register_forward_pre_hook(lambda m, i: gemm_inputs.add(i[0].dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mod(batch)
    assert dtypes and set(dtypes) == {(torch.float32, torch.bfloat16),
                                      (torch.bfloat16, torch.bfloat16)}
    assert dtypes[1] == (torch.float32, torch.bfloat16)  # layer 0 in: the float32 embeddings
    assert gemm_inputs == {torch.bfloat16}
    auto, auto_mod = _step(plain, batch, autocast=True), _step(mod, batch, autocast=True)
    assert _db(ref[0], auto_mod[0]) >= min(_db(ref[0], auto[0]) - 3, 30)
    assert set(auto_mod[2]) == set(ref[2])
    for n, grad in auto_mod[2].items():
        assert _db(ref[2][n], grad) >= min(_db(ref[2][n], auto[2][n]) - 6, 20), n


def test_transform_applies_the_mods_its_report_switches_on(teacher_and_batch, tmp_path):
    plain, batch = teacher_and_batch
    top0 = plain.top[0]
    report = {"format": D.FORMAT, "device": "test", "models": {"t": {
        "kind": "teacher", "plan": ["top.0"], "layers": {"top.0": {
            "shape": {"rows": 256, "k": top0.in_features, "n": top0.out_features},
            "fp8": True}}}},
        "settings": {"recipe": "tensorwise", "backend": "scaled_mm", "compile": False}}
    path = tmp_path / "r.json"
    for on in (False, True):
        report["settings"].update(fuse_norm=on, bf16_residual=on)
        path.write_text(json.dumps(report))
        model, _ = D.transform(path, "teacher")(copy.deepcopy(plain))
        assert isinstance(model.top[0], Fp8Linear)
        norms = [type(layer.norm) for layer in model.layers]
        assert norms == ([StreamLayerNorm, QuantizedLayerNorm] if on else [nn.LayerNorm] * 2)
        with torch.no_grad():
            assert torch.isfinite(model(batch)).all()
    assert R.settings(FP8Config(fuse_norm=True, bf16_residual=True), "cpu", False)[
        "fuse_norm"] is True  # a probe records the switches for transform
    for bad in ({"recipe": "rowwise"}, {"backend": "torchao"}):
        with pytest.raises(ConfigError, match="fuse_norm"):
            FP8Config(fuse_norm=True, **bad)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tiny_teacher_trains_with_both_mods_on_cpu(datasets, tmp_path, monkeypatch):
    from lrm.models.saved import load_model
    from lrm.train import TrainJob, train
    from tests.conftest import LOADER, tiny_train

    inputs = []
    forward = Fp8Linear.forward
    monkeypatch.setattr(Fp8Linear, "forward", lambda self, x: inputs.append(type(x)) or
                        forward(self, x))

    def fp8(model):
        _fp8_top_inplace(model)
        assert apply_mods(model, {"fuse_norm": True, "bf16_residual": True})
        return model, D.fp8_layers(model)

    res = train(TrainJob(kind="teacher", train=tiny_train(steps=4), model=TEACHER,
                         data=datasets["sessions"], loader=LOADER, out=tmp_path / "model",
                         transform=fp8))
    assert res.steps == 4 and math.isfinite(res.eval["ne"]) and res.eval["ne"] < 2
    assert len(inputs) >= 4 and set(inputs) == {Quantized}  # top.0 got the norm's e4m3
    model, _ = load_model(tmp_path / "model")  # loads strictly into the plain model
    assert type(model.layers[-1].norm) is nn.LayerNorm


def _fp8_top_inplace(model):
    top0 = model.top[0]
    D.dispatch(model, {"top.0": {"shape": {"k": top0.in_features, "n": top0.out_features}}},
               backend="scaled_mm", compile=False)
