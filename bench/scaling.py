"""The foundation model's scaling law: Wukong's held-out NE against its training compute.

    python bench/scaling.py [--quick | --smoke] [--plot plots/scaling.png]

One world (params.yaml's `generate`, every vertical; --quick: a small one) is generated and
deduplicated into a temporary folder. Each point trains the FM (Wukong, params.yaml's
`train` with the `teacher.train` overrides) of one shape on the last k days before the
held-out last day (so every point is as fresh as the others: more data is more past),
through `lrm.train.train`, and scores that day. Its training compute is
C = forward FLOPs per impression (`lrm.models.flops`) x impressions trained on.

Output, one JSON line each (bench conventions, bench/common.py):
  scaling.fm / SHAPE x Kd   candidate: the point's NE; baseline: the NE of the smallest
                            point (least compute, run first); ratio = baseline / candidate
                            (> 1: the bigger run is better); with C, FLOPs per impression,
                            impressions, dense and table parameters, seconds
  scaling.fm / fit          NE = a + b * C^-c fitted (scipy's curve_fit where installed,
                            else numpy) to the frontier (the points better than every point
                            of less compute); candidate/baseline: the fitted NE at the
                            frontier's largest / smallest C (never past it); whether the frontier falls all the way,
                            and where it stops when it does not
and the points with the fitted curve drawn to --plot (PNG).

Shapes grow width (FM and top MLPs), depth (layers), embeddings per layer and embedding dim
together, from half the student's FLOPs to 6x the default FM's. --quick: three shapes on
1-2 days of a small world, under a minute on 2 cores; the full run: five shapes (the four
above and "m-e8", the default FM's layers on 8-wide tables) x 1, 2, 4 and 6 days of the
default world (about 15 minutes on 2 cores). --smoke: two shapes on a day of a tiny world,
a few steps each (seconds: that it runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from bench.common import add_mode_flags, emit, smoke, use_mode  # noqa: E402
from lrm import io  # noqa: E402
from lrm.config import (  # noqa: E402
    DedupConfig,
    ModelConfig,
    ParamsConfig,
    SplitConfig,
    TeacherModelConfig,
    from_dict,
)

REPO = Path(__file__).resolve().parents[1]
BENCH = "scaling.fm"
# smallest first; "m" is the default FM (params.yaml's model.teacher), "xs" about half the student's
# FLOPs; every shape uses the full FM interaction (fm_rank 0: see TeacherModelConfig)
SHAPES: dict[str, dict[str, Any]] = {
    "xs": dict(embedding_dim=8, dense_mlp=[16], layers=1, fm_embeddings=4, lcb_embeddings=4,
               fm_rank=0, fm_mlp=[32], top_mlp=[32, 16]),
    "s": dict(embedding_dim=16, dense_mlp=[32], layers=2, fm_embeddings=8, lcb_embeddings=8,
              fm_rank=0, fm_mlp=[128], top_mlp=[128, 32]),
    "m": dict(embedding_dim=32, dense_mlp=[64], layers=3, fm_embeddings=8, lcb_embeddings=8,
              fm_rank=0, fm_mlp=[256], top_mlp=[256, 64]),
    "l": dict(embedding_dim=32, dense_mlp=[64], layers=4, fm_embeddings=16, lcb_embeddings=16,
              fm_rank=0, fm_mlp=[512], top_mlp=[512, 128]),
    # the default FM's layers on xs's 8-wide tables: whether a big shape loses through its
    # dense capacity or through tables 4x as wide to learn from the same impressions
    "m-e8": dict(embedding_dim=8, dense_mlp=[64], layers=3, fm_embeddings=8, lcb_embeddings=8,
                 fm_rank=0, fm_mlp=[256], top_mlp=[256, 64]),
}
FULL = {"shapes": list(SHAPES), "days": [1, 2, 4, 6]}
QUICK = {"shapes": ["xs", "s", "m"], "days": [1, 2],
         "generate": {"users": 20_000, "ads": 4_000, "days": 3, "sessions_per_day": 2_000}}
SMOKE = {"shapes": ["xs", "s"], "days": [1],
         "generate": {"users": 5_000, "ads": 1_000, "days": 2, "sessions_per_day": 400},
         "train": {"steps": 6, "batch_size": 256, "warmup_steps": 0}}


def _params(quick: bool) -> ParamsConfig:
    path = REPO / "params.yaml"
    p = yaml.safe_load(path.read_text()) if path.exists() else {}
    if quick:
        p.setdefault("generate", {}).update((SMOKE if smoke() else QUICK)["generate"])
    return from_dict(ParamsConfig, p, "params")


def fit_law(compute: np.ndarray, ne: np.ndarray) -> dict[str, float]:
    """a, b, c of NE = a + b * C^-c (least squares; c in (0, 3]), and the fit's RMSE.

    C is taken relative to its smallest value for the fit (the same law, well scaled)."""
    x = np.asarray(compute, float) / float(np.min(compute))
    y = np.asarray(ne, float)

    def linear(c: float) -> tuple[float, float, float]:  # a, b' and the squared error at c
        design = np.stack([np.ones_like(x), x ** -c], 1)
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        return float(a), float(b), float(((design @ [a, b] - y) ** 2).sum())

    cs = np.linspace(0.01, 3.0, 300)  # the law is linear in a and b: search c, solve those
    c = float(cs[int(np.argmin([linear(c)[2] for c in cs]))])
    a, b = linear(c)[:2]
    try:
        from scipy.optimize import curve_fit  # refines the grid's optimum where installed

        (a, b, c), _ = curve_fit(lambda x, a, b, c: a + b * x ** -c, x, y, p0=(a, b, c),
                                 bounds=([-np.inf, -np.inf, 1e-4], [np.inf, np.inf, 3.0]),
                                 maxfev=20_000)
        method = "scipy.optimize.curve_fit"
    except ImportError:
        method = "numpy (grid over c, least squares for a and b)"
    pred = a + b * x ** -c
    return {"a": float(a), "b": float(b) * float(np.min(compute)) ** float(c), "c": float(c),
            "rmse": float(np.sqrt(np.mean((pred - y) ** 2))), "method": method}


def frontier(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points better than every point of less compute, by compute."""
    out: list[dict[str, Any]] = []
    for p in sorted(points, key=lambda p: p["compute"]):
        if not out or p["ne"] < out[-1]["ne"]:
            out.append(p)
    return out


def figure(points: list[dict[str, Any]], law: dict[str, float],
           span: tuple[float, float]) -> Any:
    """The points by shape, and the law over `span` (the frontier's compute: past where the
    frontier stops the law describes nothing measured), as a matplotlib Figure (the docs
    draw the recorded run with it: docs/hooks/figures.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for shape in dict.fromkeys(p["shape"] for p in points):
        mine = sorted((p for p in points if p["shape"] == shape), key=lambda p: p["compute"])
        ax.plot([p["compute"] for p in mine], [p["ne"] for p in mine], marker="o",
                label=f"{shape} ({mine[0]['flops_per_example'] / 1e6:.2g} MFLOPs/imp)")
        for p in mine:
            ax.annotate(f"{p['days']}d", (p["compute"], p["ne"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    cs = np.geomspace(*span)
    ax.plot(cs, law["a"] + law["b"] * cs ** -law["c"], "k--",
            label=f"NE = {law['a']:.4f} + {law['b']:.3g} C^-{law['c']:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (forward FLOPs x impressions)")
    ax.set_ylabel("held-out NE (last day, every vertical)")
    ax.set_title("Wukong FM: NE against training compute")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def _plot(points: list[dict[str, Any]], law: dict[str, float], span: tuple[float, float],
          path: Path) -> None:
    """`figure` as a PNG at `path`."""
    import io as _io

    import matplotlib.pyplot as plt

    fig = figure(points, law, span)
    try:
        buf = _io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    io.write_bytes(buf.getvalue(), path, stage="bench.scaling")


def run(quick: bool, plot: Path) -> list[dict[str, Any]]:
    from lrm.data import dedup, synthetic
    from lrm.dist import quiet_libraries
    from lrm.models import build_model, num_parameters
    from lrm.models.flops import flops_per_example
    from lrm.train import TrainJob, train

    quiet_libraries()
    pc = _params(quick)
    grid = SMOKE if smoke() else QUICK if quick else FULL
    cfg = pc.train_for("teacher")
    if smoke():
        cfg = dataclasses.replace(cfg, **SMOKE["train"])
    schema = synthetic.schema(pc.generate)
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lrm-bench-scaling-") as tmp:
        root = Path(tmp)
        synthetic.generate(pc.generate, root / "raw")
        dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
        last = pc.generate.days - 1
        runs = []
        for name in grid["shapes"]:
            shape = dataclasses.replace(pc.model.teacher, **SHAPES[name])
            model_cfg = ModelConfig(tables=pc.model.tables, teacher=shape)
            model = build_model("teacher", schema, model_cfg)
            flops = flops_per_example(model, schema)
            for days in grid["days"]:
                if days <= last:
                    runs.append((flops, days, name, model_cfg, num_parameters(model, embeddings=False)))
        baseline = None
        for flops, days, name, model_cfg, dense in sorted(runs, key=lambda r: (r[0] * r[1], r[1])):
            t0 = time.perf_counter()
            result = train(TrainJob(
                kind="teacher", train=cfg, model=model_cfg, data=root / "sessions",
                split=SplitConfig(days=list(range(last - days, last)), eval_day=last),
                loader=pc.loader))
            p = {"shape": name, "days": days, "ne": float(result.eval["ne"]),
                 "compute": flops * result.samples, "flops_per_example": flops,
                 "samples": result.samples, "dense_params": dense,
                 "seconds": round(time.perf_counter() - t0, 1)}
            baseline = p["ne"] if baseline is None else baseline
            emit(BENCH, f"{name} x {days}d", "NE", candidate=round(p["ne"], 5),
                 baseline=round(baseline, 5), better="lower",
                 **{k: v for k, v in p.items() if k not in ("ne", "shape", "days")})
            points.append(p)
    front = frontier(points)
    law = fit_law(np.array([p["compute"] for p in front]), np.array([p["ne"] for p in front]))
    cmin, cmax = min(p["compute"] for p in points), max(p["compute"] for p in points)
    best = front[-1]  # the lowest NE of all
    stops = best["compute"] < cmax  # more compute than the best's bought nothing
    # the law at the frontier's ends (not past them: where the frontier stops, more compute
    # bought nothing, and extrapolating the fit there would claim what was not measured)
    span = (front[0]["compute"], best["compute"])
    emit(BENCH, "fit: NE = a + b * C^-c (frontier)", "NE",
         candidate=round(law["a"] + law["b"] * span[1] ** -law["c"], 5),
         baseline=round(law["a"] + law["b"] * span[0] ** -law["c"], 5), better="lower",
         **law, orders_of_magnitude=round(math.log10(cmax / cmin), 2),
         frontier=[f"{p['shape']} x {p['days']}d" for p in front],
         falls_throughout=not stops,
         stops_at=f"{best['shape']} x {best['days']}d (C={best['compute']:.3g})" if stops
         else None)
    _plot(points, law, span, plot)
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mode_flags(ap, "small world, three shapes, under a minute")
    ap.add_argument("--plot", type=Path, default=None,
                    help="the PNG drawn (default: plots/scaling.png; --smoke: a temporary one)")
    args = ap.parse_args()
    quick = use_mode(args)
    if args.plot is not None or not smoke():
        run(quick, args.plot or Path("plots/scaling.png"))
        return
    with tempfile.TemporaryDirectory(prefix="lrm-bench-scaling-plot-") as tmp:
        run(quick, Path(tmp) / "scaling.png")


if __name__ == "__main__":
    main()
