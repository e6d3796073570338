"""Dispatch: swap the layers a probe report judged safe and fast to FP8, and only those.

A report (stage fp8_probe, lrm.fp8.report) lists per model a `plan`: the layers whose FP8
GEMMs were safe (error) and faster (timed on the probing device), already checked as a
whole not to make the model's training step slower. `dispatch(model, plan)` swaps exactly
those layers (matched by name and shape) for FP8 ones sharing their parameters
(lrm.fp8.linear.to_fp8); `transform(report, kind)` is the model transform (a model converter,
as torchtitan's Float8) that whoever builds a training job hands it for `train.fp8`; the job
runs it between building the model and sharding it. It also applies the model mods the
report's settings switch on (lrm.fp8.mods: fp8.fuse_norm, fp8.bf16_residual), and names the
layers that then run in FP8 (the run's card records them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from lrm.errors import ConfigError, DataError
from lrm.fp8.linear import is_fp8, resolve_backend, to_fp8
from lrm.fp8.mods import apply_mods

log = logging.getLogger("lrm")
FORMAT = 1  # the report's format


def read_report(path: Path) -> dict[str, Any]:
    """A probe report (JSON); a missing or foreign file is an error naming it."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"train.fp8: {path}: no such probe report (run `lrm fp8-probe`, or "
                          f"set train.fp8: \"\" to train without FP8)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"train.fp8: {path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, None, f"not a probe report (bad JSON: {e.msg})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "models" not in doc:
        raise DataError(path, None, "format", f"not an fp8 probe report of format {FORMAT}")
    return doc


def plan_for(report: Mapping[str, Any], kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(layer -> its report entry, settings) for the first probed model of `kind`."""
    for entry in report["models"].values():
        if entry.get("kind") == kind:
            return {n: entry["layers"][n] for n in entry.get("plan", [])}, report["settings"]
    return {}, report["settings"]


def dispatch(model: nn.Module, plan: Mapping[str, Mapping[str, Any]], *,
             recipe: str = "tensorwise", backend: str = "auto", compile: bool = True
             ) -> list[str]:
    """Swap each planned Linear of `model` for its FP8 version; the names swapped.

    A planned layer the model lacks, or whose shape differs from the probed one (another
    model size), is left alone and said in a log line.
    """
    backend = resolve_backend(backend)
    modules = dict(model.named_modules())
    swapped = []
    for name, entry in plan.items():
        mod = modules.get(name)
        shape = entry.get("shape", {})
        if not isinstance(mod, nn.Linear) or is_fp8(mod):
            log.info("fp8: %s is not a plain Linear in this model; left alone", name)
            continue
        if (mod.in_features, mod.out_features) != (shape.get("k"), shape.get("n")):
            log.info("fp8: %s is %dx%d here, %sx%s when probed; left alone", name,
                     mod.in_features, mod.out_features, shape.get("k"), shape.get("n"))
            continue
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        setattr(parent, child, to_fp8(mod, recipe, backend=backend, compile=compile))
        swapped.append(name)
    return swapped


def fp8_layers(model: nn.Module) -> list[str]:
    """The layers of `model` that run in FP8, in module order."""
    return [n for n, m in model.named_modules() if is_fp8(m)]


def transform(report_path: Path | str, kind: str
              ) -> Callable[[nn.Module], tuple[nn.Module, list[str]]] | None:
    """A training job's transform for `train.fp8` (lrm.train.job; "" -> None: no FP8): the
    model with its planned layers in FP8 and the report's mods, and its FP8 layers."""
    if not str(report_path):
        return None
    report = read_report(Path(report_path))
    plan, settings = plan_for(report, kind)
    if not plan:
        log.info("fp8: %s has no layer of a %s to run in FP8 (none safe and fast on %s)",
                 report_path, kind, report.get("device", "the probing device"))
    backend = resolve_backend(settings.get("backend", "auto"))

    def apply(model: nn.Module) -> tuple[nn.Module, list[str]]:
        swapped = dispatch(model, plan, recipe=settings.get("recipe", "tensorwise"),
                           backend=backend, compile=settings.get("compile", True))
        log.info("fp8: %d layer(s) of the %s in FP8 (%s)%s", len(swapped), kind, backend,
                 f": {', '.join(swapped)}" if swapped else "")
        modded = apply_mods(model, settings)
        if modded:
            log.info("fp8: mods on the %s: %s", kind, ", ".join(modded))
        return model, fp8_layers(model)

    return apply


__all__ = ["FORMAT", "dispatch", "fp8_layers", "plan_for", "read_report", "transform"]
