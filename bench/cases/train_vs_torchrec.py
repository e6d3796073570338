"""train.vs_torchrec: lrm's student against torchrec's own DLRM, trained on the same batches.

The shape: the peers' standard benchmark, ~200k training impressions (synthetic sessions,
day 0; day 1 held out), batch 1024, embedding dim 16, bottom MLP 512-256-64 (then 16, the
embedding dim), top MLP 512-256 (then the logit). --quick: ~40k impressions. `--batch B`
trains at batch B on a day large enough for MIN_STEPS steps of it (the GPU aims: 2048 and
16384). --smoke: a tiny world, batch 256, a few steps.

The baseline is what a torchrec user writes: `torchrec.models.dlrm.DLRM` (one
EmbeddingBagCollection over every sparse feature, the same tables: rows, dim, pooling) in
`DLRMTrain`, sharded by DMP with fbgemm's fused row-wise Adagrad, AdamW on the dense part,
driven by `TrainPipelineSparseDist`, fed per-impression batches (DLRM has no per-session
form). The candidate is lrm's training step as `lrm.train.train` runs it: the DLRM student
(RecD batches: user features once per session), the same pipeline, the non-finite guard and
the device-side meter, fused AdamW; on one GPU, instead of the pipeline, each step one CUDA
graph replay (TrainConfig.cuda_graphs, lrm.train.step_graph: captured after 3 uncaptured
steps, all within the untimed warm-up). Same learning rates, seed, threads, process.

Both train one pass over the same impressions, in alternating segments of 4 steps (32 on a
GPU) so that load that comes and goes on a shared machine hits both alike, after 4 warm-up
steps each; samples/s is impressions / the summed time of their segments. Then each scores
the held-out day: NE (lower is better) is reported beside the speed; the aim is a faster
lrm at equal or better NE. A second line, `host_ms_per_step`, is the main thread's CPU time
per step (time.thread_time over the same segments): on a GPU, the host's share of a step,
which bounds the step once the GPU's own work is short (the aim: <= 2 ms at batch 2048).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torchrec import EmbeddingBagCollection
from torchrec.datasets.utils import Batch as TorchrecBatch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from bench.cases.data_profiles import tiny
from bench.cases.train_common import EMBEDDING_LR, LR, lrm_steps, sessions_for, sync
from bench.common import emit, smoke
from lrm import metrics
from lrm.config import DedupConfig, GenerateConfig, ModelConfig, StudentModelConfig, \
    TableConfig
from lrm.data import dedup, synthetic
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import FeatureSchema, read_schema
from lrm.dist import Dist, process_group, quiet_libraries
from lrm.models import build_model, embedding_tables
from lrm.sharding import parallel
from lrm.train.data import model_hash_sizes

BATCH, DIM = 1024, 16
MODEL = ModelConfig(student=StudentModelConfig(embedding_dim=DIM, bottom_mlp=[512, 256, 64],
                                               top_mlp=[512, 256]))
WARMUP = 4
MIN_STEPS = {True: 8, False: 80}  # batches a training day holds at least (quick, full)
SMOKE_STEPS = 4
SEGMENT = {"cpu": 4, "cuda": 32}  # steps a side runs in turn (on a GPU: room to overlap)


def sessions_per_day(quick: bool, batch: int) -> int:
    """~200k impressions a day (quick: ~40k), more where MIN_STEPS batches need them."""
    if smoke():
        return sessions_for((WARMUP + SMOKE_STEPS) * batch)
    return max(5_000 if quick else 25_000, sessions_for((WARMUP + MIN_STEPS[quick]) * batch))


@contextmanager
def dataset(quick: bool, batch: int = BATCH) -> Iterator[dict[str, Any]]:
    """Day 0 trains, day 1 (as large) is held out; see sessions_per_day."""
    n = sessions_per_day(quick, batch)
    cfg = tiny(days=2, sessions=n) if smoke() else GenerateConfig(days=2, sessions_per_day=n)
    with tempfile.TemporaryDirectory(prefix="lrm-bench-vs-torchrec-") as tmp:
        root = Path(tmp)
        synthetic.generate(cfg, root / "raw")
        dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
        yield {"sessions": root / "sessions"}


def _load(data: Path, day: int, recd: bool, sizes: dict[str, int], batch: int,
          drop_last: bool) -> list[Batch]:
    return list(BatchLoader(data, batch, days=[day], dedup=recd, hash_sizes=sizes,
                            drop_last=drop_last, prefetch=0))


def torchrec_batch(b: Batch, keys: list[str]) -> TorchrecBatch:
    """The same impressions as torchrec's Batch: one KJT of every sparse feature."""
    assert not b.deduped
    feats = {**b.user.to_dict(), **b.item.to_dict()}
    kjt = KeyedJaggedTensor.from_jt_dict({k: feats[k] for k in keys})
    return TorchrecBatch(dense_features=b.dense, sparse_features=kjt, labels=b.labels)


class _Segment(NamedTuple):
    """Steps a side ran in turn, and their seconds: wall, process CPU, this thread's CPU."""

    steps: int
    wall: float
    cpu: float
    thread: float


class _Side:
    """One contender: its sharded model, its pipeline, its batches, its clock."""

    def __init__(self, name: str, progress: Callable[[Iterator[Any]], Any], batches: list[Any],
                 score: Callable[[], float], detach: Callable[[], None]) -> None:
        self.name, self.progress, self.batches = name, progress, batches
        self.score, self.detach = score, detach
        self.at = 0
        self.segments: list[_Segment] = []

    def run(self, n: int, timed: bool = True) -> None:
        k = min(n, len(self.batches) - self.at)
        seg = iter(self.batches[self.at:self.at + k])
        sync()
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(k):
            self.progress(seg)
        h1 = time.thread_time()  # before the sync: the host's own work, not its wait
        sync()
        if timed:
            self.segments.append(_Segment(k, time.perf_counter() - t0,
                                          time.process_time() - c0, h1 - h0))
        self.at += k

    @property
    def seconds(self) -> float:
        return sum(s.wall for s in self.segments)

    def per_step(self, what: str, median: bool) -> float:
        """Seconds a step of `what` (a _Segment field): over every segment, or the median
        segment's."""
        if not median:
            return sum(getattr(s, what) for s in self.segments) / \
                sum(s.steps for s in self.segments)
        return statistics.median(getattr(s, what) / s.steps for s in self.segments)

    @property
    def done(self) -> bool:
        return self.at >= len(self.batches)


def _eval_ne(forward: Callable[[Any], torch.Tensor], batches: list[Any],
             labels: Callable[[Any], torch.Tensor]) -> float:
    with torch.no_grad():
        logits = torch.cat([forward(b).float().reshape(-1).cpu() for b in batches])
        y = torch.cat([labels(b).float().cpu() for b in batches])
    return metrics.normalized_entropy(logits, y)


def _lrm_side(data: Path, env: Dist, train: list[Batch], held_out: list[Batch],
              batch: int) -> _Side:
    schema, _ = read_schema(data)
    torch.manual_seed(0)
    model = build_model("student", schema, MODEL, device="meta", dense_device=env.device)
    clicks = sum(float(b.labels.sum()) for b in train)
    model.init_output_bias(clicks / sum(b.size for b in train))  # type: ignore[operator]
    dmp, steps, _ = lrm_steps(env, model, batch)  # lrm.train.loop's step
    return _Side("lrm", steps.step, [b.to(env.device) for b in train],
                 lambda: _eval_ne(dmp, [b.to(env.device) for b in held_out],
                                  lambda b: b.labels),
                 steps.pause)


class TorchrecDLRM(NamedTuple):
    """torchrec's DLRM as a torchrec user trains it: sharded, its pipeline, its forward."""

    dmp: nn.Module
    pipeline: TrainPipelineSparseDist
    keys: list[str]  # the sparse features, in its KJT's order

    def forward(self, b: TorchrecBatch) -> torch.Tensor:
        return self.dmp(b)[1][1]  # DLRMTrain: (loss, (loss, logits, labels))


def torchrec_dlrm(schema: FeatureSchema, env: Dist, tables: TableConfig = MODEL.tables,
                  seed: int = 0, lr: float = LR) -> TorchrecDLRM:
    """`torchrec.models.dlrm.DLRM` over lrm's tables of `schema` (one collection), the
    benchmark's shape, DMP with fused row-wise Adagrad, AdamW (`lr`) on the dense part,
    driven by TrainPipelineSparseDist."""
    emb = embedding_tables(schema, tables, DIM)  # lrm's tables, one collection
    keys = [f for t in emb for f in t.feature_names]
    torch.manual_seed(seed)
    dlrm = DLRM(embedding_bag_collection=EmbeddingBagCollection(emb, device=torch.device(
        "meta")), dense_in_features=len(schema.dense),
        dense_arch_layer_sizes=[*MODEL.student.bottom_mlp, DIM],
        over_arch_layer_sizes=[*MODEL.student.top_mlp, 1], dense_device=env.device)
    dmp = parallel.shard(DLRMTrain(dlrm), env, embedding_lr=EMBEDDING_LR, seed=seed)
    dense = KeyedOptimizerWrapper(
        {k: p for k, p in dmp.named_parameters() if not hasattr(p, "_in_backward_optimizers")},
        lambda ps: torch.optim.AdamW(ps, lr=lr))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense])
    return TorchrecDLRM(dmp, TrainPipelineSparseDist(dmp, opt, env.device), keys)


def _torchrec_side(data: Path, env: Dist, train: list[Batch], held_out: list[Batch]
                   ) -> _Side:
    schema, _ = read_schema(data)
    t = torchrec_dlrm(schema, env)
    dmp, pipeline, keys, forward = t.dmp, t.pipeline, t.keys, t.forward

    def score() -> float:
        dmp.eval()
        try:
            return _eval_ne(forward, [torchrec_batch(b, keys).to(env.device)
                                      for b in held_out], lambda b: b.labels)
        finally:
            dmp.train()

    return _Side("torchrec", pipeline.progress, [torchrec_batch(b, keys).to(env.device)
                                         for b in train], score, pipeline.detach)


def run(quick: bool = False, data: dict[str, Any] | None = None,
        device: str = "cpu", batch: int = BATCH) -> None:
    quiet_libraries()
    with dataset(quick, batch) as d, process_group(device) as env:
        path = d["sessions"]
        schema, _ = read_schema(path)
        sizes = model_hash_sizes(build_model("student", schema, MODEL, device="meta"))
        recd = _load(path, 0, True, sizes, batch, True)
        plain = _load(path, 0, False, sizes, batch, True)
        held_out = _load(path, 1, True, sizes, 8192, False)
        held_plain = _load(path, 1, False, sizes, 8192, False)
        sides = [_lrm_side(path, env, recd, held_out, batch),
                 _torchrec_side(path, env, plain, held_plain)]
        for s in sides:
            s.run(WARMUP, timed=False)
        while not all(s.done for s in sides):
            for s in sides:
                s.run(SEGMENT[env.device.type])
        for s in sides:
            s.detach()
        ne = {s.name: s.score() for s in sides}
        n = (len(recd) - WARMUP) * batch
        lrm, tr = sides
        # beside the headline (all segments' wall time), two views that a shared machine's
        # load disturbs less: the median segment, and this process's CPU time
        robust = {f"ratio_{name}": round(tr.per_step(what, median) / lrm.per_step(what, median),
                                         4)
                  for name, what, median in (("median_segment", "wall", True),
                                             ("cpu_time", "cpu", False))}
        shape = {"device": str(env.device), "batch_size": batch, "embedding_dim": DIM,
                 "bottom_mlp": MODEL.student.bottom_mlp, "top_mlp": MODEL.student.top_mlp,
                 "steps": len(recd), "threads": torch.get_num_threads()}
        emit("train.vs_torchrec", "student_vs_dlrm", "samples/s", n / lrm.seconds,
             n / tr.seconds, "higher", **robust, **shape, train_rows=len(recd) * batch,
             held_out_rows=sum(b.size for b in held_out),
             ne_candidate=round(ne["lrm"], 5), ne_baseline=round(ne["torchrec"], 5),
             candidate_is="lrm student (RecD batches, TrainPipelineSparseDist, fused "
                          "Adagrad + fused AdamW, device-side guard; on one GPU whole-step "
                          "CUDA graphs)",
             baseline_is="torchrec.models.dlrm.DLRM in DLRMTrain, DMP, fused Adagrad + "
                         "AdamW, TrainPipelineSparseDist, per-impression batches")
        emit("train.vs_torchrec", "host_ms_per_step", "ms", 1e3 * lrm.per_step("thread", False),
             1e3 * tr.per_step("thread", False), "lower", **shape, aim_ms_at_2048=2.0,
             wall_ms_per_step={s.name: round(1e3 * s.per_step("wall", False), 3)
                               for s in sides},
             candidate_is="lrm student's step: the main thread's CPU time per step",
             baseline_is="torchrec DLRM's step: the main thread's CPU time per step")
