"""Probe a model on real batches and judge every layer: the report stage fp8_probe writes.

`probe_model(model, batches, cfg)` runs training steps (forward, backward, no update) under
`lrm.fp8.probe.Probe` until its stopping rule holds or `fp8.budget_s` seconds have gone by;
on a device with no fast FP8 GEMM (a CPU, a GPU before sm_89: no layer can be chosen
there) `fp8.slow_device_batches` batches show the error; `stopped` says which (and the
table in words). Then per layer: the statistics and
errors, the speed of the layer's GEMMs in training precision vs FP8 at the layer's real
shape (lrm.fp8.speed), and the verdict: safe (error), fast (speed), fp8 (both; only
Linears: there is no FP8 batched-matmul kernel to dispatch an interaction to). The layers
judged fp8 form the model's plan; the plan is then timed as a whole (a training step of
the model with and without it) and dropped if it makes the step slower, so dispatching a
report never slows the model on the device that probed it. `markdown(report)` is the
readable table.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import warnings
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lrm.config import FP8Config
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files
from lrm.dist import _device
from lrm.errors import ConfigError
from lrm.fp8.dispatch import FORMAT, dispatch
from lrm.fp8.formats import RECIPES
from lrm.fp8.linear import native_gemm, resolve_backend
from lrm.fp8.probe import Probe, safety
from lrm.fp8.speed import fast_fp8, median_ms, precision, time_linear
from lrm.models.precision import autocast
from lrm.models.saved import load_model
from lrm.progress import Reporter

log = logging.getLogger("lrm")
CHECK_BATCHES = 3  # real batches a whole-model step is timed on


def _step(model: nn.Module, batch: Batch, device: torch.device, amp: bool) -> None:
    with autocast(device, amp):
        logits = model(batch)
    F.binary_cross_entropy_with_logits(logits.float(), batch.labels).backward()
    model.zero_grad(set_to_none=True)


def step_ms(model: nn.Module, batches: list[Batch], device: torch.device, amp: bool,
            reps: int) -> float:
    """Median time of a training step (forward + backward) over `batches`, per batch."""
    def run() -> None:
        for b in batches:
            _step(model, b, device, amp)
    return median_ms(run, device, reps) / max(len(batches), 1)


def model_check(model: nn.Module, batches: list[Batch], plan: dict[str, Any],
                cfg: FP8Config, device: torch.device, amp: bool, backend: str
                ) -> dict[str, Any]:
    """The model's step with the plan dispatched vs without; `keep` when not slower."""
    if not plan:
        return {"keep": False, "why": "no layer is both safe and fast"}
    fp8_model = copy.deepcopy(model)
    dispatch(fp8_model, plan, recipe=cfg.recipe, backend=backend, compile=cfg.compile)
    base = step_ms(model, batches, device, amp, cfg.speed_reps)
    fp8 = step_ms(fp8_model, batches, device, amp, cfg.speed_reps)
    keep = fp8 <= base
    return {"keep": keep, "base_ms": base, "fp8_ms": fp8, "speedup": base / fp8,
            "why": "the step is not slower with the plan" if keep else
            "the whole step was slower with the plan: dropped"}


def batch_limit(cfg: FP8Config, device: torch.device) -> tuple[int, bool]:
    """(batches to probe at most, whether the device's lack of a fast FP8 GEMM cut them):
    where no FP8 GEMM is fast no layer can be chosen, and a few batches show the error."""
    slow = not fast_fp8(device) and cfg.slow_device_batches < cfg.max_batches
    return (cfg.slow_device_batches if slow else cfg.max_batches), slow


def probe_model(model: nn.Module, batches: Iterable[Batch], cfg: FP8Config, *,
                device: torch.device | str = "cpu", amp: bool = True,
                reporter: Reporter | None = None) -> dict[str, Any]:
    """Probe, time and judge every GEMM of `model` on `batches` (module docstring)."""
    device = torch.device(device)
    backend = resolve_backend(cfg.backend)
    model.to(device).train()
    kept: list[Batch] = []
    limit, slow = batch_limit(cfg, device)
    stopped = "data"
    deadline = time.monotonic() + cfg.budget_s
    it = iter(batches)
    with Probe(model, cfg) as probe, warnings.catch_warnings():
        # a first layer's input needs no gradient: its backward hook still sees the output's
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for b in islice(it, limit):
            b = b.to(device)
            if len(kept) < CHECK_BATCHES:
                kept.append(b)
            _step(model, b, device, amp)
            probe.batch_done()
            if reporter is not None:
                reporter.update(1, ci_db=probe.widest())
            if probe.converged():
                stopped = "converged"
                break
            if time.monotonic() > deadline and probe.batches < limit:
                stopped = "budget"
                break
        else:
            if probe.batches == limit:
                stopped = "slow_device" if slow else "max_batches"
    getattr(it, "close", lambda: None)()  # a loader's background reader stops here
    if probe.batches == 0:
        raise ConfigError("fp8 probe: no batch to probe (empty data)")
    layers: dict[str, Any] = {}
    for name, site in probe.sites.items():
        if site.calls == 0:
            continue
        entry = site.summary(cfg.confidence)
        safe, why_safe = safety(site, cfg)
        speed = None
        if site.op == "linear" and slow:
            # not timed: no FP8 GEMM here can be fast (fast_fp8), and a CPU's _scaled_mm is
            # oneDNN's reference kernel, minutes a layer at a teacher's shapes (make run sat
            # 13 min in one probe) for a verdict known before
            fast, why_fast = False, (f"not timed: no fast FP8 GEMM on {device.type} "
                                     f"(torch._scaled_mm emulates it)")
        elif site.op == "linear":
            speed = time_linear(site.rows, site.k, site.n,
                                bias=site.module.bias is not None,  # type: ignore[union-attr]
                                input_grad=site.input_grad, device=device, amp=amp,
                                recipe=cfg.recipe, backend=backend, compile=cfg.compile,
                                reps=cfg.speed_reps)
            fast = speed["speedup"] >= cfg.min_speedup
            why_fast = (f"FP8 {speed['speedup']:.2f}x the {speed['precision']} step "
                        f"({'>=' if fast else '<'} {cfg.min_speedup:g}x)")
        else:
            fast, why_fast = False, "no FP8 batched-matmul kernel to dispatch it to"
        entry.update(speed=speed, safe=safe, fast=fast, fp8=safe and fast,
                     why={"safe": why_safe, "fast": why_fast})
        layers[name] = entry
    plan = {n: e for n, e in layers.items() if e["fp8"]}
    check = model_check(model, kept, plan, cfg, device, amp, backend)
    return {"batches": probe.batches, "stopped": stopped, "widest_ci_db": probe.widest(),
            "layers": layers, "plan": list(plan) if check["keep"] else [],
            "model_check": check}


def resolve_device(pref: str) -> torch.device:
    """train.device's choice (auto: CUDA when present) for this one process."""
    return _device(pref, 0)


def probe_saved(model_dir: Path, data: Path, cfg: FP8Config, *, device: str = "auto",
                amp: bool = True, batch_size: int = 2048) -> dict[str, Any]:
    """Probe the saved model in `model_dir` on the days it trained on in `data`."""
    dev = resolve_device(device)
    model, card = load_model(model_dir, dev)
    available = sorted(day_files(data))
    days = [d for d in card.info.get("train_days", []) if d in available] or available[:-1] \
        or available
    loader = BatchLoader(data, batch_size, days=days, dedup=True, hash_sizes=card.hash_sizes,
                         prefetch=2)
    if loader.schema.sparse_features != card.schema.sparse_features or \
            loader.schema.dense != card.schema.dense:
        raise ConfigError(f"fp8 probe: {data} has schema {loader.schema.name!r} with other "
                          f"features than the model in {model_dir} ({card.schema.name!r})")
    with Reporter(f"fp8 probe {card.kind}", total=batch_limit(cfg, dev)[0],
                  unit="batches") as rep:
        result = probe_model(model, loader, cfg, device=dev, amp=amp, reporter=rep)
    return {"dir": str(model_dir), "kind": card.kind, "days": days,
            "batch_size": batch_size, **result}


def settings(cfg: FP8Config, device: torch.device | str, amp: bool) -> dict[str, Any]:
    """What a report was measured with (dispatch reads recipe, backend, compile, the mods)."""
    device = torch.device(device)
    return {"recipe": cfg.recipe, "format": RECIPES[cfg.recipe],
            "backend": resolve_backend(cfg.backend), "compile": cfg.compile,
            "fast_fp8": fast_fp8(device),
            "fp8_gemm": "native" if native_gemm(device) else "float32 emulation",
            "budget_s": cfg.budget_s,
            "slow_device_batches": cfg.slow_device_batches,
            "precision": precision(device, amp), "min_sqnr_db": cfg.min_sqnr_db,
            "min_grad_sqnr_db": cfg.min_grad_sqnr_db, "min_speedup": cfg.min_speedup,
            "ci_db": cfg.ci_db, "confidence": cfg.confidence, "rows": cfg.rows,
            "fuse_norm": cfg.fuse_norm, "bf16_residual": cfg.bf16_residual}


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"CPU ({torch.get_num_threads()} threads), torch {torch.__version__}"


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats (an interval not yet open, a constant's kurtosis) -> None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def build(models: dict[str, Any], cfg: FP8Config, device: torch.device | str, amp: bool
          ) -> dict[str, Any]:
    """The report: format, device, settings, and per model its probe (JSON-safe)."""
    return _clean({"format": FORMAT, "device": device_name(device),
                   "settings": settings(cfg, device, amp), "models": models})


# -- the readable table --------------------------------------------------------------

def _db(entry: dict[str, Any], fmt: str, metric: str = "row_sqnr_db") -> str:
    r = entry["error"].get(fmt, {}).get(metric)
    if r is None:
        return "-"
    lo, hi = r["ci"]
    return f"{r['mean']:.1f}" + (f" ±{(hi - lo) / 2:.1f}" if lo is not None else "")


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def stopped(why: str, s: dict[str, Any]) -> str:
    """Why the probe stopped taking batches, in words (a report's `stopped`)."""
    return {
        "converged": "every judged interval narrow enough",
        "max_batches": "fp8.max_batches",
        "data": "the data ran out",
        "budget": f"the time budget fp8.budget_s = {s.get('budget_s', 0):g} s ran out: the "
                  "intervals are wider than fp8.ci_db",
        "slow_device": f"this device has no fast FP8 GEMM: the error is measured on "
                       f"fp8.slow_device_batches = {s.get('slow_device_batches')} batches "
                       "only, and no layer can be chosen here",
    }.get(why, why)


def _emulated(s: dict[str, Any]) -> str:
    if s.get("fp8_gemm", "native") == "native":
        return ""
    return (" (this device has no FP8 GEMM: FP8 layers multiply their FP8 operands in "
            "float32 here, so their speed is not FP8's)")


def markdown(report: dict[str, Any]) -> str:
    """Per model and layer: statistics, error (row SQNR, dB, 95% CI), speed, verdict."""
    s = report["settings"]
    lines = [f"# FP8 probe ({report['device']})", "",
             f"Recipe {s['recipe']} ({s['format']}), backend {s['backend']}, against "
             f"{s['precision']}{_emulated(s)}. Safe: row SQNR lower bound >= "
             f"{s['min_sqnr_db']:g} dB forward, >= {s['min_grad_sqnr_db']:g} dB gradients "
             f"(e5m2); fast: FP8 forward + "
             f"backward >= {s['min_speedup']:g}x. SQNR in dB, mean ± 95% half width.", ""]
    for name, m in report["models"].items():
        chk = m["model_check"]
        lines += [f"## {name} ({m['kind']}, {m['dir']})", "",
                  f"{m['batches']} batches of {m['batch_size']} ({stopped(m['stopped'], s)}); "
                  f"plan: {', '.join(m['plan']) or 'none'} ({chk['why']}).", "",
                  "| layer | op | rows x k -> n | in amax | in kurt | in outliers | bf16 | "
                  "e4m3 tensor | e4m3 row | mxfp8 | mxfp4 | e5m2 dgrad | e5m2 wgrad | "
                  "FP8 speed | safe | fast | FP8 |",
                  "|" + "---|" * 17]
        for layer, e in m["layers"].items():
            sh, st = e["shape"], e["stats"]["input"]
            speed = f"{e['speed']['speedup']:.2f}x" if e["speed"] else "-"
            lines.append(
                f"| {layer} | {e['op']} | {sh['rows']} x {sh['k']} -> {sh['n']} | "
                f"{_num(st.get('amax'), '.3g')} | {_num(st.get('kurtosis'), '.3g')} | "
                f"{_num(st.get('outlier_share'), '.2%')} | " +
                " | ".join(_db(e, f) for f in ("bf16", "e4m3_tensor", "e4m3_row", "mxfp8",
                                                "mxfp4", "e5m2_dgrad", "e5m2_wgrad")) +
                f" | {speed} | {'yes' if e['safe'] else 'no'} | {'yes' if e['fast'] else 'no'}"
                f" | {'yes' if e['fp8'] else 'no'} |")
        lines.append("")
    return "\n".join(lines)


__all__ = ["batch_limit", "build", "markdown", "model_check", "probe_model", "probe_saved", "resolve_device",
           "step_ms"]
