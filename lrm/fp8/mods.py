"""Model mods that widen where low precision pays (LoKA), each a switch of the `fp8` section:

    fuse_norm      fp8.fuse_norm: the LayerNorm feeding an FP8 Linear casts its own output
                   to e4m3 (lrm.fp8.norm.QuantizedLayerNorm); the Linear takes it as is
    bf16_residual  fp8.bf16_residual: Wukong's residual stream kept in bf16 under autocast

The switches travel in a probe report's settings; `apply_mods(model, settings)` is what
`lrm.fp8.dispatch.transform` (train.fp8) runs after swapping the planned layers, since the
fused norm needs to know which Linear is FP8. Each mod returns the names of the modules it
changed and leaves a model it does not apply to alone. The modules keep their Parameters:
state dicts are unchanged, and a model saved from a modded run loads into the plain one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from lrm.fp8.linear import Fp8Linear
from lrm.fp8.norm import QuantizedLayerNorm, StreamCast, StreamLayerNorm
from lrm.models.wukong import Wukong, WukongLayer

log = logging.getLogger("lrm")


def fuse_norm(model: nn.Module) -> list[str]:
    """Wukong: fuse the FP8 cast of top.0's input into the last layer's LayerNorm.

    Only where the norm's output has no other reader than an Fp8Linear taking one scale
    per tensor (`_scaled_mm` backend; torchao's Float8Linear quantizes its input itself).
    In Wukong that is the last layer's norm, which feeds only the top MLP's first Linear
    (through a flatten), the widest GEMM of the model (K = embeddings x d). The other
    layers' norms also feed the FM's batched products (no FP8 kernel) and the next residual
    add, which need full-precision values, and Linears whose K is the embedding count
    (n <= 64 in every profile), far below the K >= 2048 at which FP8 with its quantization
    pays on an H100: the probe never plans those.
    """
    if not isinstance(model, Wukong):
        return []
    first = model.top[0]
    if not (isinstance(first, Fp8Linear) and first.recipe == "tensorwise"):
        log.info("fp8: fuse_norm: top.0 is %s, not a tensorwise Fp8Linear: no norm to fuse",
                 type(first).__name__)
        return []
    i = len(model.layers) - 1
    last: WukongLayer = model.layers[i]  # type: ignore[assignment]
    if not isinstance(last.norm, QuantizedLayerNorm):
        last.norm = QuantizedLayerNorm.from_norm(last.norm, compile=first.compile)
    return [f"layers.{i}.norm"]


def bf16_residual(model: nn.Module) -> list[str]:
    """Wukong's residual stream in the autocast dtype (bf16) instead of float32.

    The stream is what passes from layer to layer: each layer's input X and output
    LayerNorm(concat(FMB, LCB) + residual). Under CUDA autocast the GEMMs write bf16, but
    LayerNorm runs in float32 (autocast's float32 list) and the embeddings come out of the
    tables in float32, so the stream is float32: the residual add reads and writes it at 4
    bytes an element, the LayerNorm reads and writes 4, and every GEMM that reads X casts
    it to bf16 again. With the mod, X enters each layer as bf16 (one cast, `StreamCast`),
    the add's operands are then all bf16, and the norm reads and writes bf16 with float32
    statistics (`StreamLayerNorm`): half the bytes, and no per-GEMM casts. Master weights
    stay float32. Without autocast (float32 training, a CPU) nothing changes.
    """
    if not isinstance(model, Wukong):
        return []
    changed = []
    layers: list[WukongLayer] = list(model.layers)  # type: ignore[arg-type]
    for i, layer in enumerate(layers):
        if not isinstance(layer.stream_in, StreamCast):
            layer.stream_in = StreamCast()
        changed.append(f"layers.{i}.stream_in")
        if type(layer.norm) is nn.LayerNorm:  # a fused norm already runs in its input's dtype
            layer.norm = StreamLayerNorm.from_norm(layer.norm)
            changed.append(f"layers.{i}.norm")
    return changed


def apply_mods(model: nn.Module, settings: Mapping[str, Any]) -> list[str]:
    """The mods `settings` (a report's, or FP8Config's fields) switch on; names changed."""
    changed = []
    if settings.get("bf16_residual", False):
        changed += bf16_residual(model)
    if settings.get("fuse_norm", False):
        changed += fuse_norm(model)
    return changed


__all__ = ["apply_mods", "bf16_residual", "fuse_norm"]
