"""train.scaling: lrm.train.train launched as 2 processes vs 1 process (CPU, gloo).

The same run both ways: the same global batch (each of the 2 ranks takes half), the same
steps, RecD batches, the default student. Each launch is a fresh `python -m lrm.launch`
of `bench/train.py --worker` (the 1-process run too, for equal start-up conditions);
samples/s is TrainResult.samples_per_s (time in train steps, data waits included; set-up
and the final eval excluded). The launch (as torchrun) gives each of 2 processes 1
intra-op thread, the single process keeps torch's default; on a 2-core machine both use
the 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from bench.cases.train_common import MODEL, batch_size, dataset, device, steps as steps_of
from bench.common import emit
from lrm.config import LoaderConfig, TrainConfig, from_dict

ROOT = Path(__file__).resolve().parents[2]


def worker(spec_file: Path) -> None:
    """One process of a scaling run: train, then rank 0 writes the result."""
    from lrm.train import TrainJob, train

    spec = json.loads(Path(spec_file).read_text())
    r = train(TrainJob(kind="student", train=from_dict(TrainConfig, spec["train"], "train"),
                       model=MODEL, data=Path(spec["data"]),
                       loader=from_dict(LoaderConfig, spec["loader"], "loader")))
    if int(os.environ.get("RANK", "0")) == 0:
        Path(spec["result"]).write_text(json.dumps(
            {"samples_per_s": r.samples_per_s, "world_size": r.world_size,
             "eval_ne": r.eval["ne"], "steps": r.steps}))


def _launch(procs: int, spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    f = tmp / f"spec-{procs}.json"
    f.write_text(json.dumps({**spec, "result": str(tmp / f"result-{procs}.json")}))
    r = subprocess.run([sys.executable, "-m", "lrm.launch", f"--nproc-per-node={procs}",
                        str(ROOT / "bench" / "train.py"), "--worker", str(f)], cwd=ROOT,
                       capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"lrm.launch {procs} failed:\n{r.stderr[-3000:]}")
    return json.loads((tmp / f"result-{procs}.json").read_text())


def run(quick: bool = False, data: dict[str, Any] | None = None) -> None:
    steps = steps_of(quick, 60, 16, 4)
    if device() == "cuda" and torch.cuda.device_count() < 2:
        print("train.scaling: skipped on cuda (2 processes need 2 GPUs)", file=sys.stderr)
        return
    with (dataset(quick) if data is None else nullcontext(data)) as d:
        spec = {"data": str(d["sessions"]), "loader": {"recd": True},
                "train": {"batch_size": batch_size(), "steps": steps, "log_every": steps,
                          "device": device()}}
        with tempfile.TemporaryDirectory(prefix="lrm-bench-scaling-") as tmp:
            one = _launch(1, spec, Path(tmp))
            two = _launch(2, spec, Path(tmp))
        emit("train.scaling", "2_vs_1_processes", "samples/s", two["samples_per_s"],
             one["samples_per_s"], "higher", batch_size=batch_size(), steps=steps,
             cpu_cores=os.cpu_count(), eval_ne_1=one["eval_ne"], eval_ne_2=two["eval_ne"],
             candidate_is="lrm.launch --nproc-per-node=2 (gloo, 1 thread each)",
             baseline_is="lrm.launch --nproc-per-node=1 (torch's default threads)")

