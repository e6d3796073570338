"""Model mods compute the same function: the padded interaction equals the unpadded one."""

from __future__ import annotations

import dataclasses

import torch

from lrm.models import build_model
from lrm.models.dlrm import DotInteraction
from lrm.models.matmul import BatchedMatmul
from tests.train.conftest import SMALL_MODEL
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
    assert padded.interaction.dot_ur.pad == 8 and plain.interaction.dot_ur.pad == 1
    sd, psd = plain.state_dict(), padded.state_dict()
    assert list(sd) == list(psd) and all(torch.equal(sd[k], psd[k]) for k in sd)
    padded.load_state_dict(sd, strict=True)  # saved folders load either way
    batch = a_batch(datasets["sessions"], plain)
    with torch.no_grad():
        torch.testing.assert_close(padded(batch), plain(batch), rtol=0, atol=1e-5)
