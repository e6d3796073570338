"""Shared fixtures: an isolated MLflow store per test session, the real Criteo sample, the
tiny synthetic datasets (generated once per session) and small training configs that every
test folder uses."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from lrm.config import DedupConfig, GenerateConfig, LoaderConfig, ModelConfig, \
    StudentModelConfig, TrainConfig
from lrm.data import dedup, parquet, synthetic
from lrm.data.schema import day_files

# Prefect's ephemeral server gets 20 s to start by default: on a loaded 2-core machine (CI)
# that was not always enough ("Timed out while attempting to connect"). Set before any test
# module imports Prefect, which reads its settings once.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
HARNESS_STARTUP_S = 120  # prefect_test_harness's own bound (30 s by default)

REPO = Path(__file__).resolve().parents[1]
# the real samples beside the repo (LRM_SHARED_DATA names another place, e.g. for a worktree)
SHARED_DATA = Path(os.environ.get("LRM_SHARED_DATA", REPO.parent / "shared" / "data"))
CRITEO_DIR = SHARED_DATA / "criteo_sample"
MIND_DIR = SHARED_DATA / "mind_sample"


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every MLflow run of the suite goes to a throwaway SQLite store, never ./mlflow.db."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


_TEMPLATE: list[Path] = []  # this process's empty store, made on first use
_TEMPLATE_LOCK = threading.Lock()


def new_store(folder: Path, name: str = "mlflow.db") -> str:
    """The URI of a SQLite tracking store `folder`/`name` holding MLflow's tables, as the
    first use of a new store leaves it (made there unless it exists): a copy of one made once
    a process, since MLflow's migrations take 2-5 s a store. For the tests of what lrm does
    with a store; those of a user's first run (a fresh clone, `lrm serve`, a worker) let it
    make its own."""
    db = Path(folder) / name
    with _TEMPLATE_LOCK:
        if not _TEMPLATE:
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            root = Path(tempfile.mkdtemp(prefix="lrm-test-mlflow-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            # its Default experiment's artifacts would go beside it (lrm makes its own)
            SqlAlchemyStore(f"sqlite:///{root / 'mlflow.db'}", str(root / "mlruns"))
            _TEMPLATE.append(root / "mlflow.db")
        if not db.exists():
            db.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(_TEMPLATE[0], db)
    return f"sqlite:///{db}"


@pytest.fixture
def criteo_dir() -> Path:
    """../shared/data/criteo_sample, or skip with a clear message where it is absent."""
    if not (CRITEO_DIR / "train.tsv").exists():
        pytest.skip(f"real Criteo sample not found at {CRITEO_DIR} (shared data absent)")
    return CRITEO_DIR


# -- tiny synthetic worlds and small configs, shared by the test folders ----------------

TINY = GenerateConfig(users=2000, ads=300, advertisers=40, categories=8, days=3,
                      sessions_per_day=2000, mean_session_length=6.0, max_history=20, seed=3)
SMALL_MODEL = ModelConfig(student=StudentModelConfig(embedding_dim=8, bottom_mlp=[16],
                                                top_mlp=[32, 16]))
LOADER = LoaderConfig(prefetch=2, num_workers=1)
HUGE = float(np.finfo(np.float32).max)  # a finite dense value no layer survives


def tiny_train(**kw: object) -> TrainConfig:
    """512 impressions a step, ~40 steps an epoch over days 0-1; day 2 held out (the batch as
    given: fit_steps off, so a test's steps do not follow the defaults' schedule)."""
    base: dict[str, object] = dict(batch_size=512, lr=1e-2, embedding_lr=0.05, log_every=4,
                                   threads=1, fit_steps=0)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"raw": impressions layout, "sessions": the same data deduplicated}, 3 days."""
    root = tmp_path_factory.mktemp("train-data")
    synthetic.generate(TINY, root / "raw")
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return {"raw": root / "raw", "sessions": root / "sessions"}


@pytest.fixture(scope="session")
def student_dir(datasets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small student trained 6 steps on the sessions dataset, once a session (read only)."""
    from lrm.train import TrainJob, train

    out = tmp_path_factory.mktemp("student") / "student"
    train(TrainJob(kind="student", train=tiny_train(steps=6), model=SMALL_MODEL,
                   data=datasets["sessions"], loader=LOADER, out=out))
    return out


def only_days(src: Path, dst: Path, days: list[int]) -> Path:
    """A copy of dataset `src` holding only `days` (e.g. a file ingested on its own)."""
    keep = {f"day={d}" for d in days}
    shutil.copytree(src, dst, ignore=lambda _folder, names: [
        n for n in names if n.startswith("day=") and n not in keep])
    return dst


def poison_day(src: Path, dst: Path, day: int, column: str = "d_bid") -> Path:
    """A copy of `src` whose `day` has the largest float32 in a dense column (every
    impression): finite, so the readers let it through (NaN is a bad value there,
    lrm.data.values), and the model's first layer overflows: the loss is not finite."""
    shutil.copytree(src, dst)
    for f in day_files(dst)[day]:
        t = parquet.read_table(f)
        i = t.schema.get_field_index(column)
        col = t.column(column)
        if pa.types.is_list(col.type):  # sessions layout: a list per session
            flat = pc.list_flatten(col)
            big = pa.array([HUGE] * len(flat), type=flat.type)
            offsets = col.combine_chunks().offsets
            new = pa.ListArray.from_arrays(offsets, big, type=col.type)
        else:
            new = pa.array([HUGE] * len(col), type=col.type)
        pq.write_table(t.set_column(i, t.schema.field(i), new), f)
    return dst


SHARD_WORLD = GenerateConfig(users=2000, ads=300, advertisers=40, categories=8, days=3,
                      sessions_per_day=600, mean_session_length=6.0, max_history=20, seed=5)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-day synthetic dataset in the sessions (RecD) layout."""
    from lrm.data import dedup, synthetic

    root = tmp_path_factory.mktemp("shard-data")
    synthetic.generate(SHARD_WORLD, root / "raw")
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return root / "sessions"


@pytest.fixture
def mind_dir() -> Path:
    """../shared/data/mind_sample, or skip with a clear message where it is absent."""
    if not (MIND_DIR / "behaviors.tsv").exists():
        pytest.skip(f"real MIND sample not found at {MIND_DIR} (shared data absent)")
    return MIND_DIR


def other_weights(folder: Path) -> None:
    """Another model's state dict of the same shapes put in model folder `folder` in place
    of its own (the issue-45 probe copied another model's state_dict.pt in)."""
    sd = torch.load(folder / "state_dict.pt", weights_only=True)
    torch.save({k: v + 0.1 if v.is_floating_point() else v for k, v in sd.items()},
               folder / "state_dict.pt")


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process it started (a machine lost, as its work sees it;
    children in sessions of their own too), and wait for them to go."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


@pytest.hookimpl(tryfirst=True)  # before --ff/--nf, which reorder what this gives
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a `slow` test (multi-process, end to end: minutes each, much of it waiting
    on servers, schedules and subprocesses) run first, every file's tests together and in
    order. `make test` hands files to its workers in this order (--dist loadfile
    --no-loadscope-reorder): the long ones start early, next to the CPU-bound ones, and the
    many short files even out the end; xdist's own order (the files with the most tests
    first) left the one-test end-to-end files, the longest, to the end, one worker alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the rest keeps its order
