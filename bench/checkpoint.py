"""Checkpoint benchmarks: `python bench/checkpoint.py [--quick]` prints one JSON line per case.

checkpoint.bytes    bytes of a delta (rows looked up in the last k steps, int4 / int8 / fp32,
                    plus the exact dense state) vs a full fp32 save of the same state, k = 10,
                    100 (and 1000, full run); bytes written per checkpoint and stored at the
                    end by an int4 chain vs full saves during training
checkpoint.stall    the time the training loop waits per checkpoint: int4 delta written in
                    the background vs a synchronous full fp32 save; training samples/s with
                    an int4 delta every 10 steps (and every 100, full run) vs no checkpoints
checkpoint.restore  restore time of a baseline + 10 int4 deltas vs one full fp32 checkpoint
checkpoint.ne       held-out NE after restoring an int4 / int8 chain and training on, vs
                    restoring an unquantized checkpoint and training on

The data is the synthetic session log at its defaults (100k Zipf-popular users, 10k ads)
with histories of up to 20 ads, day 0 trains, day 1 is held out; --quick: 20,000 sessions
a day, the full run 150,000 (each run stays within one pass over day 0). The model is the default student (d=16), batch 1024, one
intra-op thread (the writer thread has the other core). Each run trains the same batches
from the same initial weights with lrm.checkpoint.CheckpointManager called once a step,
as lrm.train.loop does. A delta's rows are those the batches of its interval looked up
(which is what the tracker reports, tests/checkpoint/test_tracker.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import emit  # noqa: E402
from lrm.checkpoint import CheckpointManager, Store  # noqa: E402
from lrm.checkpoint import snapshot  # noqa: E402
from lrm.checkpoint.tables import table_shards  # noqa: E402
from lrm.config import CheckpointConfig, DedupConfig, GenerateConfig, ModelConfig  # noqa: E402
from lrm.data import dedup, synthetic  # noqa: E402
from lrm.data.batch import Batch  # noqa: E402
from lrm.data.loader import BatchLoader  # noqa: E402
from lrm.data.schema import read_schema  # noqa: E402
from lrm.dist import Dist, process_group, quiet_libraries  # noqa: E402
from lrm.models import build_model  # noqa: E402
from lrm.sharding import parallel  # noqa: E402
from lrm.train.data import model_hash_sizes  # noqa: E402
from lrm.train.evaluate import predict, score  # noqa: E402
from lrm.train.state import TrainState  # noqa: E402
from lrm.train.steps import dense_optimizer  # noqa: E402

BATCH, LR, EMBEDDING_LR = 1024, 1e-3, 0.05
MODEL = ModelConfig()
ID = {"bench": "checkpoint"}
INFO = "under load: 2 shared cores, 6 engineers at work (timings noisy; bytes exact)"


@contextmanager
def dataset(quick: bool) -> Iterator[Path]:
    # enough sessions that the run stays within one pass over day 0 (one pass overfits
    # nothing, so the held-out NE of checkpoint.ne is that of a model in training)
    cfg = GenerateConfig(days=2, sessions_per_day=20_000 if quick else 150_000, max_history=20)
    with tempfile.TemporaryDirectory(prefix="lrm-bench-ckpt-") as tmp:
        synthetic.generate(cfg, Path(tmp) / "raw")
        dedup.dedup_dataset(Path(tmp) / "raw", Path(tmp) / "sessions", DedupConfig())
        yield Path(tmp) / "sessions"


class Run:
    """One training run of the student on prepared batches (the loop's steps)."""

    def __init__(self, env: Dist, data: Path, batches: list[Batch]) -> None:
        schema, _ = read_schema(data)
        torch.manual_seed(0)
        model = build_model("student", schema, MODEL, device="meta", dense_device=env.device)
        self.dmp = parallel.shard(model, env, embedding_lr=EMBEDDING_LR, seed=0)
        dense, _ = dense_optimizer(self.dmp, LR, 0.0)  # the loop's: fused AdamW
        self.dense, self.state = dense, TrainState()
        self.opt = parallel.optimizer(self.dmp, dense)
        self.parts = {"model": self.dmp, "optim": self.opt, "train": self.state}
        self.env, self.batches = env, batches

    def train(self, steps: int, ck: CheckpointManager | None = None, finish: bool = True
              ) -> float:
        """Train `steps` more steps; wall seconds, checkpoint waits included."""
        self.dmp.train()
        t0 = time.perf_counter()
        for _ in range(steps):
            b = self.batches[self.state.step % len(self.batches)]
            loss = F.binary_cross_entropy_with_logits(self.dmp(b).float(), b.labels)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.state.step += 1
            if ck is not None:
                ck.step(self.state.step, self.parts)
        if ck is not None and finish:
            ck.finish(self.state.step, self.parts)
        elif ck is not None:
            ck.wait()  # the write in flight belongs to this pass
        return time.perf_counter() - t0

    def restore(self, root: Path) -> float:
        """Resume from `root`; seconds (verification, reading, dequantizing, loading)."""
        t0 = time.perf_counter()
        with CheckpointManager(root, self.env, CheckpointConfig(), ID) as ck:
            ck.start(self.parts, True, prepare=self.dense.init_state)
        return time.perf_counter() - t0

    def ne(self, held_out: BatchLoader) -> float:
        logits, labels = predict(self.dmp, held_out, self.env.device)
        return float(score(logits, labels)["ne"])


def _touched(batches: list[Batch], features: dict[str, str]) -> dict[str, torch.Tensor]:
    """{table weight key: rows looked up by `batches`} (ids are table rows: the loader
    hashed them)."""
    ids: dict[str, list[torch.Tensor]] = {}
    for b in batches:
        for kjt in (b.user, b.item):
            for f in kjt.keys():
                if f in features:
                    ids.setdefault(features[f], []).append(kjt[f].values())
    return {k: torch.unique(torch.cat(v)) for k, v in ids.items()}


def _write(run: Run, touched: dict[str, torch.Tensor] | None, q: str, out: Path
           ) -> dict[str, int]:
    """Write one checkpoint's files of the run's state (rows: all or `touched`); bytes."""
    out.mkdir(parents=True)
    state = {k: v.state_dict() for k, v in run.parts.items()}
    tables = table_shards(state["model"], state["optim"])
    snap = snapshot.capture(state, tables, touched, dense=True)
    rows, _ = snapshot.write_rows(snap, q, out / "rows-0.pt")
    dense, _ = snapshot.write_dense(snap, out / "state.pt")
    return {"rows": rows["bytes"], "dense": dense["bytes"], "rows_written": snap.num_rows(),
            "total": rows["bytes"] + dense["bytes"]}


def _entries(root: Path) -> list[Any]:
    return Store(root).entries()


def _stored(root: Path, keep: int) -> int:
    """Bytes the newest `keep` chains of `root` take (retention's view)."""
    entries = _entries(root)
    newest: dict[str, int] = {}
    for e in entries:
        newest[e.chain] = max(newest.get(e.chain, 0), e.seq)
    kept = sorted(newest, key=newest.get, reverse=True)[:keep]  # type: ignore[arg-type]
    return sum(e.bytes for e in entries if e.chain in kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    args = ap.parse_args()
    quick = args.quick
    quiet_libraries()
    torch.set_num_threads(1)
    steps, more = (110, 30) if quick else (1100, 100)
    intervals = (10, 100) if quick else (10, 100, 1000)
    with dataset(quick) as data, tempfile.TemporaryDirectory(prefix="lrm-bench-ck-") as tmp, \
            process_group("cpu") as env:
        tmp = Path(tmp)
        schema, _ = read_schema(data)
        probe = build_model("student", schema, MODEL, device="meta")
        sizes = model_hash_sizes(probe)
        batches = list(BatchLoader(data, BATCH, days=[0], drop_last=True, dedup=True,
                                   hash_sizes=sizes))
        held_out = BatchLoader(data, 4096, days=[1], dedup=True, hash_sizes=sizes)
        common = {"batch_size": BATCH, "steps": steps, "epoch_steps": len(batches),
                  "embedding_dim": MODEL.student.embedding_dim, "note": INFO}

        # -- runs: none | int4 chain, background | full fp32, synchronous | int8 chain ---------
        # none and int4 alternate in two passes, so load that comes and goes on a shared
        # machine disturbs both alike
        chain_cfg = CheckpointConfig(every=10, deltas=10, delta_budget=100.0, keep=1000,
                                     quantize="int4")
        cfgs = {"int4": chain_cfg,
                "full": replace(chain_cfg, deltas=0, quantize="none", background=False),
                "int8": replace(chain_cfg, quantize="int8")}
        if not quick:  # timed in the same alternating passes as "none"
            cfgs["int4_100"] = replace(chain_cfg, every=100)
        none = Run(env, data, batches)
        runs: dict[str, tuple[Run, CheckpointManager]] = {}
        for name, cfg in cfgs.items():
            r = Run(env, data, batches)
            runs[name] = (r, CheckpointManager(tmp / name, env, cfg, ID))
            runs[name][1].start(r.parts, False)
        secs = {name: 0.0 for name in ("none", *cfgs)}
        half = steps // 20 * 10
        for n, last in ((half, False), (steps - half, True)):
            secs["none"] += none.train(n)
            for name, (r, ck) in runs.items():
                secs[name] += r.train(n, ck, finish=last)
        for _, ck in runs.values():
            ck.stall_s /= len(_entries(ck.root))  # per checkpoint
        keys = table_shards(none.dmp.state_dict(), None)
        features = {f: key for key in keys for m in probe.modules()
                    if type(m).__name__ == "EmbeddingBagCollection"
                    for t in m.embedding_bag_configs() if key.endswith(f".{t.name}.weight")
                    for f in t.feature_names}
        table_rows = sum(s[0].rows for s in keys.values())
        t_none, t_int4 = secs["none"], secs["int4"]

        # -- checkpoint.bytes: deltas of the last k steps vs a full fp32 save ----------------
        full = _write(none, None, "none", tmp / "w-full")
        for k in intervals:
            last = [batches[s % len(batches)] for s in range(steps - k, steps)]
            touched = _touched(last, features)
            for q in ("int4", "int8", "none"):
                if q != "int4" and k != 100:
                    continue
                d = _write(none, touched, q, tmp / f"w-{q}-{k}")
                emit("checkpoint.bytes", f"{q} delta every {k} steps vs full fp32", "bytes",
                     d["total"], full["total"], "lower",
                     rows_written=d["rows_written"], table_rows=table_rows,
                     rows_bytes=d["rows"], dense_bytes=d["dense"],
                     full_rows_bytes=full["rows"], **common)
        e4 = [e for e in _entries(tmp / "int4") if e.kind == "delta"]
        ef = _entries(tmp / "full")
        mean4 = sum(e.bytes for e in e4) / len(e4)
        meanf = sum(e.bytes for e in ef) / len(ef)
        emit("checkpoint.bytes", "int4 chain every 10 steps: bytes per delta written in "
             "training vs per full fp32 save", "bytes", mean4, meanf, "lower",
             deltas=len(e4), **common)
        emit("checkpoint.bytes", f"written over {steps} steps, every 10: int4 chain (a "
             "baseline per 10 deltas) vs full fp32 saves", "bytes",
             sum(e.bytes for e in _entries(tmp / "int4")), sum(e.bytes for e in ef), "lower",
             **common)
        emit("checkpoint.bytes", "stored at the end, keep 2: int4 chains vs full fp32 saves",
             "bytes", _stored(tmp / "int4", 2), _stored(tmp / "full", 2), "lower",
             **common)

        # -- checkpoint.stall -----------------------------------------------------------
        emit("checkpoint.stall", "loop wait per checkpoint: int4 chain in the background vs "
             "synchronous full fp32 save", "s", runs["int4"][1].stall_s,
             runs["full"][1].stall_s, "lower", **common)
        emit("checkpoint.stall", "samples/s with an int4 delta every 10 steps vs none",
             "samples/s", steps * BATCH / t_int4, steps * BATCH / t_none, "higher", **common)
        if not quick:
            emit("checkpoint.stall", "samples/s with an int4 delta every 100 steps vs none",
                 "samples/s", steps * BATCH / secs["int4_100"], steps * BATCH / t_none,
                 "higher", **common)

        # -- checkpoint.restore: the newest chain (baseline + 10 deltas) vs one full ---------
        lineage, _ = Store(tmp / "int4").newest_restorable()
        assert lineage is not None and len(lineage) == 11, [e.name for e in lineage or []]
        best: dict[str, float] = {}
        for _ in range(2 if quick else 3):
            for name in ("int4", "full"):
                r = Run(env, data, batches)
                best[name] = min(best.get(name, float("inf")), r.restore(tmp / name))
        emit("checkpoint.restore", "baseline + 10 int4 deltas vs one full fp32 checkpoint",
             "s", best["int4"], best["full"], "lower",
             chain_bytes=sum(e.bytes for e in lineage), full_bytes=ef[-1].bytes, **common)

        # -- checkpoint.ne: restore, train `more` steps, held-out NE --------------------
        nes = {}
        for name in ("full", "int4", "int8"):
            r = Run(env, data, batches)
            r.restore(tmp / name)
            assert r.state.step == steps
            r.train(more)
            nes[name] = r.ne(held_out)
        for q in ("int4", "int8"):
            emit("checkpoint.ne", f"held-out NE after restoring an {q} chain and {more} more "
                 "steps vs an unquantized checkpoint", "NE", nes[q], nes["full"], "lower",
                 ne_delta=nes[q] - nes["full"], **common)


if __name__ == "__main__":
    main()
