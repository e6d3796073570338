"""FP8 benchmarks (LoKA): `python bench/fp8.py [--quick | --smoke] [--large]` prints JSON lines.

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
            separate add), the LayerNorm -> e4m3 fusion (fp8.fuse_norm: teacher step with
            top.0 in FP8, unfused over fused, in the device's training precision; the
            error of top.0, the logits and the norm's cast, bound / amax) and the bf16
            residual (fp8.bf16_residual: teacher step under bf16 autocast, without over
            with; the logits' error); both with the bytes per step of the Wukong stack at
            the profile's batch, counted operator by operator (and, for the fusion, the
            compiled path's saving per lrm.fp8.norm)

On a CPU every layer is slow (no fast FP8 GEMM): the plan is empty and fp8.model's
dispatched ratio is ~1.0 by construction; the GPU figures come from running this on one.
`--large` adds the large teacher profile's layers (profiles/teacher_large.yaml) to
fp8.layer, and to the two mods' fp8.mod lines its bytes per step (a CPU) or a line of its
own, timed (a GPU): on a CPU that takes minutes. --smoke: a tiny world, batch 64, two
steps, one timing round; on a CPU the student alone is probed and dispatched (the
teacher's emulated FP8 takes minutes), the teacher trained for the mods' lines.
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
import torch.nn.functional as F  # noqa: E402

from bench.common import add_mode_flags, emit, smoke, use_mode  # noqa: E402
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
from lrm.fp8.dispatch import dispatch, transform  # noqa: E402
from lrm.fp8.formats import E4M3, RECIPES, per_tensor  # noqa: E402
from lrm.fp8.linear import Fp8Linear  # noqa: E402
from lrm.fp8.mods import bf16_residual, fuse_norm  # noqa: E402
from lrm.fp8.norm import fused_bytes_saved, ln_bound  # noqa: E402
from lrm.fp8.probe import error_metrics  # noqa: E402
from lrm.fp8.speed import bytes_moved, median_ms  # noqa: E402
from lrm.models.saved import load_model  # noqa: E402
from lrm.train import TrainJob, train  # noqa: E402
from lrm.train.data import model_hash_sizes  # noqa: E402
from stagekit import load_params  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOADER = LoaderConfig(prefetch=2, num_workers=1)
SMOKE_BATCH = 64  # emulated FP8 on a CPU costs in proportion to the rows


def world(quick: bool, root: Path) -> Path:
    cfg = GenerateConfig(users=5000, ads=1000, advertisers=100, categories=20, days=3,
                         sessions_per_day=150 if smoke() else 2000 if quick else 10000,
                         seed=5)
    synthetic.generate(cfg, root / "raw")
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return root / "sessions"


def _train(kind: str, model: ModelConfig, data: Path, cfg: TrainConfig, out: Path | None,
           fp8: str = "") -> Any:
    return train(TrainJob(kind=kind, train=cfg, model=model, data=data,
                          split=SplitConfig(eval_day=2), loader=LOADER, out=out,
                          transform=transform(fp8, kind)))


def paired_throughput(base: torch.nn.Module, fp8: torch.nn.Module, batches: list[Any],
                      device: torch.device, amp: bool, reps: int) -> tuple[float, float]:
    """(samples/s of base, of fp8): timed in turn, best of 3 each (least disturbed)."""
    best = [float("inf"), float("inf")]
    for _ in range(1 if smoke() else 3):
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
             precision=sp["precision"], safe=e["safe"], fast=e["fast"])


def bench_models(data: Path, root: Path, params: Any, quick: bool, large: bool) -> None:
    tiny = smoke()
    cfg = FP8Config(max_batches=4 if quick else 8, speed_reps=3 if quick else 10)
    if tiny:
        cfg = FP8Config(min_batches=1, max_batches=1, slow_device_batches=1, rows=256,
                        speed_reps=1)
    batch = SMOKE_BATCH if tiny else 512 if quick else params.train.batch_size
    tcfg = TrainConfig(batch_size=batch, steps=2 if tiny else 15 if quick else 60, lr=3e-3,
                       log_every=5, threads=0)
    models = {"student": ModelConfig(tables=params.model.tables, student=params.model.student),
              "teacher": ModelConfig(tables=params.model.tables, teacher=params.model.teacher)}
    if large:
        big = load_params([ROOT / "params.yaml", ROOT / "profiles/teacher_large.yaml"])
        models["teacher_large"] = ModelConfig(tables=big.model.tables, teacher=big.model.teacher)
    dev = R.resolve_device(params.train.device)
    for name, mcfg in models.items():
        kind = "student" if name == "student" else "teacher"
        base = _train(kind, mcfg, data, tcfg, root / name)  # (bench_mod reads the teacher)
        if tiny and name != "student" and dev.type == "cpu":
            continue  # emulated FP8 on a CPU: the teacher's probe takes minutes (the
            # student's lines run the same code)
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
            fp8_model, _ = transform(str(path), kind)(copy.deepcopy(model))  # type: ignore[misc]
            batches = [b.to(dev) for b in islice(BatchLoader(
                data, batch, days=[0], hash_sizes=model_hash_sizes(model), prefetch=0), 2)]
            t0, t1 = paired_throughput(model, fp8_model, batches, dev, params.train.amp,
                                       cfg.speed_reps)
            emit("fp8.model", f"{name} {case}", "samples/s", t1, t0, "higher",
                 ne_delta=(ne1 - ne0) / ne0, ne=ne1, ne_baseline=ne0,
                 plan=rep["models"][name]["plan"], device=doc["device"],
                 note="empty plan: the same model, so the ratio is the machine's noise"
                 if not rep["models"][name]["plan"] else "")


def bench_mods(data: Path, params: Any, quick: bool) -> None:
    from lrm.data.schema import read_schema
    from lrm.models import build_model

    # the padding is for GPU kernels: timed on the device at hand (the same as fp8.model's)
    at = R.resolve_device(params.train.device)
    schema, _ = read_schema(data)
    batch = SMOKE_BATCH if smoke() else 512 if quick else params.train.batch_size
    reps = 1 if smoke() else 5 if quick else 20
    times = {}
    for pad in (1, 8):
        mcfg = ModelConfig(tables=params.model.tables, student=dataclasses.replace(
            params.model.student, interaction_pad=pad))
        torch.manual_seed(0)
        model = build_model("student", schema, mcfg, device=at, dense_device=at)
        b = next(iter(BatchLoader(data, batch, days=[0], hash_sizes=model_hash_sizes(model),
                                  prefetch=0))).to(at)
        times[pad] = R.step_ms(model, [b], at, False, reps)
    emit("fp8.mod", f"interaction padded to 8 (student step, batch {batch}, {at.type})", "ms",
         times[8], times[1], "lower", note="the padding is for GPU kernels" + (
             "; CPU under load" if at.type == "cpu" else ""))
    lin = torch.nn.Linear(256, 256)  # on the CPU (cuBLAS takes the bias only with a
    x = torch.randn(batch, 256)      # 16-bit output: Fp8Linear's float32 one skips it)
    t = {}
    for epi in (True, False):
        f8 = Fp8Linear.from_linear(lin, epilogue=epi)
        t[epi] = median_ms(lambda: f8(x), torch.device("cpu"), reps)
    emit("fp8.mod", f"bias in the FP8 GEMM epilogue ({batch}x256->256, forward, CPU)", "ms",
         t[True], t[False], "lower", note="CPU _scaled_mm; the gain is a GPU epilogue's")


# -- the LayerNorm -> e4m3 fusion and the bf16 residual (lrm.fp8.mods) ----------------------

BYTES_BATCHES = (16, 32)  # the stack's traffic is counted at two batches and fitted a B + c


class CudaAutocastNorm(torch.nn.LayerNorm):
    """LayerNorm as CUDA autocast runs it (its float32 op list): the input cast to float32.

    CPU autocast keeps a bf16 input's LayerNorm in bf16, so a CPU baseline for the bf16
    residual would already be partly bf16; this puts back what a GPU runs without the mod.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), self.normalized_shape, self.weight, self.bias,
                                self.eps)


def _cuda_policy(model: torch.nn.Module) -> torch.nn.Module:
    m = copy.deepcopy(model)
    for layer in m.layers:  # type: ignore[union-attr]
        norm = CudaAutocastNorm(layer.norm.normalized_shape, eps=layer.norm.eps,
                                device=layer.norm.weight.device)
        norm.load_state_dict(layer.norm.state_dict())
        layer.norm = norm
    return m


def _fp8_top0(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with top.0 in FP8 (`_scaled_mm`; on CUDA its quantization compiled)."""
    m = copy.deepcopy(model)
    t0 = m.top[0]  # type: ignore[index]
    dispatch(m, {"top.0": {"shape": {"k": t0.in_features, "n": t0.out_features}}},
             backend="scaled_mm")
    return m


def _fused(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(top.0 in FP8, the same with the last norm's cast fused in)."""
    fp8 = _fp8_top0(model)
    fused = copy.deepcopy(fp8)
    fuse_norm(fused)
    return fp8, fused


def _residual(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the stream as CUDA autocast keeps it, the bf16 residual)."""
    mod = copy.deepcopy(model)
    bf16_residual(mod)
    return _cuda_policy(model), mod


def _step(model: torch.nn.Module, batch: Any, amp: bool) -> None:
    """A training step's forward + backward; amp: bf16 autocast on the batch's device."""
    with torch.autocast(batch.labels.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(batch)
    F.binary_cross_entropy_with_logits(logits.float(), batch.labels).backward()
    model.zero_grad(set_to_none=True)


def paired_ms(models: list[torch.nn.Module], batches: list[Any], amp: bool, reps: int
              ) -> list[float]:
    """Per model, ms per step: the models timed in turn, best of 3 medians (least disturbed)."""
    best = [float("inf")] * len(models)
    dev = batches[0].labels.device
    for _ in range(1 if smoke() else 3):
        for i, m in enumerate(models):
            ms = median_ms(lambda: [_step(m, b, amp) for b in batches], dev, reps)
            best[i] = min(best[i], ms / len(batches))
    return best


def _outputs(model: torch.nn.Module, batch: Any, amp: bool) -> dict[str, torch.Tensor]:
    """The logits, top.0's output, the stack's input and the last norm's output."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [model.top[0].register_forward_hook(  # type: ignore[index]
        lambda m, i, o: seen.update(top0=o.float())),
        model.layers[0].register_forward_pre_hook(  # type: ignore[index]
        lambda m, i: seen.update(x0=i[0])),
        model.layers[-1].norm.register_forward_hook(  # type: ignore[index]
        lambda m, i, o: seen.update(norm_out=o) if isinstance(o, torch.Tensor) else None)]
    with torch.no_grad(), torch.autocast(batch.labels.device.type, dtype=torch.bfloat16,
                                         enabled=amp):
        seen["logits"] = model(batch).float()[:, None]
    for h in hooks:
        h.remove()
    return seen


def _db(ref: torch.Tensor, got: torch.Tensor) -> float:
    return error_metrics(ref, got)["sqnr_db"]  # type: ignore[index]


def _stack_step(model: torch.nn.Module, x0: torch.Tensor, amp: bool) -> None:
    """Forward + backward of Wukong's dense stack on its input: the layers, top MLP, head."""
    with torch.autocast(x0.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model.head(model.top(model.layers(x0).flatten(1)))  # type: ignore[operator]
    logits.float().sum().backward()
    model.zero_grad(set_to_none=True)


def stack_bytes(base: torch.nn.Module, cand: torch.nn.Module, x0: torch.Tensor, batch: int,
                amp: bool) -> dict[str, float]:
    """Bytes per step (forward + backward of the stack), without and with a mod, at `batch`.

    Counted operator by operator (lrm.fp8.speed.bytes_moved, eager) at two small batches
    and fitted a B + c: every activation is B rows long, every weight's traffic is fixed.
    The embeddings are left out: no mod changes them.
    """
    per = []
    b1, b2 = BYTES_BATCHES
    for m in (base, cand):
        y1 = bytes_moved(lambda: _stack_step(m, x0[:b1], amp))[0]
        y2 = bytes_moved(lambda: _stack_step(m, x0[:b2], amp))[0]
        per.append(y1 + (y2 - y1) / (b2 - b1) * (batch - b1))
    return {"batch": batch, "bytes_per_step": per[1], "bytes_per_step_baseline": per[0],
            "bytes_saved_per_step": per[0] - per[1]}


def _teachers(data: Path, root: Path, params: Any, large: bool, dev: torch.device
              ) -> dict[str, tuple[torch.nn.Module, int, bool]]:
    """name -> (the trained teacher, its profile's training batch, whether to time it).

    The large teacher (--large) is timed on a GPU only: its step on a CPU takes seconds.
    """
    out = {}
    profiles = {"teacher": params}
    if large:
        profiles["teacher_large"] = load_params([ROOT / "params.yaml",
                                                 ROOT / "profiles/teacher_large.yaml"])
    for name, p in profiles.items():
        model, _ = load_model(root / name, dev)
        out[name] = (model, p.train_for("teacher").batch_size,
                     name == "teacher" or dev.type == "cuda")
    return out


def _batches(data: Path, model: torch.nn.Module, size: int, n: int, dev: torch.device
             ) -> list[Any]:
    loader = BatchLoader(data, size, days=[0], hash_sizes=model_hash_sizes(model), prefetch=0)
    return [b.to(dev) for b in islice(loader, n)]


def bench_mod(mod: str, data: Path, root: Path, params: Any, quick: bool, large: bool) -> None:
    """One fp8.mod line per timed teacher: step time without the mod over with it, the
    error it changes, and the bytes per step of the stack at the profile's batch (both
    profiles' bytes on the default teacher's line; the large teacher is counted with
    --large and timed on a GPU only)."""
    dev = R.resolve_device(params.train.device)
    fused = mod == "fuse_norm"
    # the training precision: float32 on a CPU, bf16 autocast on a GPU; the bf16 residual
    # only acts under autocast, so it is measured under (CPU) autocast everywhere
    amp = (params.train.amp and dev.type == "cuda") or not fused
    teachers = _teachers(data, root, params, large, dev)
    sizes: dict[str, Any] = {}
    for name, (model, batch, _) in teachers.items():
        x0 = _outputs(model, _batches(data, model, max(BYTES_BATCHES), 1, dev)[0], amp)["x0"]
        base, cand = (_fused if fused else _residual)(model)
        sizes[name] = stack_bytes(base, cand, x0, batch, amp)
        if fused:
            k = model.top[0].in_features  # type: ignore[index]
            sizes[name]["compiled_bytes_saved_per_step"] = {
                "float32 norm": fused_bytes_saved(k * batch, 4),
                "bf16 norm (with bf16_residual)": fused_bytes_saved(k * batch, 2)}
    for name, (model, batch, timed) in teachers.items():
        if not timed:
            continue
        size = SMOKE_BATCH if smoke() else 512 if quick and dev.type == "cpu" else batch
        batches = _batches(data, model, size, 1 if smoke() else 2, dev)
        base, cand = (_fused if fused else _residual)(model)
        t_base, t_cand = paired_ms([base, cand], batches, amp,
                                   1 if smoke() else 3 if quick else 10)
        ref = _outputs(model, batches[0], False)  # float32: what both are compared with
        ob, oc = (_outputs(m, batches[0], amp) for m in (base, cand))
        err = {"logits_sqnr_db": _db(ref["logits"], oc["logits"]),
               "logits_sqnr_db_baseline": _db(ref["logits"], ob["logits"])}
        if fused:
            norm = model.layers[-1].norm  # type: ignore[index]
            y = ref["norm_out"]
            bound = float(ln_bound(norm.weight, norm.bias, y.shape[-1]))
            amax = float(y.abs().max())
            err.update(top0_sqnr_db=_db(ref["top0"], oc["top0"]),
                       top0_sqnr_db_baseline=_db(ref["top0"], ob["top0"]),
                       norm_cast_sqnr_db=_db(y, per_tensor(y, E4M3, bound)),
                       norm_cast_sqnr_db_baseline=_db(y, per_tensor(y, E4M3, amax)),
                       bound_over_amax=bound / amax)
            case = (f"LayerNorm -> e4m3 fused into the norm ({name} step, top.0 in FP8, "
                    f"batch {size}, {dev.type})")
        else:
            case = f"bf16 residual stream ({name} step under bf16 autocast, batch {size}, " \
                   f"{dev.type})"
        shown = {n: v for n, v in sizes.items() if n == name or not teachers[n][2]}
        emit("fp8.mod", case, "ms", t_cand, t_base, "lower", **err, bytes=shown,
             note=("eager on a CPU (compiled kernels on CUDA only); " if fused else
              "baseline: CUDA autocast's float32 LayerNorm (emulated on a CPU, whose "
              "autocast runs it in bf16); ") +
             "bytes: counted operator by operator for the Wukong stack (layers, top MLP, "
             "head; forward + backward; eager) at the profile's batch" +
             ("; compiled_bytes_saved_per_step: lrm.fp8.norm's accounting of the compiled "
              "path" if fused else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_mode_flags(ap, "small sizes, about a minute")
    ap.add_argument("--large", action="store_true", help="also the large teacher's layers")
    args = ap.parse_args()
    quick = use_mode(args)
    warnings.filterwarnings("ignore", category=UserWarning)
    params = load_params([ROOT / "params.yaml"])
    with tempfile.TemporaryDirectory(prefix="lrm-bench-fp8-") as tmp:
        data = world(quick, Path(tmp))
        bench_models(data, Path(tmp), params, quick, args.large)
        bench_mods(data, params, quick)
        for mod in ("fuse_norm", "bf16_residual"):
            bench_mod(mod, data, Path(tmp), params, quick, args.large)


if __name__ == "__main__":
    main()
