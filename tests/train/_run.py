"""Test helper: `[torchrun ...] python tests/train/_run.py ARGS.json` trains and writes, from
rank 0, the per-step history, the result and the final weights (for the comparisons)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from lrm.config import CheckpointConfig, LoaderConfig, ModelConfig, SplitConfig, TrainConfig, \
    from_dict
from lrm.data.batch import Batch
from lrm.train import TrainJob, train
from lrm.train.job import bce_loss


def fingerprint(b: Batch) -> str:
    """A batch by its rows' dense values and labels (not its hashed ids)."""
    return hashlib.blake2b(b.dense.detach().cpu().numpy().tobytes()
                           + b.labels.detach().cpu().numpy().tobytes(), digest_size=16).hexdigest()


def _recording(folder: Path) -> Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]:
    """The default loss, each batch a step trains on written (in order) to
    FOLDER/rank-R.txt: which rows reached the optimizer."""
    folder.mkdir(parents=True, exist_ok=True)
    out = (folder / f"rank-{os.environ.get('RANK', '0')}.txt").open("a")

    def loss(model: nn.Module, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        out.write(fingerprint(b) + "\n")
        out.flush()
        return bce_loss(model, b)
    return loss


def main(args_file: str) -> None:
    a = json.loads(Path(args_file).read_text())
    cfg = from_dict(TrainConfig, a["train"], "train")
    model_cfg = from_dict(ModelConfig, a.get("model", {}), "model")
    loader_cfg = from_dict(LoaderConfig, a.get("loader", {}), "loader")
    extra = {"loss": _recording(Path(a["record"]))} if a.get("record") else {}
    r = train(TrainJob(kind=a.get("kind", "student"), train=cfg, model=model_cfg, **extra,
                       data=Path(a["data"]), loader=loader_cfg,
                       split=from_dict(SplitConfig, a.get("split", {}), "split"),
                       checkpoint=from_dict(CheckpointConfig, a.get("checkpoint", {}),
                                            "checkpoint"),
                       out=Path(a["out"]) if a.get("out") else None,
                       checkpoints=Path(a["checkpoints"]) if a.get("checkpoints") else None,
                       start="resume" if a.get("resume", False) else "fresh"))
    if int(os.environ.get("RANK", "0")) != 0 or "result" not in a:
        return
    Path(a["result"]).write_text(json.dumps({
        "steps": r.steps, "samples": r.samples, "eval": r.eval, "history": r.history,
        "world_size": r.world_size, "resumed_from": r.resumed_from}, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
