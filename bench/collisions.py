"""Hashed tables vs torchrec's managed-collision tables: `python bench/collisions.py [--quick |
--smoke]`.

Question (issue 12): new users and ads keep arriving; the tables hash ids (`id mod rows`).
Would torchrec's managed collision handling (MCH: `torchrec.modules.mc_modules.
MCHManagedCollisionModule`, the remapper inside `ManagedCollisionEmbeddingBagCollection`) do
better at the same number of rows?

MCH keeps a sorted table of the raw ids that own a row; every `eviction_interval` batches it
admits the most frequent new ids, evicting the least frequently used (LFU); an id it does
not hold is remapped to one shared row. Hashing gives every id some row, shared with every
other id of the same residue. Measured, per case, day after day through the stream's days:

    collisions.own_row  share of the lookups that read a row no other id of the day reads
                        (hashing: baseline; MCH-LFU at the same rows: candidate; higher is
                        better)

    collisions.ne_bound NE on a held-out day of a student whose tables are as large as the
                        id spaces (no collisions at all: the most any collision handling
                        could reach; candidate) vs the same student on the hashed tables
                        (baseline); lower is better. A bound near 1.0 says that removing
                        collisions would not buy NE on that data.

Cases: the synthetic world at the default params (tables as large as the id spaces: hashing
never collides there), the synthetic world with 10x more users and ads than table rows
(the stress case of arriving ids), and the real Criteo sample at the Criteo pipeline's
hash_size (skipped where ../shared/data is absent).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cases.data_profiles import tiny  # noqa: E402
from bench.common import add_mode_flags, emit, shared_data, smoke, use_mode  # noqa: E402
from lrm.config import GenerateConfig, IngestConfig, TableConfig  # noqa: E402
from lrm.data import collisions, synthetic  # noqa: E402
from lrm.data.schema import criteo_schema, synthetic_schema  # noqa: E402
from lrm.models.tables import embedding_tables, hash_sizes  # noqa: E402

BATCH = 4096  # lookups per MCH step


def hashed_own_row(ids: np.ndarray, rows: int) -> float:
    """Share of lookups on a row no other id of the day uses (hashing, `id mod rows`)."""
    return 1.0 - collisions.collision_stats(ids, rows)["lookup_collisions"]


class MCH:
    """One feature's MCH remapper (LFU eviction), fed the stream's lookups batch by batch."""

    def __init__(self, rows: int, interval: int = 1) -> None:
        from torchrec.modules.mc_modules import LFU_EvictionPolicy, MCHManagedCollisionModule

        self.rows = rows
        self.mc = MCHManagedCollisionModule(
            zch_size=rows, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(),
            eviction_interval=interval, input_hash_size=2**62)
        self.mc.train()

    def remap(self, ids: np.ndarray) -> np.ndarray:
        from torchrec.sparse.jagged_tensor import JaggedTensor

        out = []
        for i in range(0, len(ids), BATCH):
            chunk = torch.from_numpy(ids[i:i + BATCH].astype(np.int64))
            jt = JaggedTensor(values=chunk, lengths=torch.ones(len(chunk), dtype=torch.int32))
            out.append(self.mc({"f": jt})["f"].values().numpy())
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def own_row(self, ids: np.ndarray) -> float:
        """Share of the day's lookups remapped to a row of their own (not the shared miss
        row, and no other id of the day on the same row)."""
        slots = self.remap(ids)
        miss = self.rows - 1
        pairs = np.unique(np.stack([slots, ids]), axis=1)
        per_slot = np.bincount(pairs[0], minlength=self.rows)
        own = (slots != miss) & (per_slot[slots] == 1)
        return float(own.mean()) if len(ids) else 1.0


def _days(files_by_day: dict[int, list[Path]], feature: str) -> Iterator[np.ndarray]:
    for _, files in sorted(files_by_day.items()):
        yield collisions.feature_ids(files, feature)


def compare(files_by_day: dict[int, list[Path]], sizes: dict[str, int],
            features: list[str]) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """(MCH own-row share, hashing own-row share, per feature), lookups-weighted."""
    per: dict[str, tuple[float, float]] = {}
    num = np.zeros(2)
    total = 0
    for f in features:
        mch, hashed, n_f = MCH(sizes[f]), [], []
        got = []
        for ids in _days(files_by_day, f):
            got.append(mch.own_row(ids) * len(ids))
            hashed.append(hashed_own_row(ids, sizes[f]) * len(ids))
            n_f.append(len(ids))
        n = sum(n_f)
        per[f] = (sum(got) / n, sum(hashed) / n)
        num += [sum(got), sum(hashed)]
        total += n
    return num[0] / total, num[1] / total, per


def synthetic_case(name: str, cfg: GenerateConfig, tables: TableConfig) -> None:
    from lrm.data.schema import day_files

    with tempfile.TemporaryDirectory() as tmp:
        synthetic.generate(cfg, Path(tmp))
        schema = synthetic_schema(synthetic.vocab(cfg))
        sizes = hash_sizes(embedding_tables(schema, tables, 8))
        feats = ["user_id", "ad_id"]
        cand, base, per = compare(day_files(Path(tmp)), sizes, feats)
    emit("collisions.own_row", name, "share of lookups", round(cand, 5), round(base, 5),
         "higher", days=cfg.days, rows={f: sizes[f] for f in feats},
         ids={"users": cfg.users, "ads": cfg.ads},
         per_feature={f: {"mch": round(a, 5), "hash": round(b, 5)} for f, (a, b) in per.items()})


def criteo_case(quick: bool) -> None:
    from lrm.data import criteo
    from lrm.data.schema import day_files

    criteo_dir = shared_data() / "criteo_sample"
    if not (criteo_dir / "train.tsv").exists():
        print(f"# criteo case skipped: {criteo_dir} is absent", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as tmp:
        files = [criteo_dir / f for f in ("train.tsv", "dev.tsv", "test.tsv")]
        criteo.ingest(files, Path(tmp), IngestConfig())  # a day per file
        tables = TableConfig(hash_size=2000)  # pipelines/criteo/params.yaml's
        sizes = hash_sizes(embedding_tables(criteo_schema(), tables, 8))
        feats = [f"C{i}" for i in range(1, 27)][: 2 if smoke() else 8 if quick else 26]
        cand, base, per = compare(day_files(Path(tmp)), sizes, feats)
    emit("collisions.own_row", "criteo-sample", "share of lookups", round(cand, 5),
         round(base, 5), "higher", rows=2000, features=len(feats),
         per_feature={f: {"mch": round(a, 4), "hash": round(b, 4)} for f, (a, b) in per.items()})


def ne_bound(name: str, world: GenerateConfig, small: TableConfig, steps: int) -> None:
    """Train the same student on hashed tables and on collision-free ones; NE on the last day."""
    from lrm.config import DedupConfig, LoaderConfig, ModelConfig, SplitConfig, TrainConfig
    from lrm.data import dedup
    from lrm.train import TrainJob, train

    with tempfile.TemporaryDirectory() as tmp:
        synthetic.generate(world, Path(tmp) / "raw")
        dedup.dedup_dataset(Path(tmp) / "raw", Path(tmp) / "sessions", DedupConfig())
        ne = {}
        for label, tables in (("hashed", small), ("free", TableConfig(max_rows=10**9))):
            cfg = TrainConfig(batch_size=256 if smoke() else 1024, steps=steps, lr=3e-3,
                              threads=0, log_every=10**6)
            r = train(TrainJob(kind="student", train=cfg, model=ModelConfig(tables=tables),
                               data=Path(tmp) / "sessions", split=SplitConfig(eval_day=-1),
                               loader=LoaderConfig()))
            ne[label] = r.eval["ne"]
    emit("collisions.ne_bound", name, "NE", round(ne["free"], 5), round(ne["hashed"], 5),
         "lower", rows=small.max_rows, ids={"users": world.users, "ads": world.ads},
         steps=steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_mode_flags(ap)
    args = ap.parse_args()
    quick = use_mode(args)
    if smoke():  # the default world's users and ads over the table rows, 10x: as below
        default, big = tiny(days=3), tiny(days=3, users=50_000, ads=10_000)
        rows = small = 1_000
    else:
        sessions = 2000 if quick else 20_000
        default = GenerateConfig(days=3, sessions_per_day=sessions)
        big = GenerateConfig(days=3, sessions_per_day=sessions, users=1_000_000, ads=100_000)
        rows, small = (10_000 if quick else 100_000), 10_000
    synthetic_case("synthetic-default", default, TableConfig())
    synthetic_case("synthetic-10x-ids", big, TableConfig(max_rows=rows))
    criteo_case(quick)
    ne_bound("synthetic-10x-ids", big, TableConfig(max_rows=small),
             steps=8 if smoke() else 60 if quick else 300)


if __name__ == "__main__":
    main()
