"""The probe (LoKA): hooks on every GEMM of a model, the error of each in low precision.

`Probe(model, cfg)` attaches forward and backward hooks to every `nn.Linear` and every
`BatchedMatmul` (the GEMM-like interactions: DLRM's dots, Wukong's FM). Run training
steps (forward, backward; no optimizer step) on real batches and call `probe.batch_done()`
after each; per site it keeps

* statistics of the activation (over batches) and of the weight: amax, |x| quantiles,
  outlier share, kurtosis (lrm.fp8.stats.TensorStats);
* the error of the same GEMM with both operands in each format of lrm.fp8.formats, against
  float64: forward (bf16, e4m3 per tensor and per row, MXFP8, MXFP4) and the two gradient
  GEMMs with the output gradient in e5m2 (dgrad = G Bᵀ, wgrad = Aᵀ G). Per batch and
  format: the relative error ||Ŷ - Y|| / ||Y||, the SQNR 10 log10(||Y||² / ||Ŷ - Y||²), and
  the row SQNR: the SQNR after every output row is scaled to unit norm, which is what a
  following normalization (LayerNorm, a per-impression logit) sees, so a few outlier rows
  cannot hide that every other row lost its precision. Each is averaged over batches online
  with a t interval (lrm.fp8.stats.Running).

`probe.converged()` is the stopping rule: every judged interval (the dispatch recipe's
forward SQNRs, the e5m2 gradients') at most +-ci_db wide. The error is computed on a sample
of `cfg.rows` rows per batch, in float64; a per-tensor scale comes from the whole tensor's
amax, as the real cast's would. `probe.sites` holds the measurements, `Site.summary()`
and `verdict()` the report entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lrm.config import FP8Config
from lrm.fp8.formats import BACKWARD, E4M3, E5M2, FORWARD, RECIPES, per_tensor, quantize
from lrm.fp8.stats import Running, TensorStats
from lrm.models.matmul import BatchedMatmul

MAX_DB = 200.0  # an exact product (zero error) counts as this SQNR
METRICS = ("sqnr_db", "row_sqnr_db", "rel_err")


def error_metrics(ref: torch.Tensor, approx: torch.Tensor) -> dict[str, float] | None:
    """{rel_err, sqnr_db, row_sqnr_db} of `approx` against `ref` (rows: the last dimension).

    None when `ref` is all zero (no signal to compare with). Rows of `ref` that are zero
    do not count in the row SQNR.
    """
    ref = ref.double().reshape(-1, ref.shape[-1])
    err = approx.double().reshape(ref.shape) - ref
    signal, noise = float(ref.square().sum()), float(err.square().sum())
    if signal == 0.0:
        return None
    row_s, row_n = ref.square().sum(1), err.square().sum(1)
    live = row_s > 0
    row_ratio = float((row_n[live] / row_s[live]).mean())

    def db(ratio: float) -> float:
        return MAX_DB if ratio <= 0 else min(MAX_DB, -10 * math.log10(ratio))

    return {"rel_err": math.sqrt(noise / signal), "sqnr_db": db(noise / signal),
            "row_sqnr_db": db(row_ratio)}


@dataclass
class Site:
    """One hooked GEMM: A [..., M, K] @ B [..., K, N] (a Linear: A = input, B = Wᵀ)."""

    name: str
    op: str  # "linear" | "matmul"
    module: nn.Module
    outlier_k: float
    calls: int = 0  # forward calls seen (a module called twice a step is measured twice)
    rows: int = 0  # rows of A per call, largest seen (M times the batch dimensions)
    k: int = 0
    n: int = 0
    input_grad: bool = False  # whether A needed a gradient (the dgrad GEMM runs in training)
    act: TensorStats = field(init=False)
    other: TensorStats = field(init=False)  # B: a weight (once) or a second activation
    errors: dict[str, dict[str, Running]] = field(default_factory=dict)  # format -> metric
    _saved: dict[str, Any] | None = None  # the forward's sample, for the backward hook

    def __post_init__(self) -> None:
        self.act, self.other = TensorStats(self.outlier_k), TensorStats(self.outlier_k)

    def record(self, fmt: str, metrics: dict[str, float] | None) -> None:
        if metrics is None:
            return
        slot = self.errors.setdefault(fmt, {m: Running() for m in METRICS})
        for m, v in metrics.items():
            slot[m].add(v)

    def summary(self, confidence: float) -> dict[str, Any]:
        weight = self.op == "linear"
        return {
            "op": self.op, "module": type(self.module).__name__,
            "shape": {"rows": self.rows, "k": self.k, "n": self.n}, "calls": self.calls,
            "input_grad": self.input_grad,
            "stats": {"input": self.act.summary(),
                      ("weight" if weight else "other"): self.other.summary()},
            "error": {fmt: {m: r.summary(confidence) for m, r in per.items()}
                      for fmt, per in self.errors.items()},
        }


def _lower(r: Running, confidence: float) -> float:
    """The interval's lower bound (the mean itself with one sample: no interval yet)."""
    h = r.half_width(confidence)
    return r.mean - (h if math.isfinite(h) else 0.0)


def judged(site: Site, cfg: FP8Config) -> list[tuple[str, str, float]]:
    """(format, metric, threshold) the safety verdict of `site` rests on."""
    fwd = RECIPES[cfg.recipe]
    out = [(fwd, m, cfg.min_sqnr_db) for m in ("sqnr_db", "row_sqnr_db")]
    out += [(g, m, cfg.min_grad_sqnr_db) for g in BACKWARD for m in ("sqnr_db", "row_sqnr_db")
            if g in site.errors and not (g == "e5m2_dgrad" and not site.input_grad)]
    return out


def safety(site: Site, cfg: FP8Config) -> tuple[bool, str]:
    """(safe, why): every judged SQNR's lower bound clears its threshold."""
    if RECIPES[cfg.recipe] not in site.errors:
        return False, "no forward measurement (the layer never saw a non-zero output)"
    worst = []
    for fmt, metric, thr in judged(site, cfg):
        lo = _lower(site.errors[fmt][metric], cfg.confidence)
        if lo < thr:
            worst.append(f"{fmt} {metric} {lo:.1f} dB < {thr:g}")
    if worst:
        return False, "; ".join(worst)
    return True, f"{RECIPES[cfg.recipe]} and e5m2 gradients above their thresholds"


class Probe:
    """Hooks on every Linear and BatchedMatmul of `model` (module docstring)."""

    def __init__(self, model: nn.Module, cfg: FP8Config, *, seed: int = 0) -> None:
        self.cfg = cfg
        self.batches = 0
        self.sites: dict[str, Site] = {}
        self._handles: list[Any] = []
        self._gen = torch.Generator().manual_seed(seed)
        for name, mod in model.named_modules():
            op = "linear" if isinstance(mod, nn.Linear) else \
                "matmul" if isinstance(mod, BatchedMatmul) else None
            if op is None:
                continue
            site = Site(name, op, mod, cfg.outlier_k)
            self.sites[name] = site
            self._handles.append(mod.register_forward_hook(self._forward_hook(site)))
            self._handles.append(mod.register_full_backward_hook(self._backward_hook(site)))
            if op == "linear":
                site.other.add(mod.weight)

    # -- hooks -----------------------------------------------------------------------
    def _operands(self, site: Site, inputs: tuple[Any, ...]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [..., M, K], Bᵀ [..., N, K]) of this call, detached (Bᵀ: rows along K)."""
        if site.op == "linear":
            a = inputs[0].detach()
            return a.reshape(-1, a.shape[-1]), site.module.weight.detach()  # type: ignore[union-attr]
        a, b = inputs[0].detach(), inputs[1].detach()
        return a, b.transpose(-1, -2)

    def _sample(self, a: torch.Tensor, bt: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Indices into A's leading dimension: rows (2-D) or batch elements (batched)."""
        lead = a.shape[0]
        per = a.shape[-2] if a.dim() > 2 else 1  # rows per leading index
        take = min(lead, max(1, self.cfg.rows // per))
        idx = torch.randperm(lead, generator=self._gen)[:take].to(a.device) if take < lead \
            else torch.arange(lead, device=a.device)
        a_s = a.index_select(0, idx).double()
        bt_s = bt.index_select(0, idx).double() if bt.dim() > 2 else bt.double()
        return idx, a_s, bt_s

    def _forward_hook(self, site: Site) -> Any:
        @torch.no_grad()
        def hook(mod: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            a, bt = self._operands(site, inputs)
            if a.dim() > 3:  # fold extra batch dimensions into one
                a, bt = a.reshape(-1, *a.shape[-2:]), \
                    bt.reshape(-1, *bt.shape[-2:]) if bt.dim() > 2 else bt
            site.calls += 1
            site.rows = max(site.rows, a.numel() // a.shape[-1])
            site.k, site.n = a.shape[-1], bt.shape[-2]
            site.input_grad = site.input_grad or inputs[0].requires_grad
            site.act.add(a)
            if site.op == "matmul":
                site.other.add(bt)
            idx, a_s, bt_s = self._sample(a, bt)
            amax_a, amax_b = a.abs().amax(), bt.abs().amax()
            ref = torch.matmul(a_s, bt_s.transpose(-1, -2))
            for fmt in FORWARD:
                qa = quantize(a_s, fmt, amax_a)
                qb = quantize(bt_s, fmt, amax_b)
                site.record(fmt, error_metrics(ref, torch.matmul(qa, qb.transpose(-1, -2))))
            site._saved = {"idx": idx, "a": a_s, "bt": bt_s, "amax_a": amax_a,
                           "amax_b": amax_b, "shape": output.shape}
        return hook

    def _backward_hook(self, site: Site) -> Any:
        @torch.no_grad()
        def hook(mod: nn.Module, grad_input: Any, grad_output: tuple[torch.Tensor, ...]
                 ) -> None:
            saved, site._saved = site._saved, None
            g = grad_output[0]
            if saved is None or g is None:
                return
            a_s, bt_s = saved["a"], saved["bt"]
            g = g.detach().reshape(-1, g.shape[-1]) if a_s.dim() == 2 else \
                g.detach().reshape(-1, *g.shape[-2:])
            g_s = g.index_select(0, saved["idx"]).double()
            amax_g = g.abs().amax()
            qg = per_tensor(g_s, E5M2, amax_g)
            qa = per_tensor(a_s, E4M3, saved["amax_a"])
            qbt = per_tensor(bt_s, E4M3, saved["amax_b"])
            # dgrad: dA = G B (G [.., M, N], B = (Bᵀ)ᵀ [.., N, K])
            site.record("e5m2_dgrad", error_metrics(torch.matmul(g_s, bt_s),
                                                    torch.matmul(qg, qbt)))
            # wgrad: dBᵀ = Gᵀ A; a shared 2-D B sums over the batch: flatten it first
            if bt_s.dim() == 2 and a_s.dim() > 2:
                g2, a2, qg2, qa2 = (t.reshape(-1, t.shape[-1]) for t in (g_s, a_s, qg, qa))
            else:
                g2, a2, qg2, qa2 = g_s, a_s, qg, qa
            site.record("e5m2_wgrad", error_metrics(torch.matmul(g2.transpose(-1, -2), a2),
                                                    torch.matmul(qg2.transpose(-1, -2), qa2)))
        return hook

    # -- progress ----------------------------------------------------------------------
    def batch_done(self) -> None:
        self.batches += 1

    def widest(self) -> float:
        """The widest judged interval's half width (dB) over every site (inf: too few)."""
        w = 0.0
        for site in self.sites.values():
            for fmt, metric, _ in judged(site, self.cfg):
                r = site.errors.get(fmt, {}).get(metric)
                if r is not None:
                    w = max(w, r.half_width(self.cfg.confidence))
        return w

    def converged(self) -> bool:
        """The stopping rule: enough batches and every judged interval narrow enough."""
        return self.batches >= self.cfg.min_batches and self.widest() <= self.cfg.ci_db

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["METRICS", "Probe", "Site", "error_metrics", "judged", "safety"]
