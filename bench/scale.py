"""Cost as a day grows: `python bench/scale.py [--quick | --full | --smoke]` prints one JSON line
per stage, size and measure.

One synthetic day of the default world (100k users, 10k ads, sessions of 8 impressions,
histories of up to 100 ads) at 1M and 10M impressions (and 50M with --full; --quick: 0.05M
and 0.2M; --smoke: 3,000 impressions of a tiny world, its own baseline, seconds), through
the stages a user runs, each in a process of its own, one after the other on the machine's
cores:

    generate   lrm.data.synthetic.generate: the day's impressions (lrm generate)
    dedup      lrm.data.dedup.dedup_dataset: impressions -> sessions (lrm dedup)
    train      one pass of the default student over the day (lrm train: epochs 1, no
               validation slice, no checkpoints), then its end-of-run score with intervals
               on a held-out day as large as the day: the day itself (a cost, not a quality
               figure; a run's held-out day can be as large as its train days)
    evaluate   lrm.train.evaluate.evaluate of that model on the day (lrm evaluate: NE, AUC,
               calibration, 200 bootstrap resamples)

Per stage and size two lines, the smallest size the baseline of both: seconds per million
impressions of the stage's own call (not the interpreter's start), better lower (ratio > 1:
the larger day costs less per impression; the aim is ratio >= 1/1.2 at every size), and
the process's peak resident memory (getrusage of the child), better lower (the aim: flat,
bounded by a chunk or a batch, not the day). Every line gives the machine, its load and
the allocator of Arrow's buffers (`arrow_pool`: lrm.data.parquet.ARROW_POOL; set
ARROW_DEFAULT_MEMORY_POOL=mimalloc to measure pyarrow's own default).

`--cluster` (the cluster extra): the data stages as the flows run them on a cluster. Four
days of Criteo TSV (a file a day) through `ingest` and four synthetic days through `dedup`
(1M impressions each stage; --quick 0.2M), each stage a Prefect task of one flow whose units
(a file, a day) run on the flow's task runner: threads of the flow's process (the default),
then a local Dask cluster of 1, 2 and 4 worker processes (flows.cluster.local_cluster),
and, where prefect-ray is installed, Ray with 1, 2 and 4 worker CPUs. Lines: seconds per
million impressions of each stage, the best of two runs on the same cluster (baseline: the
same stage on 1 Dask worker; ratio: the speed-up), the engine's start-up and the first run's
seconds (the workers' imports included; baseline: Dask's with as many workers). The stages'
own time only: the cluster is started before the flow (its start-up is its own line). On 2
cores the curve flattens at 2 workers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import add_mode_flags, emit, smoke, use_mode  # noqa: E402
from lrm.config import GenerateConfig  # noqa: E402

import pyarrow as pa  # noqa: E402  # after lrm, which picks its C++ pool (lrm/__init__.py)

STAGES = ("generate", "dedup", "train", "evaluate")
SIZES = {"smoke": (3_000,), "quick": (50_000, 200_000), "default": (1_000_000, 10_000_000),
         "full": (1_000_000, 10_000_000, 50_000_000)}


def _world(sessions: int) -> GenerateConfig:
    if smoke():
        from bench.cases.data_profiles import tiny

        return tiny(days=1, sessions=sessions)
    return GenerateConfig(days=1, sessions_per_day=sessions)


def _sessions(impressions: int) -> int:
    return max(1, round(impressions / GenerateConfig().mean_session_length))


def stage(name: str, size: int, root: Path) -> dict[str, Any]:
    """Run one stage of the day of `size` impressions in `root` (in this process): its
    seconds and the impressions it went through."""
    from lrm.config import DedupConfig, LoaderConfig, ModelConfig, TrainConfig
    from lrm.data import dedup, synthetic
    from lrm.dist import quiet_libraries
    from lrm.train import TrainJob, train
    from lrm.train.evaluate import evaluate

    quiet_libraries()
    t0 = time.perf_counter()
    if name == "generate":
        rows = synthetic.generate(_world(_sessions(size)), root / "raw")["rows"]
    elif name == "dedup":
        rows = dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())["rows"]
    elif name == "train":
        # the day itself as the held-out day, hard-linked (no bytes): train refuses to hold
        # out its own train data
        held = root / "held_out"
        if not held.exists():
            shutil.copytree(root / "sessions", held, copy_function=os.link)
        t0 = time.perf_counter()
        r = train(TrainJob(kind="student", train=TrainConfig(val_fraction=0.0),
                           model=ModelConfig(), data=root / "sessions", loader=LoaderConfig(),
                           out=root / "model", eval_data=held))
        rows = r.samples
    elif name == "evaluate":
        rows = evaluate(root / "model", root / "sessions", day=0)["rows"]
    else:
        raise ValueError(name)
    return {"seconds": time.perf_counter() - t0, "rows": rows}


def _child(name: str, size: int, root: Path) -> dict[str, Any]:
    """`stage` in a child process: its result and the child's peak RSS (MB)."""
    cmd = [sys.executable, __file__, "--stage", name, "--size", str(size), "--root", str(root)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"scale: stage {name} at {size} impressions exited {p.returncode}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_mb": usage.ru_maxrss / 1024,
            "cpu_seconds": usage.ru_utime + usage.ru_stime}  # the whole process's


CLUSTER_DAYS = 4
CLUSTER_WORKERS = (1, 2, 4)
CLUSTER_REPEAT = 2  # runs of the flow per engine: the best of each stage is reported


def _criteo_tsv(path: Path, lines: int, seed: int) -> None:
    """`lines` rows in the Criteo format (missing values and negatives included)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, 2, lines).astype(str)]
    for _ in range(13):
        v = rng.integers(-3, 5000, lines).astype(str)
        cols.append(np.where(rng.random(lines) < 0.3, "", v))
    for _ in range(26):
        v = np.char.zfill(np.char.mod("%x", rng.integers(0, 2**32, lines)), 8)
        cols.append(np.where(rng.random(lines) < 0.2, "", v))
    rows = cols[0]
    for c in cols[1:]:
        rows = np.char.add(np.char.add(rows, "\t"), c)
    path.write_text("\n".join(rows.tolist()) + "\n")


def _cluster_inputs(root: Path, impressions: int) -> Path:
    """The inputs of the cluster lines in `root`: data/criteo/tsv (a file a day), data/raw
    (synthetic days), params.yaml; returns the params file."""
    import yaml

    from lrm.data import synthetic

    per_day = impressions // CLUSTER_DAYS
    (root / "data/criteo/tsv").mkdir(parents=True)
    for d in range(CLUSTER_DAYS):
        _criteo_tsv(root / f"data/criteo/tsv/day{d}.tsv", per_day, seed=d)
    synthetic.generate(GenerateConfig(days=CLUSTER_DAYS, sessions_per_day=_sessions(per_day)),
                       root / "data/raw")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump({"ingest": {"chunk_rows": 100_000}}))
    return params


def _engine(engine: str, workers: int):
    """(the task runner, a context that holds the engine up, its start-up seconds)."""
    import contextlib

    from prefect.task_runners import ThreadPoolTaskRunner

    t0 = time.perf_counter()
    if engine == "threads":
        return ThreadPoolTaskRunner(max_workers=workers), contextlib.nullcontext(), 0.0
    if engine == "dask":
        from distributed import LocalCluster
        from prefect_dask import DaskTaskRunner

        from flows.cluster import local_cluster

        cluster = LocalCluster(**local_cluster(workers))
        return (DaskTaskRunner(address=cluster.scheduler_address), cluster,
                time.perf_counter() - t0)
    import ray
    from prefect_ray import RayTaskRunner

    ctx = ray.init(num_cpus=workers, include_dashboard=False, object_store_memory=300 << 20,
                   log_to_driver=False, _node_ip_address="127.0.0.1")
    return RayTaskRunner(address=ctx.address_info["address"]), _RayDown(), \
        time.perf_counter() - t0


class _RayDown:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        import ray

        ray.shutdown()


def _cluster_run(engine: str, workers: int, impressions: int, tmp: Path) -> dict[str, float]:
    """The data stages on `engine` with `workers`, CLUSTER_REPEAT times on the same cluster:
    the best seconds of each stage, the engine's start-up and the first run's stages in all
    (their imports in the workers included)."""
    import shutil

    from prefect import flow

    from flows.tasks import stage_task

    root = tmp / f"{engine}-{workers}"
    runner, held, start = _engine(engine, workers)
    times: dict[str, float] = {"startup": start}

    def data_stages() -> None:
        for pipe, name, args in (("lrm-criteo", "ingest", None), ("lrm", "dedup", None)):
            t0 = time.perf_counter()
            stage_task(pipe, name, f"{pipe} {name}", ["params.yaml"])
            times[f"{pipe} {name}"] = time.perf_counter() - t0

    cwd = os.getcwd()
    best: dict[str, float] = {}
    try:
        with held:
            for attempt in range(CLUSTER_REPEAT):  # the first also imports lrm in the workers
                shutil.rmtree(root, ignore_errors=True)
                shutil.copytree(tmp / "inputs", root)
                os.chdir(root)
                state = flow(data_stages, name="bench-scale-cluster",
                             task_runner=runner)(return_state=True)
                os.chdir(cwd)
                if not state.is_completed():
                    raise SystemExit(f"scale --cluster: {engine} x{workers}: {state.message}")
                best = {k: min(v, best.get(k, v)) for k, v in times.items()}
                if attempt == 0:
                    first = sum(times[k] for k in times if k != "startup")
    finally:
        os.chdir(cwd)
        shutil.rmtree(root, ignore_errors=True)
    return {**best, "first_run": first}


def cluster_lines(quick: bool) -> None:
    """The --cluster lines (see the module)."""
    import importlib.util

    from flows.cluster import available

    if not available():
        raise SystemExit("scale --cluster needs the cluster extra: pip install -e '.[cluster]'")
    impressions = 200_000 if quick else 1_000_000
    engines = [("threads", 2), *(("dask", n) for n in CLUSTER_WORKERS)]
    if importlib.util.find_spec("prefect_ray") is not None:
        engines += [("ray", n) for n in CLUSTER_WORKERS]
    load = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="lrm-bench-cluster-") as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"  # one store, kept
        _cluster_inputs(Path(tmp) / "inputs", impressions)
        res = {e: _cluster_run(*e, impressions, Path(tmp)) for e in engines}
    common = {"impressions": impressions, "days": CLUSTER_DAYS, "cpus": os.cpu_count(),
              "load_avg": [load, [round(x, 2) for x in os.getloadavg()]]}
    base = res[("dask", 1)]
    for (engine, n), r in res.items():
        for stage in ("lrm-criteo ingest", "lrm dedup"):
            emit("scale.cluster", f"{stage.split()[-1]} ({stage.split()[0]}): {engine}, {n} "
                 f"worker{'s' * (n > 1)} vs dask, 1 worker: seconds per million impressions",
                 "s/M impressions", r[stage] / (impressions / 1e6),
                 base[stage] / (impressions / 1e6), "lower", engine=engine, workers=n,
                 seconds=round(r[stage], 3), **common)
        if engine != "threads":
            emit("scale.cluster", f"start-up: {engine}, {n} worker{'s' * (n > 1)} vs dask, "
                 f"{n}", "s", r["startup"], res[("dask", n)]["startup"], "lower",
                 engine=engine, workers=n, **common)
            emit("scale.cluster", f"first run (the workers' imports): {engine}, {n} "
                 f"worker{'s' * (n > 1)} vs dask, {n}: seconds, both stages", "s",
                 r["first_run"], res[("dask", n)]["first_run"], "lower", engine=engine,
                 workers=n, **common)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_mode_flags(ap, "0.05M and 0.2M: under a minute")
    ap.add_argument("--full", action="store_true", help="1M, 10M and 50M impressions")
    ap.add_argument("--cluster", action="store_true", help="the data stages on Dask "
                    "clusters of 1, 2, 4 local workers (and Ray where installed) only")
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # a child's work
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    use_mode(args)
    if args.quick and args.full:
        ap.error("--full and --quick (or --smoke) are exclusive")
    if args.stage:
        print(json.dumps(stage(args.stage, args.size, args.root)), flush=True)
        return
    if args.cluster:
        cluster_lines(args.quick)
        return
    sizes = SIZES["smoke" if smoke() else "quick" if args.quick else "full" if args.full
                  else "default"]
    results: dict[int, dict[str, dict[str, Any]]] = {}
    load = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="lrm-bench-scale-") as tmp:
        for size in sizes:
            root = Path(tmp) / f"day-{size}"
            root.mkdir()
            results[size] = {name: _child(name, size, root) for name in STAGES}
            subprocess.run(["rm", "-rf", str(root)], check=True)  # the next day's disk
    base = sizes[0]
    common = {"sizes": list(sizes), "load_avg": [load, [round(x, 2) for x in os.getloadavg()]],
              "cpus": os.cpu_count(), "arrow_pool": pa.default_memory_pool().backend_name}
    for name in STAGES:
        b = results[base][name]
        b_per = b["seconds"] / (b["rows"] / 1e6)
        for size in sizes:
            r = results[size][name]
            per = r["seconds"] / (r["rows"] / 1e6)
            emit(f"scale.{name}", f"{size / 1e6:g}M impressions vs {base / 1e6:g}M: seconds "
                 f"per million impressions", "s/M impressions", per, b_per, "lower",
                 aim=round(1 / 1.2, 4), rows=r["rows"], seconds=r["seconds"],
                 process_cpu_s_per_m=round(r["cpu_seconds"] / (r["rows"] / 1e6), 3),
                 **common)
            emit(f"scale.{name}", f"{size / 1e6:g}M impressions vs {base / 1e6:g}M: peak "
                 f"resident memory", "MB", r["peak_mb"], b["peak_mb"], "lower", rows=r["rows"],
                 **common)


if __name__ == "__main__":
    main()
