"""FP8 benchmarks (LoKA): `python bench/fp8.py [--quick] [--large]` prints JSON lines.

fp8.layer   one per Linear of the student and the teacher (probed on synthetic sessions at
            the training batch): ratio = the layer's forward + backward time in training
            precision over its time in FP8 (quantization included, the real kernels of the
            device at hand), with `sqnr_db` / `row_sqnr_db` (the dispatch recipe's forward
            error, 95% half width beside) and the verdict
fp8.model   one per model: training-step throughput (forward + backward on real batches,
            the two models timed in turn, best of 3 each) with the dispatch built from this
            device's probe report over without it (the dispatched model must never be
            slower), with `ne_delta` (relative change of the held-out NE after training each
            the same way); and one per model with FP8 forced on every Linear ("naive FP8"),
            to show what dispatching avoids
fp8.mod     model mods, each measured: the interaction padded to a multiple of 8 (student
            step time, padded over plain), the bias in the FP8 GEMM's epilogue (over a
            separate add)

On a CPU every layer is slow (no fast FP8 GEMM): the plan is empty and fp8.model's
dispatched ratio is ~1.0 by construction; the GPU figures come from running this on one.
`--large` adds the large teacher profile's layers (profiles/teacher_large.yaml) to
fp8.layer: on a CPU that takes minutes.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import tempfile
import warnings
from itertools import islice
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import emit  # noqa: E402
from lrm.config import (  # noqa: E402
    DedupConfig,
    FP8Config,
    GenerateConfig,
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    TrainConfig,
)
from lrm.data import dedup, synthetic  # noqa: E402
from lrm.data.loader import BatchLoader  # noqa: E402
from lrm.fp8 import report as R  # noqa: E402
from lrm.fp8.dispatch import transform  # noqa: E402
from lrm.fp8.formats import RECIPES  # noqa: E402
from lrm.fp8.linear import Fp8Linear  # noqa: E402
from lrm.fp8.speed import median_ms  # noqa: E402
from lrm.train import train  # noqa: E402
from lrm.train.data import model_hash_sizes  # noqa: E402
from lrm.train.export import load_model  # noqa: E402
from stages._common import load_params  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOADER = LoaderConfig(prefetch=2, num_workers=1)


def world(quick: bool, root: Path) -> Path:
    cfg = GenerateConfig(users=5000, ads=1000, advertisers=100, categories=20, days=3,
                         sessions_per_day=2000 if quick else 10000, seed=5)
    synthetic.generate(cfg, root / "raw")
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return root / "sessions"


def _train(kind: str, model: ModelConfig, data: Path, cfg: TrainConfig, out: Path | None,
           fp8: str = "") -> Any:
    return train(kind, cfg, model, data, split=SplitConfig(eval_day=2), loader_cfg=LOADER,
                 out=out, transform=transform(fp8, kind))


def paired_throughput(base: torch.nn.Module, fp8: torch.nn.Module, batches: list[Any],
                      device: torch.device, amp: bool, reps: int) -> tuple[float, float]:
    """(samples/s of base, of fp8): timed in turn, best of 3 each (least disturbed)."""
    best = [float("inf"), float("inf")]
    for _ in range(3):
        for i, m in enumerate((base, fp8)):
            best[i] = min(best[i], R.step_ms(m, batches, device, amp, reps))
    n = sum(b.size for b in batches) / len(batches)
    return n / best[0] * 1e3, n / best[1] * 1e3


def _forced(report: dict[str, Any], name: str) -> dict[str, Any]:
    """The report with every Linear of model `name` planned: naive FP8."""
    forced = json.loads(json.dumps(report))
    m = forced["models"][name]
    m["plan"] = [n for n, e in m["layers"].items() if e["op"] == "linear"]
    return forced


def bench_layers(name: str, probed: dict[str, Any], recipe: str) -> None:
    fmt = RECIPES[recipe]
    for layer, e in probed["layers"].items():
        if e["speed"] is None:
            continue
        err = e["error"][fmt]
        half = [(r["ci"][1] - r["ci"][0]) / 2 if r["ci"][0] is not None else None
                for r in (err["sqnr_db"], err["row_sqnr_db"])]
        sp = e["speed"]
        emit("fp8.layer", f"{name}/{layer} ({sp['rows']}x{sp['k']}->{sp['n']})", "ms",
             sp["fp8_ms"], sp["base_ms"], "lower", sqnr_db=err["sqnr_db"]["mean"],
             row_sqnr_db=err["row_sqnr_db"]["mean"], sqnr_half_width_db=half[0],
             precision=sp["precision"], safe=e["safe"], fast=e["fast"],
             note="under load on a shared machine" if sp["precision"] == "float32" else "")


def bench_models(data: Path, root: Path, params: Any, quick: bool, large: bool) -> None:
    cfg = FP8Config(max_batches=4 if quick else 8, speed_reps=3 if quick else 10)
    batch = 512 if quick else params.train.batch_size
    tcfg = TrainConfig(batch_size=batch, steps=15 if quick else 60, lr=3e-3, log_every=5,
                       threads=0)
    models = {"student": ModelConfig(tables=params.model.tables, student=params.model.student),
              "teacher": ModelConfig(tables=params.model.tables, teacher=params.model.teacher)}
    if large:
        big = load_params([ROOT / "params.yaml", ROOT / "profiles/teacher_large.yaml"])
        models["teacher_large"] = ModelConfig(tables=big.model.tables, teacher=big.model.teacher)
    dev = R.resolve_device(params.train.device)
    for name, mcfg in models.items():
        kind = "student" if name == "student" else "teacher"
        base = _train(kind, mcfg, data, tcfg, root / name)
        probed = R.probe_saved(root / name, data, cfg, device=params.train.device,
                               amp=params.train.amp, batch_size=batch)
        bench_layers(name, probed, cfg.recipe)
        if name == "teacher_large":
            continue  # its step on a CPU is too slow to train three times
        doc = R.build({name: probed}, cfg, dev, params.train.amp)
        for case, rep in (("dispatched", doc), ("naive: every Linear in FP8",
                                                 _forced(doc, name))):
            path = root / f"{name}_{case.split(':')[0]}.json"
            path.write_text(json.dumps(rep))
            with_fp8 = _train(kind, mcfg, data, tcfg, None, fp8=str(path))
            ne0, ne1 = base.eval["ne"], with_fp8.eval["ne"]
            model, _ = load_model(root / name, dev)
            fp8_model = transform(str(path), kind)(copy.deepcopy(model))  # type: ignore[misc]
            batches = [b.to(dev) for b in islice(BatchLoader(
                data, batch, days=[0], hash_sizes=model_hash_sizes(model), prefetch=0), 2)]
            t0, t1 = paired_throughput(model, fp8_model, batches, dev, params.train.amp,
                                       cfg.speed_reps)
            emit("fp8.model", f"{name} {case}", "samples/s", t1, t0, "higher",
                 ne_delta=(ne1 - ne0) / ne0, ne=ne1, ne_baseline=ne0,
                 plan=rep["models"][name]["plan"], device=doc["device"],
                 note="under load on a shared machine" + (
                     "; empty plan: the same model, so the ratio is the machine's noise"
                     if not rep["models"][name]["plan"] else ""))


def bench_mods(data: Path, params: Any, quick: bool) -> None:
    from lrm.data.schema import read_schema
    from lrm.models import build_model

    dev = torch.device("cpu")
    schema, _ = read_schema(data)
    batch = 512 if quick else params.train.batch_size
    times = {}
    for pad in (1, 8):
        mcfg = ModelConfig(tables=params.model.tables, student=dataclasses.replace(
            params.model.student, interaction_pad=pad))
        torch.manual_seed(0)
        model = build_model("student", schema, mcfg)
        b = next(iter(BatchLoader(data, batch, days=[0], hash_sizes=model_hash_sizes(model),
                                  prefetch=0)))
        times[pad] = R.step_ms(model, [b], dev, False, 5 if quick else 20)
    emit("fp8.mod", f"interaction padded to 8 (student step, batch {batch}, CPU)", "ms",
         times[8], times[1], "lower", note="the padding is for GPU kernels; CPU under load")
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(batch, 256)
    t = {}
    for epi in (True, False):
        f8 = Fp8Linear.from_linear(lin, epilogue=epi)
        t[epi] = median_ms(lambda: f8(x), dev, 5 if quick else 20)
    emit("fp8.mod", f"bias in the FP8 GEMM epilogue ({batch}x256->256, forward, CPU)", "ms",
         t[True], t[False], "lower", note="CPU _scaled_mm; the gain is a GPU epilogue's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, about a minute")
    ap.add_argument("--large", action="store_true", help="also the large teacher's layers")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    params = load_params([ROOT / "params.yaml"])
    with tempfile.TemporaryDirectory(prefix="lrm-bench-fp8-") as tmp:
        data = world(args.quick, Path(tmp))
        bench_models(data, Path(tmp), params, args.quick, args.large)
        bench_mods(data, params, args.quick)


if __name__ == "__main__":
    main()
