"""ExFM's cost in the stream (bench/exfm.py --only stream, issue 49): the time of a stream
day against the number of surfaces, with the default settings and the production ones.

A world of 1, 3 and 9 surfaces of equal share and the same sessions a day in all (the
surfaces split the same impressions), streamed through the streaming flow (flows.streaming:
the stream's own days, Prefect's temporary server, a local MLflow store) for its first two
days, a run a day as the schedule runs them; the figure is the second day's seconds (the
flow's record), the one a running stream pays every day, and its CPU seconds (this process
and the day's worker processes: `cpu_ratio`, steadier than the wall time on a shared
machine):

    default       params.yaml: every variant of every VM every day, one VM after another
    production    students.ablation_every 7 (the second day is no ablation day: the served
                  variant and labels only), streaming.workers = the cores (each VM a worker
                  process with its share of them)

`exfm.stream_day` lines: per setting, 9 surfaces against 3 (the aim: within 2x) and 1
against 3; per surface count, production against default. Each side's detail: the day's
seconds, the first day's, the VMs and VM-variant days it trained, and the load average
when its stream ended (the machine may be shared: the ratios of one run are what count).
--smoke: 1 and 3 surfaces of a tiny world (seconds a stream: that the lines print).
"""

from __future__ import annotations

import atexit
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import emit, smoke

SETTINGS = {
    "default": {},
    "production": {"students": {"ablation_every": 7},
                   "streaming": {"workers": max(1, len(os.sched_getaffinity(0)))}},
}


def _world(surfaces: int, quick: bool) -> dict[str, Any]:
    names = ["feed", "search", "video", "shop", "news", "live", "local", "games", "music"]
    tiny = smoke()
    return {"days": 3, "sessions_per_day": 400 if tiny else 1500 if quick else 6000,
            "users": 500 if tiny else 5000 if quick else 20000,
            "ads": 100 if tiny else 1000 if quick else 5000,
            "verticals": [{"name": n, "share": 1.0} for n in names[:surfaces]]
            if surfaces > 1 else [{"name": "all"}]}


def _params(surfaces: int, setting: str, quick: bool) -> dict[str, Any]:
    p: dict[str, Any] = {"generate": _world(surfaces, quick),
                         "exfm": {"teacher_days": 1, "teacher_every": 1, "teacher_lag": 1}}
    for k, v in SETTINGS[setting].items():
        p.setdefault(k, {}).update(v)
    if quick:  # smaller models: the run's fixed costs, not its steps, are what it shows
        p["students"] = {**p.get("students", {}), "models": {
            "small": {"embedding_dim": 8, "bottom_mlp": [32], "top_mlp": [64, 32]}}}
    if smoke():  # a few steps a model, one small FM version: that the lines print
        p["train"] = {"fit_steps": 0, "min_steps": 4, "batch_size": 512}
        p["exfm"]["teacher_every"] = 0
        p["model"] = {"teacher": {"embedding_dim": 8, "layers": 1, "fm_mlp": [16],
                                  "top_mlp": [16]}}
    return p


def _cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that have ended (a
    day's worker processes, ended with the day); Prefect's server, which runs until the
    process ends, is in neither."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


_STORE: list[Path] = []  # an empty MLflow store, made once a process


def _new_store(root: Path) -> str:
    """A SQLite MLflow store in `root` with MLflow's tables made, a copy of one made once a
    process: MLflow's migrations take 2-5 s a new store, a cost of no stream day (each
    stream still has a store of its own, as a user's stream has)."""
    db = root / "mlflow.db"
    if _STORE:
        shutil.copy(_STORE[0], db)
    else:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        keep = Path(tempfile.mkdtemp(prefix="lrm-bench-store-")) / "mlflow.db"
        atexit.register(shutil.rmtree, keep.parent, ignore_errors=True)
        SqlAlchemyStore(f"sqlite:///{keep}", str(keep.parent / "mlruns"))
        _STORE.append(keep)
        shutil.copy(keep, db)
    return f"sqlite:///{db}"


def day_seconds(surfaces: int, setting: str, quick: bool) -> dict[str, Any]:
    """Stream days 1 and 2 of a world of `surfaces`; day 2's seconds and what it trained."""
    from flows.streaming import streaming

    with tempfile.TemporaryDirectory(prefix="lrm-bench-stream-") as tmp:
        root = Path(tmp)
        params = root / "params.yaml"
        params.write_text(yaml.safe_dump(_params(surfaces, setting, quick)))
        old = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI",)}
        os.environ["MLFLOW_TRACKING_URI"] = _new_store(root)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            t0 = time.perf_counter()
            days = []
            for _ in range(2):  # a run a day, as the schedule runs them: day 2's CPU time
                cpu = _cpu_seconds()
                state = streaming(days=1, params=[str(params)], root=str(root / "stream"),
                                  return_state=True)
                if not state.is_completed():
                    raise RuntimeError(f"stream of {surfaces} surfaces ({setting}): "
                                       f"{state.message}")
                days.append((state.result()[0], _cpu_seconds() - cpu))
            wall = time.perf_counter() - t0
        finally:
            os.chdir(cwd)
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        (first, _), (second, cpu) = days
        trained = sum(len(s["trained"]) for s in second["students"].values())
        return {"seconds": second["seconds"], "cpu_seconds": round(cpu, 1),
                "first_day_seconds": first["seconds"],
                "wall_two_days": round(wall, 1), "vm_variant_days": trained,
                "vms": len(second["students"]),
                "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}


def run_stream(quick: bool, counts: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    counts = counts or ((1, 3) if smoke() else (1, 3, 9))
    got = {(n, s): day_seconds(n, s, quick) for s in SETTINGS for n in counts}
    common = {"quick": quick, "cores": len(os.sched_getaffinity(0)),
              "settings": SETTINGS, "days": "the second stream day (the first is day 1)"}
    out = []
    for s in SETTINGS:
        for n in counts:
            if n == 3:
                continue
            a, b = got[(n, s)], got[(3, s)]
            out.append(emit("exfm.stream_day", f"{s}/{n}_vs_3_surfaces", "s",
                            candidate=a["seconds"], baseline=b["seconds"], better="lower",
                            aim="9 surfaces within 2x of 3 (ratio >= 0.5)" if n == 9 else None,
                            cpu_ratio=_ratio(b, a), candidate_detail=a, baseline_detail=b,
                            **common))
    for n in counts:
        d, p = got[(n, "default")], got[(n, "production")]
        out.append(emit("exfm.stream_day", f"{n}_surfaces/production_vs_default", "s",
                        candidate=p["seconds"], baseline=d["seconds"], better="lower",
                        cpu_ratio=_ratio(d, p), candidate_detail=p, baseline_detail=d,
                        **common))
    return out


def _ratio(baseline: dict[str, Any], candidate: dict[str, Any]) -> float:
    """The same ratio on CPU seconds (every process of the day): on a shared machine the
    wall time of a day with worker processes stretches with the load more than one without."""
    return round(baseline["cpu_seconds"] / max(candidate["cpu_seconds"], 1e-9), 4)
