"""Test helper: `[torchrun ...] python tests/train/_run.py ARGS.json` trains and writes, from
rank 0, the per-step history, the result and the final weights (for the comparisons)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lrm.config import CheckpointConfig, LoaderConfig, ModelConfig, SplitConfig, TrainConfig, \
    from_dict
from lrm.train import TrainJob, train


def main(args_file: str) -> None:
    a = json.loads(Path(args_file).read_text())
    cfg = from_dict(TrainConfig, a["train"], "train")
    model_cfg = from_dict(ModelConfig, a.get("model", {}), "model")
    loader_cfg = from_dict(LoaderConfig, a.get("loader", {}), "loader")
    r = train(TrainJob(kind=a.get("kind", "student"), train=cfg, model=model_cfg,
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
