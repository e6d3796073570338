"""A saved model folder (a training run's final model, lrm.train): what evaluate, the MLflow
pyfunc, FP8 probing, ExFM augmentation and the registry load.

    DIR/model.json      kind, schema, model config, hash sizes, training summary
    DIR/state_dict.pt   the unsharded state dict, plain CPU tensors (torch.save)

The folder is written atomically (lrm.io.atomic_dir) and read back with
`torch.load(weights_only=True)`: nothing in it is unpickled as code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lrm import io
from lrm.config import MODEL_KINDS, ModelConfig, from_dict
from lrm.data.schema import FeatureSchema
from lrm.errors import DataError, first_sentence
from lrm.models import build_model

FORMAT = 1
CARD = "model.json"
WEIGHTS = "state_dict.pt"


@dataclass(frozen=True)
class ModelCard:
    """Everything needed to rebuild a trained model and feed it like training did."""

    kind: str
    schema: FeatureSchema
    model: ModelConfig
    hash_sizes: dict[str, int]
    info: dict[str, Any] = field(default_factory=dict)  # training summary (steps, days, NE)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "kind": self.kind, "schema": json.loads(self.schema.to_json()),
            "model": dataclasses.asdict(self.model), "hash_sizes": self.hash_sizes,
            "info": self.info,
        }, indent=2, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str, where: Path | str = CARD) -> ModelCard:
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                found = d.get("format") if isinstance(d, dict) else None
                raise DataError(where, None, "format", f"model format {found!r}; this lrm "
                                                       f"reads format {FORMAT}")
            if d.get("kind") not in MODEL_KINDS:  # a model of a kind this lrm cannot build
                raise DataError(where, None, "kind", f"unknown model kind {d.get('kind')!r}; "
                                                     f"this lrm builds {', '.join(MODEL_KINDS)}")
            return cls(kind=d["kind"], schema=FeatureSchema.from_json(json.dumps(d["schema"])),
                       model=from_dict(ModelConfig, d["model"], "model"),
                       hash_sizes={k: int(v) for k, v in d["hash_sizes"].items()},
                       info=d.get("info", {}))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DataError(where, None, None, f"not a model card lrm wrote ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None


def save_model(out: Path, card: ModelCard, state_dict: dict[str, torch.Tensor]) -> Path:
    """Write the model folder atomically; return `out`."""
    with io.atomic_dir(out) as tmp:  # (recorded as the stage running: lrm.io.running)
        io.save_tensors({k: v.detach().cpu().contiguous() for k, v in state_dict.items()},
                     tmp / WEIGHTS)  # a full disk raises the OSError, not torch's riddle
        (tmp / CARD).write_text(card.to_json() + "\n")
    return Path(out)


def read_card(path: Path) -> ModelCard:
    """The card of a model folder, checked against the hash lrm recorded when it wrote it."""
    f = Path(path) / CARD
    if not f.is_file():
        raise DataError(path, None, None, f"not a model folder (no {CARD})")
    io.verify_recorded(path, [CARD])
    return ModelCard.from_json(f.read_text(), f)


def verify_model(path: Path) -> None:
    """A DataError naming the file unless the folder's card and weights are the bytes lrm
    recorded when it wrote them (before a folder is packaged or copied on unread)."""
    read_card(path)
    if not (Path(path) / WEIGHTS).is_file():
        raise DataError(path, None, None, f"not a model folder (no {WEIGHTS})")
    io.verify_recorded(path, [WEIGHTS])


def copy_model(src: Path, dst: Path) -> Path:
    """A verified copy of model folder `src` at `dst`, a folder of its own with its own record
    (what is packaged for serving: a model folder written inside a stage's output has none)."""
    verify_model(src)
    with io.atomic_dir(dst) as tmp:
        for name in (CARD, WEIGHTS):
            shutil.copy2(Path(src) / name, tmp / name)
    return Path(dst)


def model_hash(model_dir: Path) -> str:
    """Content hash of a saved model: its card without the training summary, its weights.

    Two folders hash alike exactly when they predict alike (same architecture, schema,
    hash sizes and weights), whatever their training logs say.
    """
    model_dir = Path(model_dir)
    card = json.loads((model_dir / CARD).read_text()) if (model_dir / CARD).is_file() else None
    if card is None or not (model_dir / WEIGHTS).is_file():
        raise DataError(model_dir, None, None, f"not a model folder (needs {CARD} and {WEIGHTS})")
    card.pop("info", None)
    h = hashlib.sha256(json.dumps(card, sort_keys=True).encode())
    h.update(io.read_sha256(model_dir / WEIGHTS).encode())
    return "sha256:" + h.hexdigest()


def load_weights(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A model folder's state dict: plain tensors only (weights-only load: a pickled object
    is refused, its code never runs), the bytes lrm recorded when it wrote the folder (another
    model's weights copied in are refused); anything else is a DataError naming the file."""
    f = Path(path) / WEIGHTS
    if f.is_file():
        io.verify_recorded(path, [WEIGHTS])
    try:
        sd = torch.load(f, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise DataError(path, None, None, f"not a model folder (no {WEIGHTS})") from None
    except Exception as e:  # noqa: BLE001  (unpickling refused, truncated, not torch's)
        raise DataError(f, None, None, f"not a state dict of plain tensors, refused unread "
                        f"({first_sentence(str(e)) or type(e).__name__})") from None
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                           for k, v in sd.items()):
        raise DataError(f, None, None, "not a state dict of plain tensors")
    return sd


def load_model(path: Path, device: torch.device | str = "cpu") -> tuple[nn.Module, ModelCard]:
    """The unsharded model (eval mode) and its card, from a folder `save_model` wrote."""
    card = read_card(path)
    model = build_model(card.kind, card.schema, card.model,  # type: ignore[arg-type]
                        device=device, dense_device=device)
    try:
        model.load_state_dict(load_weights(path, device), strict=True)
    except RuntimeError as e:  # missing or unexpected keys, other shapes
        raise DataError(Path(path) / WEIGHTS, None, None, f"does not fit its {CARD} "
                        f"({str(e).strip().splitlines()[0][:200]})") from None
    return model.eval(), card
