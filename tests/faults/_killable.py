"""The training process the kill tests SIGKILL: `lrm.train.train` with checkpoints and a
resume start, from a forkserver that imported torch and lrm once (a fresh process per start
would pay ~5 s of imports; a fork from the server costs milliseconds).

The child writes each step it finishes to a progress file, and slows every fsync by
`fsync_s` so a write spans a window the test can aim at (the page cache survives SIGKILL,
so only the order of writes and the rename are under test, not the disk)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingPlan

from lrm.config import CheckpointConfig, LoaderConfig
from lrm.data.schema import read_schema
from lrm.models import build_model
from lrm.train import TrainJob, train
from tests.conftest import SMALL_MODEL, tiny_train


def _plan(data: Path) -> ShardingPlan:
    """Every table on rank 0 (torchrec's planner would cost ~1 s a start)."""
    schema, _ = read_schema(data)
    model = build_model("student", schema, SMALL_MODEL, device="meta")
    plans = {}
    for path, m in model.named_modules():
        if type(m).__name__ == "EmbeddingBagCollection":
            plans[path] = construct_module_sharding_plan(
                m, {t.name: table_wise(rank=0, compute_kernel="fused")
                    for t in m.embedding_bag_configs()},
                local_size=1, world_size=1, device_type="cpu")
    return ShardingPlan(plans)


def run(spec: dict[str, Any]) -> None:
    """spec: data, train (tiny_train's keywords), checkpoint, checkpoints (None: none),
    out, progress, tmp, fsync_s."""
    tempfile.tempdir = spec["tmp"]  # the process group's FileStore: not in /tmp
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(spec["fsync_s"])
        real_fsync(fd)

    os.fsync = slow_fsync  # type: ignore[assignment]
    progress = open(spec["progress"], "a", buffering=1)  # noqa: SIM115  (until killed)

    def log_fn(point: Any, step: int) -> None:
        if "loss" in point:
            progress.write(f"{step}\n")

    data = Path(spec["data"])
    ck = Path(spec["checkpoints"]) if spec.get("checkpoints") else None
    train(TrainJob(kind="student", train=tiny_train(log_every=1, device="cpu", **spec["train"]),
                   model=SMALL_MODEL, data=data, loader=LoaderConfig(prefetch=2, num_workers=1),
                   checkpoint=CheckpointConfig(**spec["checkpoint"]), checkpoints=ck,
                   out=Path(spec["out"]), plan=_plan(data),
                   start="resume" if ck is not None else "fresh"), log_fn=log_fn)
    progress.write("done\n")
