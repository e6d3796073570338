"""Checkpoint benchmarks: `python bench/checkpoint.py [--quick | --smoke]` prints one JSON line
per case.

checkpoint.bytes    bytes of a delta (rows changed in the last k steps, int4 / int8 / fp32,
                    plus the exact dense state) vs a full fp32 save of the same state, k = 10,
                    100 (and 1000, full run); bytes written per checkpoint by an int4 chain
                    every 100 steps with the default chain policy (baselines included: the
                    aim, >= 17x, Check-N-Run's upper figure; with the mean bytes per
                    checkpoint of its baselines' and deltas' files, and the full saves',
                    by what they hold) and every 10 steps, and stored at the end, vs full
                    fp32 saves
checkpoint.stall    the time the training loop waits per checkpoint: int4 delta written in
                    the background vs a synchronous full fp32 save; training samples/s with
                    an int4 delta every 100 steps (the aim: >= 0.98) and every 10 vs none
checkpoint.restore  restore time of a baseline + 10 int4 deltas vs one full fp32 checkpoint
checkpoint.ne       held-out NE of the model restored from the int4 chain saved every 100
                    steps vs the fp32 model it saved (the aim: within 0.01%; the bench exits
                    1 when it is not); after restoring int4 / int8 chains and training on,
                    vs restoring an unquantized checkpoint and training on

The data is the synthetic session log at its defaults (100k Zipf-popular users, 10k ads)
with histories of up to 20 ads, day 0 trains, day 1 is held out; --quick: 20,000 sessions
a day, the full run 150,000 (each run stays within one pass over day 0; --smoke: a tiny
world at batch 128, and the NE aim is reported, not enforced). The model is the
default student (d=16), batch 1024, one intra-op thread (the writer thread has the other
core). Each run trains the same batches from the same initial weights with
lrm.checkpoint.CheckpointManager called once a step, as lrm.train.loop does. A delta's rows
are those the batches of its interval looked up (which is what the tracker reports,
tests/checkpoint/test_tracker.py).

Timing: the runs train in turns of 100 steps (50 with --quick; the checkpoint of a run
saving every 100 steps falls mid-turn, and a turn ends when its write is done), no
checkpoints and every 100 in alternating order, so load that comes and goes on a shared
machine disturbs both alike; each line gives the machine's load average, the median of the
turns' paired ratios beside the ratio of the totals, and `cpu_ratio`: the ratio of the
CPU seconds the process spent (training and writer threads), which waiting for a busy
machine's cores does not inflate.
"""

from __future__ import annotations

import argparse
import os
import statistics
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

from bench.cases.data_profiles import tiny  # noqa: E402
from bench.common import add_mode_flags, emit, smoke, use_mode  # noqa: E402
from lrm.checkpoint import CheckpointManager, Store  # noqa: E402
from lrm.checkpoint import snapshot  # noqa: E402
from lrm.checkpoint.snapshot import Reconstruction  # noqa: E402
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
from lrm.metrics import score  # noqa: E402
from lrm.train.evaluate import predict  # noqa: E402
from lrm.train.state import TrainState  # noqa: E402
from lrm.train.steps import dense_optimizer  # noqa: E402

BATCH, LR, EMBEDDING_LR = 1024, 1e-3, 0.05
MODEL = ModelConfig()
ID = {"bench": "checkpoint"}
NE_AIM = 1e-4  # relative held-out NE of a restored int4 chain vs the fp32 model it saved


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextmanager
def dataset(quick: bool) -> Iterator[Path]:
    # enough sessions that the run stays within one pass over day 0 (one pass overfits
    # nothing, so the held-out NE of checkpoint.ne is that of a model in training)
    cfg = tiny(days=2, sessions=1_000, max_history=20) if smoke() else \
        GenerateConfig(days=2, sessions_per_day=20_000 if quick else 150_000, max_history=20)
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
        self.cpu_s = 0.0

    def train(self, steps: int, ck: CheckpointManager | None = None, finish: bool = True
              ) -> float:
        """Train `steps` more steps; wall seconds, checkpoint waits included (and the
        process's CPU seconds, every thread's, added to `cpu_s`)."""
        self.dmp.train()
        t0, c0 = time.perf_counter(), time.process_time()
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
        self.cpu_s += time.process_time() - c0
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
    """Write one checkpoint's files of the run's state (a baseline, or a delta of `touched`
    rows over a chain that restores to the state as it is); bytes."""
    out.mkdir(parents=True)
    state = {k: v.state_dict() for k, v in run.parts.items()}
    tables = table_shards(state["model"], state["optim"])
    recon = Reconstruction()
    recon.reset(tables)
    snap = snapshot.capture(state, tables, touched, dense=True)
    rows, _ = snapshot.write_rows(snap, q, out / "rows-0.pt", baseline=touched is None,
                                  recon=recon)
    dense, _ = snapshot.write_dense(snap, out / "state.pt")
    return {"rows": rows["bytes"], "dense": dense["bytes"], "rows_written": snap.num_rows(),
            "total": rows["bytes"] + dense["bytes"]}


def _entries(root: Path) -> list[Any]:
    return Store(root).entries()


def _by_file(entries: list[Any]) -> dict[str, float]:
    """Mean bytes per checkpoint of `entries` by what the files hold: rows (ids, rows,
    row-wise state), dense (parameters, optimizer state, train state), json (each rank's
    part file; the manifest lists every file but itself, so no checkpoint's bytes count
    it)."""
    out = {"rows": 0.0, "dense": 0.0, "json": 0.0}
    for e in entries:
        for name, f in e.manifest["files"].items():
            kind = "json" if name.endswith(".json") else \
                "dense" if name == snapshot.DENSE_FILE else "rows"
            out[kind] += f["bytes"] / len(entries)
    return {k: round(v) for k, v in out.items()}


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
    add_mode_flags(ap)
    args = ap.parse_args()
    quick = use_mode(args)
    batch = 128 if smoke() else BATCH
    quiet_libraries()
    torch.set_num_threads(1)
    steps, more, segment = (110, 30, 50) if quick else (1100, 100, 100)
    intervals = (10, 100) if quick else (10, 100, 1000)
    load = _load()
    with dataset(quick) as data, tempfile.TemporaryDirectory(prefix="lrm-bench-ck-") as tmp, \
            process_group("cpu") as env:
        tmp = Path(tmp)
        schema, _ = read_schema(data)
        probe = build_model("student", schema, MODEL, device="meta")
        sizes = model_hash_sizes(probe)
        batches = list(BatchLoader(data, batch, days=[0], drop_last=True, dedup=True,
                                   hash_sizes=sizes))
        held_out = BatchLoader(data, 4096, days=[1], dedup=True, hash_sizes=sizes)
        common = {"batch_size": batch, "steps": steps, "epoch_steps": len(batches),
                  "embedding_dim": MODEL.student.embedding_dim}

        # -- runs: none | int4 every 100, default chain policy | int4 chain every 10,
        # background | full fp32, synchronous | int8 chain --------------------------------
        chain_cfg = CheckpointConfig(every=10, deltas=10, delta_budget=100.0, keep=1000,
                                     quantize="int4")
        cfgs = {"int4_100": CheckpointConfig(every=100, keep=1000, quantize="int4"),
                "int4": chain_cfg,
                "full": replace(chain_cfg, deltas=0, quantize="none", background=False),
                "int8": replace(chain_cfg, quantize="int8")}
        none = Run(env, data, batches)
        runs: dict[str, tuple[Run, CheckpointManager | None]] = {"none": (none, None)}
        for name, cfg in cfgs.items():
            r = Run(env, data, batches)
            ck = CheckpointManager(tmp / name, env, cfg, ID)
            ck.start(r.parts, False)
            runs[name] = (r, ck)
        # turns of `segment` steps from mid-interval on: every turn of int4_100 holds one
        # save and its write; none and int4_100 take turns first by turns
        turns = [segment // 2] + [segment] * ((steps - segment // 2) // segment)
        turns += [steps - sum(turns)] if steps > sum(turns) else []
        secs: dict[str, list[float]] = {name: [] for name in runs}
        for k, n in enumerate(turns):
            last = k == len(turns) - 1
            pair = ["none", "int4_100"] if k % 2 == 0 else ["int4_100", "none"]
            for name in pair + [x for x in runs if x not in pair]:
                r, ck = runs[name]
                secs[name].append(r.train(n, ck, finish=last))
        for _, ck in runs.values():
            if ck is not None:
                ck.stall_s /= len(_entries(ck.root))  # per checkpoint
        keys = table_shards(none.dmp.state_dict(), None)
        features = {f: key for key in keys for m in probe.modules()
                    if type(m).__name__ == "EmbeddingBagCollection"
                    for t in m.embedding_bag_configs() if key.endswith(f".{t.name}.weight")
                    for f in t.feature_names}
        table_rows = sum(s[0].rows for s in keys.values())
        common["load_avg"] = [load, _load()]  # 1, 5, 15 min, at the start and now

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
        ef = _entries(tmp / "full")
        meanf = sum(e.bytes for e in ef) / len(ef)
        e100 = _entries(tmp / "int4_100")
        emit("checkpoint.bytes", "int4 chain every 100 steps, the default chain policy: bytes "
             "written per checkpoint (baselines included) vs per full fp32 save", "bytes",
             sum(e.bytes for e in e100) / len(e100), meanf, "lower", aim=17.0,
             checkpoints=[[e.kind, e.bytes] for e in e100],
             baseline_files=_by_file([e for e in e100 if e.kind == "baseline"]),
             delta_files=_by_file([e for e in e100 if e.kind == "delta"]),
             full_files=_by_file(ef), **common)
        e4 = [e for e in _entries(tmp / "int4") if e.kind == "delta"]
        emit("checkpoint.bytes", "int4 chain every 10 steps: bytes per delta written in "
             "training vs per full fp32 save", "bytes", sum(e.bytes for e in e4) / len(e4),
             meanf, "lower", deltas=len(e4), **common)
        emit("checkpoint.bytes", f"written over {steps} steps, every 10: int4 chain (a "
             "baseline per 10 deltas) vs full fp32 saves", "bytes",
             sum(e.bytes for e in _entries(tmp / "int4")), sum(e.bytes for e in ef), "lower",
             **common)
        emit("checkpoint.bytes", "stored at the end, keep 2: int4 chains vs full fp32 saves",
             "bytes", _stored(tmp / "int4", 2), _stored(tmp / "full", 2), "lower",
             **common)

        # -- checkpoint.stall -----------------------------------------------------------
        stall = {n: ck.stall_s for n, (_, ck) in runs.items() if ck is not None}
        emit("checkpoint.stall", "loop wait per checkpoint: int4 chain in the background vs "
             "synchronous full fp32 save", "s", stall["int4"], stall["full"], "lower",
             **common)
        for name, every in (("int4_100", 100), ("int4", 10)):
            paired = [b / a for a, b in zip(secs[name], secs["none"], strict=True)]
            emit("checkpoint.stall", f"samples/s with an int4 delta every {every} steps vs "
                 "none", "samples/s", steps * batch / sum(secs[name]),
                 steps * batch / sum(secs["none"]), "higher",
                 **({"aim": 0.98} if every == 100 else {}),
                 turn_ratio_median=round(statistics.median(paired), 4),
                 turn_ratios=[round(x, 4) for x in paired],
                 cpu_ratio=round(runs["none"][0].cpu_s / runs[name][0].cpu_s, 4), **common)

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

        # -- checkpoint.ne: the restored int4 chain as it is; restore and train on ------------
        r = Run(env, data, batches)
        r.restore(tmp / "int4_100")
        assert r.state.step == steps
        fp32, restored = none.ne(held_out), r.ne(held_out)
        rel = restored / fp32 - 1
        emit("checkpoint.ne", "held-out NE of the model restored from the int4 chain saved "
             "every 100 steps vs the fp32 model it saved", "NE", restored, fp32, "lower",
             ne_delta=restored - fp32, ne_rel=rel, aim_rel=NE_AIM,
             chain=[e.kind for e in e100], **common)
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
    if abs(rel) > NE_AIM and not smoke():  # a smoke run's few steps on tiny data: no aim
        raise SystemExit(f"checkpoint.ne: the restored int4 chain's held-out NE is "
                         f"{rel:+.4%} from the fp32 model's (aim: within {NE_AIM:.2%})")


if __name__ == "__main__":
    main()
