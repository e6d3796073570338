"""Stage `fp8_probe` (LoKA): where FP8 is safe and fast in saved models -> a report.

    lrm fp8-probe --model DIR --data DIR --out reports/fp8_probe.json
    lrm fp8-probe --model teacher=models/teacher --model student=models/student --data ...

Each model (DIR, or NAME=DIR; a bare DIR is named by its kind) runs training steps on the
days it trained on, with hooks on every Linear and GEMM-like interaction (lrm.fp8): per
layer the activation and weight statistics, the error of its GEMMs in bf16, e4m3 (per
tensor, per row), e5m2 (gradients), MXFP8 and MXFP4 against float64, until the intervals
are narrow enough (`fp8`) or `fp8.budget_s` seconds per model have gone by (on a device
with no fast FP8 GEMM, a CPU, on `fp8.slow_device_batches` batches only: no layer can be
chosen there, the report says so); then each Linear is timed in its training precision vs
FP8 at its real shape on this device. The report (JSON) and a readable table (markdown) give per
layer the statistics, error, speed and verdict, and per model the plan `train.fp8` uses:
the layers both safe and fast, kept only if the whole training step is not slower with
them. On a CPU every layer is "slow" (no fast FP8 GEMM): a finding, not a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import FP8Config
from lrm.errors import ConfigError
from stagekit import Arg, Metrics, Stage, main, split_named

NAME = "fp8_probe"


def run(*, cfg: FP8Config, device: str, amp: bool, batch_size: int, models: list[str],
        data: Path = Path("data/sessions"), out: Path = Path("reports/fp8_probe.json"),
        table: Path = Path("reports/fp8_probe.md"),
        metrics: Path | None = Path("metrics/fp8_probe.json"), force: bool = False
        ) -> Metrics:
    """Probe saved models: per layer, FP8 error and speed, and the layers to run in FP8."""
    from lrm.fp8 import report as R  # torch import: only when the stage runs
    from lrm.models.saved import read_card

    if not models:
        raise ConfigError("fp8_probe: give at least one --model DIR (or NAME=DIR)")
    named: dict[str, Path] = {}  # every name known before any probe (each takes minutes)
    for name, path in map(split_named, models):
        key = name or read_card(path).kind
        if key in named:
            raise ConfigError(f"--model: two models named {key!r}; name them (NAME=DIR)")
        named[key] = path
    results: dict[str, Any] = {
        key: R.probe_saved(path, data, cfg, device=device, amp=amp, batch_size=batch_size)
        for key, path in named.items()}
    doc = R.build(results, cfg, R.resolve_device(device), amp)
    io.write_json(doc, out, stage=NAME, force=force)
    io.write_text(R.markdown(doc) + "\n", table, stage=NAME, force=force)
    summary: dict[str, Any] = {"device": doc["device"]}
    for key, m in doc["models"].items():
        layers = m["layers"].values()
        summary[key] = {"layers": len(layers), "safe": sum(e["safe"] for e in layers),
                        "fast": sum(e["fast"] for e in layers), "fp8": len(m["plan"]),
                        "batches": m["batches"], "stopped": m["stopped"], "plan": m["plan"]}
    return Metrics(summary)


STAGE = Stage(
    name=NAME, cli_name="fp8-probe", run=run, short=("fp8",),
    reads={"cfg": "fp8", "device": "train.device", "amp": "train.amp",
           "batch_size": "train.batch_size"},
    args={"models": Arg("--model", "saved model folder, or NAME=DIR; repeat", "in", named=True),
          "data": Arg("--data", "dataset folder (the days each model trained on are read)",
                      "in"),
          "out": Arg("--out", "the probe report (JSON)", "out", file=True, cache=False),
          "table": Arg("--table", "the same as a readable table (markdown)", "out", file=True,
                       cache=False),
          "metrics": Arg("--metrics", "stage metrics: layers safe / fast / in FP8 per model",
                         "metrics")},
)

if __name__ == "__main__":
    main(STAGE)
