"""What the training benchmarks share: the dataset, preloaded batches, the project's step.

Data: the synthetic log at its defaults (100k users, 10k ads, mean session length 8,
histories of up to 100 ads, ~79 on average): day 0 trains, day 1 is the held-out day
train() needs. --quick uses 5,000 sessions a day (~40k impressions), the full run 20,000
(~160k, the default day), --smoke a tiny world (bench.cases.data_profiles.tiny) at batch
256 and a few steps; more where a larger batch (`use_batch`, bench/train.py --batch)
needs them for the most steps a case takes (MOST_STEPS).

The throughput cases time optimizer steps on batches built beforehand (the loader has its
own benchmark, data.loader), best of a few repeats after warm-up steps; the `end_to_end`
variants run lrm.train.train itself (loader in the loop, prefetching in the background).
`use_device("cuda")` (bench/train.py --device) runs every case's model there.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.cases.data_profiles import tiny
from bench.common import smoke
from lrm.config import DedupConfig, GenerateConfig, ModelConfig, TrainConfig
from lrm.data import dedup, synthetic
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import read_schema
from lrm.models import build_model
from lrm.models.precision import autocast
from lrm.sharding import parallel
from lrm.dist import Dist, process_group, quiet_libraries
from lrm.train.data import model_hash_sizes
from lrm.train.graphs import graph_mlps
from lrm.train.guard import NonFiniteGuard
from lrm.train.job import bce_loss
from lrm.train.meter import Meter
from lrm.train.step_graph import GraphSteps, unsupported
from lrm.train.steps import Steps, dense_optimizer

BATCH = 2048  # the cases' batch unless use_batch says otherwise (TrainConfig's default)
SMOKE_BATCH = 256  # --smoke's
MOST_STEPS = {True: 16, False: 60}  # the most batches of day 0 a case takes (quick, full)
LR, EMBEDDING_LR = TrainConfig().lr, TrainConfig().embedding_lr  # the defaults
MODEL = ModelConfig()  # the default student: d=16, bottom [64], top [128, 64]
_DEVICE = ["cpu"]
_BATCH = [BATCH]


def use_device(device: str) -> None:
    """Run the cases' models on `device` (cpu or cuda)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU is visible")
    _DEVICE[0] = device


def device() -> str:
    return _DEVICE[0]


def use_batch(size: int) -> None:
    """Time every case's steps at batch `size` (a GPU does little work at the default)."""
    if size < 1:
        raise ValueError(f"batch size must be at least 1, got {size}")
    _BATCH[0] = size


def batch_size() -> int:
    return _BATCH[0]


def sessions_for(impressions: int) -> int:
    """Sessions a day of at least `impressions` (10% to spare: session lengths vary)."""
    return math.ceil(1.1 * impressions / GenerateConfig().mean_session_length)


def sessions_per_day(quick: bool) -> int:
    least = 0 if smoke() else 5_000 if quick else 20_000
    return max(least, sessions_for(MOST_STEPS[quick] * batch_size()))


def steps(quick: bool, full: int, fast: int, tiny_: int) -> int:
    """A case's steps (or repeats): the full run's, --quick's or --smoke's."""
    return tiny_ if smoke() else fast if quick else full


@contextmanager
def dataset(quick: bool, days: int = 2) -> Iterator[dict[str, Any]]:
    """{"raw": impressions layout, "sessions": its dedup, "rows": day 0 impressions, ...};
    the last of `days` is the held-out day."""
    n = sessions_per_day(quick)
    cfg = tiny(days=days, sessions=n) if smoke() else GenerateConfig(days=days,
                                                                       sessions_per_day=n)
    with tempfile.TemporaryDirectory(prefix="lrm-bench-train-") as tmp:
        root = Path(tmp)
        synthetic.generate(cfg, root / "raw")
        m = dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
        rows = BatchLoader(root / "raw", batch_size(), days=[0]).num_rows()
        yield {"raw": root / "raw", "sessions": root / "sessions", "rows": rows,
               "mean_session_length": round(m["rows"] / m["sessions"], 2),
               "sessions_per_day": cfg.sessions_per_day}


def batches(data: Path, dedup_: bool, n: int, hash_sizes: dict[str, int]) -> list[Batch]:
    """The first `n` batches of day 0 (the same impressions in either form)."""
    ld = BatchLoader(data, batch_size(), days=[0], dedup=dedup_, hash_sizes=hash_sizes,
                     drop_last=True)
    out = list(islice(iter(ld), n))
    if len(out) < n:
        raise ValueError(f"day 0 holds {len(out)} batches of {batch_size()}, {n} wanted")
    return out


def student_hash_sizes(data: Path) -> dict[str, int]:
    schema, _ = read_schema(data)
    return model_hash_sizes(build_model("student", schema, MODEL, device="meta"))


def time_steps(runs: dict[str, tuple[Callable[[Any], None], list[Any]]], warmup: int,
               repeat: int) -> dict[str, float]:
    """Best seconds per pass over its data for each named (step, data), after `warmup`
    steps each; the passes alternate between the runs, so load that comes and goes on a
    shared machine disturbs them alike."""
    for step, data in runs.values():
        for b in data[:warmup]:
            step(b)
    best = {name: float("inf") for name in runs}
    for _ in range(repeat):
        for name, (step, data) in runs.items():
            sync()
            t0 = time.perf_counter()
            for b in data:
                step(b)
            sync()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def sync() -> None:
    """Wait for the GPU's queued work (timing); nothing on the CPU."""
    if device() == "cuda":
        torch.cuda.synchronize()


@contextmanager
def project_step(data: Path, model_cfg: ModelConfig = MODEL
                 ) -> Iterator[Callable[[Batch], None]]:
    """The project's training step, as lrm.train.loop runs it: the student sharded by DMP
    (one process), fused row-wise Adagrad on the tables, fused AdamW on the dense part, the
    non-finite guard and the device-side meter, through torchrec's TrainPipelineSparseDist
    (here a segment of one batch per call: no overlap between calls)."""
    quiet_libraries()
    schema, _ = read_schema(data)
    with process_group(device()) as env:
        torch.manual_seed(0)
        model = build_model("student", schema, model_cfg, device="meta",
                            dense_device=env.device)
        made: list[tuple[Any, NonFiniteGuard]] = []

        def step(b: Batch) -> None:
            if not made:  # the loop's choice of steps depends on the batches' form
                _, steps, guard = lrm_steps(env, model, batch_size(), b.windows is not None)
                made.append((steps, guard))
            made[0][0].step(iter([b]))

        yield step
        if made:
            made[0][1].check()


def lrm_steps(env: Dist, model: nn.Module, batch: int, windows: bool = False
              ) -> tuple[nn.Module, Steps | GraphSteps, NonFiniteGuard]:
    """(DMP, steps, guard) of lrm.train.loop's step for `model` (tables on meta) at `batch`
    rows a step, as the loop chooses them: on one GPU whole-step CUDA graphs
    (lrm.train.step_graph) unless the batches have shared histories (`windows`), else
    torchrec's pipeline with the dense MLPs as CUDA graphs on a GPU; DMP, fused row-wise
    Adagrad on the tables, fused AdamW on the dense part, the device-side non-finite guard
    and meter."""
    cfg = TrainConfig()
    if cfg.cuda_graphs:
        graph_mlps(model, batch, env.device, cfg.amp)
    dmp = parallel.shard(model, env, embedding_lr=EMBEDDING_LR, seed=0)
    guard = NonFiniteGuard(env, lambda step, v: f"non-finite loss at step {step}: {v}")
    dense, adamw = dense_optimizer(dmp, LR, 0.0)
    guard.gate(dmp, adamw)
    opt = parallel.optimizer(dmp, dense)
    meter = Meter(env, 100_000)

    def step_fn(b: Batch) -> tuple[torch.Tensor, None]:
        with autocast(env.device, cfg.amp):
            loss, serving = bce_loss(dmp, b)
        meter.record(serving, b.labels, guard.watch(loss))
        return loss, None

    if cfg.cuda_graphs and unsupported(dmp, env.world_size, env.device, windows) is None:
        return dmp, GraphSteps(dmp, opt, env.device, step_fn, batch=batch), guard
    return dmp, Steps(dmp, opt, env.device, step_fn), guard
