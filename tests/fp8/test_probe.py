"""The probe: its numbers for a known GEMM match a direct computation; outliers are unsafe."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch import nn

from lrm.config import FP8Config
from lrm.fp8.probe import Probe, safety
from lrm.models.matmul import BatchedMatmul

CFG = FP8Config(min_batches=3, max_batches=8, rows=4096, ci_db=0.5)


def _direct_sqnr(x: torch.Tensor, w: torch.Tensor, fmt: str) -> tuple[float, float]:
    """(SQNR, row SQNR) of x @ wᵀ with both operands cast to float8 e4m3, written out here
    (scale and cast in float32 like a cast kernel, the products in float64)."""
    if fmt == "e4m3_tensor":
        sx, sw = 448 / x.abs().max(), 448 / w.abs().max()
    else:  # e4m3_row: a scale per row of x and per output channel (row of w)
        sx, sw = 448 / x.abs().amax(1, keepdim=True), 448 / w.abs().amax(1, keepdim=True)
    qx = (x * sx).to(torch.float8_e4m3fn).double() / sx.double()
    qw = (w * sw).to(torch.float8_e4m3fn).double() / sw.double()
    x, w = x.double(), w.double()
    y, e = x @ w.T, qx @ qw.T - x @ w.T
    sqnr = 10 * math.log10(float(y.square().sum() / e.square().sum()))
    row = 10 * math.log10(float(1 / (e.square().sum(1) / y.square().sum(1)).mean()))
    return sqnr, row


def _run(model: nn.Module, xs: list[torch.Tensor], cfg: FP8Config = CFG) -> Probe:
    probe = Probe(model, cfg)
    for x in xs:
        model(x).square().sum().backward()
        model.zero_grad()
        probe.batch_done()
    probe.close()
    return probe


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_gaussian_gemm_matches_the_direct_computation():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(96, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 96, generator=g) * 0.1)
    xs = [torch.randn(512, 96, generator=g) for _ in range(5)]
    site = _run(lin, xs).sites[""]
    assert (site.rows, site.k, site.n, site.calls) == (512, 96, 48, 5)
    for fmt in ("e4m3_tensor", "e4m3_row"):
        direct = [_direct_sqnr(x, lin.weight.detach(), fmt) for x in xs]
        for i, metric in enumerate(("sqnr_db", "row_sqnr_db")):
            vals = [d[i] for d in direct]
            r = site.errors[fmt][metric]
            assert r.n == 5
            assert math.isclose(r.mean, sum(vals) / 5, rel_tol=1e-9), (fmt, metric)
            sd = stats.tstd(vals)
            assert math.isclose(r.half_width(0.95), stats.t.ppf(0.975, 4) * sd / math.sqrt(5),
                                rel_tol=1e-6)
        rel = site.errors[fmt]["rel_err"].mean
        assert math.isclose(rel, sum(10 ** (-d[0] / 20) for d in direct) / 5, rel_tol=1e-9)
    # the published figures for Gaussian GEMMs (device-independent numerics)
    mean = {f: site.errors[f]["sqnr_db"].mean for f in site.errors}
    assert mean["bf16"] > 45 and 26 < mean["e4m3_tensor"] < 32 and mean["mxfp4"] < 20
    assert mean["mxfp4"] < mean["mxfp8"] < mean["e4m3_row"]
    assert 20 < mean["e5m2_dgrad"] < 30  # the output gradient (2 y) is Gaussian too
    st = site.act.summary()
    allx = torch.cat(xs)
    assert st["amax"] == float(allx.abs().max()) and abs(st["kurtosis"] - 3) < 0.1
    assert site.other.summary()["amax"] == float(lin.weight.detach().abs().max())
    assert safety(site, CFG)[0]


def _with_outliers(x: torch.Tensor, factor: float, g: torch.Generator) -> torch.Tensor:
    x = x.clone()
    hit = torch.rand(x.shape, generator=g) < 0.001  # 0.1% of the entries
    x[hit] *= factor
    return x


@pytest.mark.parametrize("factor, safe", [(1e5, False), (100.0, True)])
@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_planted_outliers_make_a_layer_unsafe(factor, safe):
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(256, 64)
    xs = [_with_outliers(torch.randn(1024, 256, generator=g), factor, g) for _ in range(4)]
    site = _run(lin, xs).sites[""]
    ok, why = safety(site, CFG)
    assert ok is safe, why
    if not safe:  # the rows without an outlier lost their precision; the whole-tensor SQNR,
        # dominated by the outlier rows, would not have said so
        assert "e4m3_tensor row_sqnr_db" in why
        assert site.errors["e4m3_tensor"]["sqnr_db"].mean > 25
        assert site.errors["e4m3_tensor"]["row_sqnr_db"].mean < 15


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_interactions_are_probed_as_batched_gemms():
    class Dots(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.mm = nn.Linear(8, 8), BatchedMatmul()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)  # [B, n, d]
            return self.mm(h, h.transpose(1, 2))

    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(64, 5, 8, generator=g) for _ in range(3)]
    probe = _run(Dots(), xs)
    mm = probe.sites["mm"]
    assert (mm.op, mm.rows, mm.k, mm.n) == ("matmul", 64 * 5, 8, 5)
    assert mm.errors["e4m3_tensor"]["sqnr_db"].n == 3
    assert mm.errors["e5m2_dgrad"]["sqnr_db"].n == 3 and mm.input_grad
    assert probe.sites["lin"].rows == 64 * 5  # a Linear on [B, n, d]: B*n rows


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_the_stopping_rule_waits_for_min_batches_and_narrow_intervals():
    g = torch.Generator().manual_seed(3)
    lin = nn.Linear(64, 32)
    cfg = FP8Config(min_batches=3, max_batches=50, ci_db=0.5)
    probe = Probe(lin, cfg)
    widths = []
    for i in range(12):
        lin(torch.randn(2048, 64, generator=g)).square().sum().backward()
        probe.batch_done()
        widths.append(probe.widest())
        assert probe.converged() == (i + 1 >= 3 and widths[-1] <= 0.5)
    assert widths[0] == math.inf and widths[-1] <= 0.5 and probe.converged()
    probe.close()
    loose = Probe(nn.Linear(64, 32), FP8Config(min_batches=4, max_batches=9, ci_db=100.0))
    for i in range(5):  # intervals narrow enough from the 2nd batch: min_batches still rules
        loose.sites[""].module(torch.randn(256, 64, generator=g)).sum().backward()
        loose.batch_done()
        assert loose.converged() == (i + 1 >= 4), i
    loose.close()
    assert probe.converged()  # nothing more recorded once closed
    n = probe.sites[""].errors["bf16"]["sqnr_db"].n
    lin(torch.randn(8, 64))
    assert probe.sites[""].errors["bf16"]["sqnr_db"].n == n
