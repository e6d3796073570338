"""train.real: lrm's default student and teacher against torchrec's DLRM on real logs, each
held out in time, on the same ingested rows and features.

The logs (../shared/data, beside the repo; a log that is absent is skipped with a line):

* criteo_sample: train.tsv, dev.tsv, test.tsv, a day per file (`lrm ingest criteo`):
  days 0-1 (7,609 rows) train, day 2 (test.tsv, 391 rows) is held out;
* mind_sample: behaviors.tsv through the MIND mapping of pipelines/logs/params.yaml
  (`lrm ingest logs`: page views exploded, a session per page view, the history column):
  days 0-4 (149,984 impressions) train, day 5 (39,375) is held out;
* synthetic_log (always run; not a real log): a world of the generator (`SYNTHETIC`: six
  days, 80,000 user ids of which ~9,000 come, ~240,000 impressions) written out as the flat
  CSV a user would bring (lrm.data.synthetic.export, as the world is: whole days, no codes;
  user, time, session id, item, click, categoricals, dense columns, item attributes, the
  surface; no histories) and read by `lrm ingest logs` with histories `auto` (the figures of
  the export's `FIELD` quirks are not measured here yet): a log of the size and shape of a real session-level log with a strong signal, unlike
  the two samples (MIND's models are all near NE 1). Not unseen data: some of lrm's defaults
  were chosen on the generator's default world, though never at this size or through this
  path.

Each is deduped (RecD), then trained three ways from the same seed:

* lrm's student and teacher: `lrm.train.train` with the built-in defaults (TrainConfig(),
  ModelConfig(), LoaderConfig(): what `lrm train` runs with the root params.yaml);
* the baseline: torchrec's DLRM as bench vs_torchrec builds it (`torchrec.models.dlrm.DLRM`
  over TableConfig()'s tables, DMP, fused row-wise Adagrad + AdamW, TrainPipelineSparseDist,
  per-impression batches of 1024), trained four ways: one pass over the train days (torchrec's
  example recipe), and up to 10 passes over all but their last tenth, keeping the epoch with
  the lowest NE on that tenth, each with AdamW at lr 1e-3 and 3e-3; the baseline is whichever
  scores the held-out day best (an oracle's choice: it favours the baseline, never lrm).

Each model scores every row of the held-out day. A line per (log, model): candidate = lrm's
NE, baseline = the DLRM's, ratio = baseline / candidate (> 1: lrm's NE is lower), with 95%
paired-bootstrap intervals (the same resampled rows for both; 200 resamples) of the ratio
and of each NE. --seeds N: every model with seeds 0..N-1; the headline is the mean NE, and
each seed's NEs ride along. --quick: the students only, one seed. --smoke: the students on
every twentieth line of the MIND sample and a tiny synthetic log, a few steps each, and the
DLRM's two recipes at one learning rate and at most two epochs (seconds: that it runs).
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import yaml

from bench.cases.train_vs_torchrec import DIM, torchrec_batch, torchrec_dlrm
from bench.common import emit, shared_data, smoke
from lrm.config import DedupConfig, GenerateConfig, IngestConfig, LogsConfig, ModelConfig, \
    ParamsConfig, TableConfig, TrainConfig
from lrm.data import criteo, dedup
from lrm.data.loader import BatchLoader
from lrm.data.logs import ingest as logs
from lrm.data.synthetic import export
from lrm.data.schema import day_files, read_schema
from lrm.dist import process_group, quiet_libraries
from lrm.models import embedding_tables, hash_sizes
from lrm.models.saved import load_model
from lrm import metrics
from lrm.train import TrainJob, train
from lrm.train.evaluate import predict

ROOT = Path(__file__).resolve().parents[2]
BATCH = 1024  # the baseline's batch
RESAMPLES = 200
VAL_FRACTION = 0.1  # of the train batches, the tuned baseline's validation slice
MAX_EPOCHS = 10  # the tuned baseline's most passes
LRS = (1e-3, 3e-3)  # the baseline's dense learning rates (lrm's old default and its new)


def mind_mapping() -> LogsConfig:
    """The MIND mapping, as pipelines/logs/params.yaml states it."""
    doc = yaml.safe_load((ROOT / "pipelines" / "logs" / "params.yaml").read_text())
    return LogsConfig(**{k: v for k, v in doc["ingest"]["logs"].items() if k != "files"})


def _criteo(raw: Path) -> bool:
    d = shared_data() / "criteo_sample"
    files = [d / f"{n}.tsv" for n in ("train", "dev", "test")]
    if not all(f.exists() for f in files):
        return False
    criteo.ingest(files, raw, IngestConfig(days="file"))
    return True


def _mind(raw: Path) -> bool:
    f = shared_data() / "mind_sample" / "behaviors.tsv"
    if not f.exists():
        return False
    if smoke():  # every twentieth page view: a few hundred, over all of the sample's days
        lines = f.read_text().splitlines(keepends=True)[::20]
        f = raw.parent / "behaviors.tsv"
        raw.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(lines))
    raw.mkdir(parents=True)
    logs.ingest([f], raw, mind_mapping())
    return True


SYNTHETIC = dict(users=80_000, ads=5_000, sessions_per_day=5_000, days=6)
SMOKE_SYNTHETIC = dict(users=5_000, ads=1_000, sessions_per_day=300, days=3)
SYNTHETIC_MAP = export.mapping()


def _synthetic(raw: Path) -> bool:
    """The generator's world as a user's flat click log (CSV), through `lrm ingest logs`."""
    log = raw.parent / "log.csv"
    raw.parent.mkdir(parents=True, exist_ok=True)  # write_log writes into an existing folder
    world = {**SYNTHETIC, **SMOKE_SYNTHETIC} if smoke() else SYNTHETIC
    export.write_log(GenerateConfig(**world), log)  # type: ignore[arg-type]
    raw.mkdir(parents=True)
    logs.ingest([log], raw, SYNTHETIC_MAP)
    return True


LOGS = {"criteo_sample": _criteo, "mind_sample": _mind, "synthetic_log": _synthetic}


def mapped_log(files: list[Path], mapping: str) -> tuple[str, Callable[[Path], bool]]:
    """(name, maker) of a user's log: `mapping` is `criteo` (`lrm ingest criteo`, a day
    per file) or a mapping file of `lrm ingest logs --map`; named after the mapping. A
    folder stands for its files, in order (numbers read as numbers: day2 before day10)."""
    from lrm.io import in_order

    files = [f for p in map(Path, files) for f in (in_order(
        x for x in p.iterdir() if x.is_file() and not x.name.startswith(".")) if p.is_dir()
        else [p])]
    if mapping == "criteo":
        def make(raw: Path) -> bool:
            criteo.ingest(files, raw, IngestConfig(days="file"))
            return True
        return "criteo_log", make
    path = Path(mapping)
    keys = yaml.safe_load(path.read_text()) or {}

    def make_log(raw: Path) -> bool:
        raw.mkdir(parents=True)
        logs.ingest(files, raw, LogsConfig(**{k: v for k, v in keys.items() if k != "files"}))
        return True
    return path.stem, make_log


def _lrm(kind: str, data: Path, seed: int, out: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of the held-out (last) day from lrm's `kind` with the defaults."""
    cfg = TrainConfig(seed=seed, device="cpu", **({"steps": 8} if smoke() else {}))
    if kind == "teacher":  # as `lrm train --model teacher` trains it (teacher.train)
        cfg = ParamsConfig(train=cfg).train_for("teacher")
    train(TrainJob(kind=kind, train=cfg, model=ModelConfig(), data=data, out=out))
    model, card = load_model(out)
    days = list(day_files(data))
    loader = BatchLoader(data, 8192, days=[days[-1]], hash_sizes=card.hash_sizes)
    return predict(model, loader, torch.device("cpu"))


def _scores(t: Any, batches: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    t.dmp.eval()
    try:
        with torch.no_grad():
            x = torch.cat([t.forward(b).float().reshape(-1) for b in batches])
    finally:
        t.dmp.train()
    return x, torch.cat([b.labels.float() for b in batches])


def _dlrm(data: Path, seed: int, epochs: int = 1, val: bool = False, lr: float = 1e-3
          ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(logits, labels) of the held-out (last) day from torchrec's DLRM, and its epochs: one
    pass over the train days (torchrec's example), or, with `val`, up to `epochs` passes
    over all but their last VAL_FRACTION, keeping the epoch whose NE there is lowest."""
    schema, _ = read_schema(data)
    days = list(day_files(data))
    sizes = hash_sizes(embedding_tables(schema, TableConfig(), DIM))
    with process_group("cpu") as env:
        t = torchrec_dlrm(schema, env, TableConfig(), seed, lr)
        train = [torchrec_batch(b, t.keys) for b in BatchLoader(
            data, BATCH, days=days[:-1], dedup=False, hash_sizes=sizes, drop_last=True)]
        held = [torchrec_batch(b, t.keys) for b in BatchLoader(
            data, 8192, days=[days[-1]], dedup=False, hash_sizes=sizes)]
        cut = len(train) - max(1, round(VAL_FRACTION * len(train))) if val else len(train)
        best: tuple[float, int, tuple[torch.Tensor, torch.Tensor]] | None = None
        for epoch in range(1, epochs + 1):
            it = iter(train[:cut])
            try:
                while True:
                    t.pipeline.progress(it)
            except StopIteration:
                pass
            if not val:
                continue
            t.pipeline.detach()  # plain forwards (the pipeline owns the embeddings' input)
            ne = metrics.normalized_entropy(*_scores(t, train[cut:]))
            if best is None or ne < best[0]:
                best = (ne, epoch, _scores(t, held))
            t.pipeline.attach()
        t.pipeline.detach()
        if best is not None:
            return *best[2], best[1]
        return *_scores(t, held), epochs


def _log_loss(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x) - y * x


def paired_ne(a: np.ndarray, b: np.ndarray, y: np.ndarray, seed: int = 0
              ) -> dict[str, Any]:
    """NE of logits `a` and `b` on labels `y`, and 95% intervals of each and of NE_b / NE_a
    over the same Poisson-bootstrap resamples of the rows."""
    la, lb = _log_loss(a, y), _log_loss(b, y)

    def ne(w: np.ndarray, ll: np.ndarray) -> np.ndarray:
        rows = w.sum(-1)
        c = (w @ y) / rows
        h = -(c * np.log(c) + (1 - c) * np.log1p(-c))
        return (w @ ll) / rows / h

    one = np.ones((1, len(y)))
    w = np.random.default_rng(seed).poisson(1.0, (RESAMPLES, len(y))).astype(np.float64)
    na, nb = ne(w, la), ne(w, lb)
    q = [2.5, 97.5]
    return {"ne_a": float(ne(one, la)[0]), "ne_b": float(ne(one, lb)[0]),
            "ne_a_ci": np.percentile(na, q).tolist(), "ne_b_ci": np.percentile(nb, q).tolist(),
            "ratio_ci": np.percentile(nb / na, q).tolist()}


def run(quick: bool = False, seeds: int = 1,
        only: dict[str, Callable[[Path], bool]] | None = None) -> None:
    """Every log of LOGS, or `only` these (name -> maker, e.g. `mapped_log`'s)."""
    quiet_libraries()
    seeds = 1 if quick else seeds
    kinds = ("student",) if quick else ("student", "teacher")
    with tempfile.TemporaryDirectory(prefix="lrm-bench-real-") as tmp:
        for name, make in (only or LOGS).items():
            root = Path(tmp) / name
            if not make(root / "raw"):
                print(f"train.real: {name} absent from {shared_data()}; skipped",
                      file=sys.stderr)
                continue
            dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
            data = root / "sessions"
            days = list(day_files(data))
            base = []  # per seed: the best of the DLRM's recipes on the held-out day
            lrs, epochs = (LRS[:1], 2) if smoke() else (LRS, MAX_EPOCHS)
            for s in range(seeds):
                runs = {f"{what}, lr {lr:g}": _dlrm(data, s, *args, lr=lr)
                        for lr in lrs for what, args in (("one pass", (1, False)), (
                            "epochs by validation", (epochs, True)))}
                ne = {k: metrics.normalized_entropy(x, y) for k, (x, y, _) in runs.items()}
                best = min(ne, key=ne.__getitem__)
                x, y, ep = runs[best]
                base.append((x, y, f"{best} ({ep} epochs)" if "valid" in best else best,
                             {k: round(v, 5) for k, v in ne.items()}))
            for kind in kinds:
                per_seed = []
                for s in range(seeds):
                    a, y = _lrm(kind, data, s, root / f"{kind}-{s}")
                    b, yb = base[s][:2]
                    assert torch.equal(y, yb), "the held-out rows differ"
                    per_seed.append(paired_ne(a.double().numpy(), b.double().numpy(),
                                              y.double().numpy(), seed=s))
                ne_l = float(np.mean([p["ne_a"] for p in per_seed]))
                ne_t = float(np.mean([p["ne_b"] for p in per_seed]))
                first = per_seed[0]
                emit("train.real", f"{name}_{kind}_vs_dlrm", "NE", ne_l, ne_t, "lower",
                     log=name, model=f"lrm {kind} (defaults)", seeds=seeds,
                     ne_candidate_per_seed=[round(p["ne_a"], 5) for p in per_seed],
                     ne_baseline_per_seed=[round(p["ne_b"], 5) for p in per_seed],
                     baseline_chosen=[b[2] for b in base],
                     ne_dlrm_recipes=[b[3] for b in base],
                     ratio_ci_seed0=[round(v, 4) for v in first["ratio_ci"]],
                     ne_candidate_ci_seed0=[round(v, 5) for v in first["ne_a_ci"]],
                     ne_baseline_ci_seed0=[round(v, 5) for v in first["ne_b_ci"]],
                     train_days=days[:-1], held_out_day=days[-1], held_out_rows=len(y),
                     baseline_is="torchrec.models.dlrm.DLRM (bench vs_torchrec's shape), "
                                 "DMP, fused Adagrad + AdamW, TrainPipelineSparseDist, "
                                 f"batch {BATCH}, TableConfig() tables: the best on the "
                                 "held-out day of one pass (torchrec's example) and up to "
                                 f"{MAX_EPOCHS} passes, the epoch chosen on the train "
                                 f"days' last {VAL_FRACTION:.0%}, each at AdamW lr "
                                 f"{' and '.join(f'{v:g}' for v in LRS)}")
                if not math.isfinite(ne_l):
                    raise SystemExit(f"train.real: {name} {kind}: NE is not finite")
