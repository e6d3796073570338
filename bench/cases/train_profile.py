"""train.profile: where a CPU training step's time goes, lrm's student against torchrec's DLRM.

The two contenders of train.vs_torchrec (the same data, shapes, batches, optimizers and
pipelines), each profiled by torch.profiler over the same number of steps after the same
warm-up, one after the other. Each operator's self time (its own, not its children's) is
put in a category; a line per category gives its milliseconds per step for lrm (candidate)
and for torchrec's DLRM (baseline), with each side's share of its profiled total and its
heaviest operators. A last line, `total`, is the profiled time per step beside the wall
and CPU time of the same steps (the profiler's own cost is in all three).

The profiler times operators by the wall clock, so on a shared machine an operator that
lost its core counts the wait. Each operator's time per step is therefore its calls of one
size (every dimension's power of two) taken at their tenth percentile (`QUANTILE`), times
their count: on a quiet machine the
same as the sum, on a loaded one far less disturbed (a call that waited is not typical of
its kind). Annotations are grouped with their step numbers taken out. The threads are
torch's (bench/train.py --threads); one thread gives the clearest picture of the work.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from typing import Any

import numpy as np

import torch
from torch.profiler import ProfilerActivity, profile

from bench.cases import train_vs_torchrec as vs
from bench.common import emit, smoke
from lrm.data.schema import read_schema
from lrm.dist import process_group, quiet_libraries
from lrm.models import build_model
from lrm.train.data import model_hash_sizes

FRAMEWORK = "framework (autograd engine, pipeline, Python between operators)"
# (category, pattern over operator names): the first that matches takes the operator
CATEGORIES: list[tuple[str, str]] = [
    ("embedding lookups (fbgemm TBE forward, backward + fused row-wise Adagrad)",
     r"^fbgemm::split_embedding"),
    ("sparse data distribution (KJT all-to-alls, splits, permutes)",
     r"^c10d::|^fbgemm::(permute|jagged|block_bucketize|asynchronous|bounds_check)"),
    ("dense matmuls (MLPs, interaction)", r"^aten::(mm|addmm|bmm|matmul|_mkldnn\w*|mkldnn\w*)$"),
    ("ReLU forward and backward", r"^aten::(clamp_min|threshold_backward|relu_?)$"),
    ("casts and copies (bf16 autocast, .to)", r"^aten::(copy_|_to_copy)$"),
    ("gathers, concatenations, expansions",
     r"^aten::(cat|gather|scatter_add_|index_select|index|_index_put_impl_|index_add_|stack"
     r"|scatter|embedding_dense_backward)$"),
    ("dense optimizer (AdamW, zeroing gradients)",
     r"^aten::(_fused_adamw_|_foreach\w*|add_|mul_|sqrt|addcdiv_|addcmul_|lerp_|div_?|fill_"
     r"|zero_|maximum)$"),
    ("loss and reductions", r"^aten::(sum|mean|log_sigmoid\w*|binary_cross\w*|sigmoid\w*)$"),
]
STEPS = {"smoke": 3, "quick": 12, "full": 24}
QUANTILE = 0.1


def category(op: str) -> str:
    """The category of operator `op` (its profiler name); FRAMEWORK where none matches
    (annotations, autograd nodes, views, the rest)."""
    for name, pattern in CATEGORIES:
        if re.search(pattern, op):
            return name
    return FRAMEWORK


def _profile(side: vs._Side, steps: int) -> dict[str, Any]:
    """Run `steps` steps of `side` under the profiler: self ms per step by operator, the
    wall and process CPU ms per step."""
    t0, c0 = time.perf_counter(), time.process_time()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        side.run(steps, timed=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    calls: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in prof.events():  # one per call; annotations without their step numbers
        name = re.sub(r"\d+", "N", e.key) if e.key.startswith("##") else e.key
        calls[name, str(_size(e.input_shapes))].append(e.self_cpu_time_total)
    ops: Counter[str] = Counter()
    for (name, _), us in calls.items():
        ops[name] += float(np.quantile(us, QUANTILE)) * len(us) / 1e3 / steps
    return {"ops": ops, "wall_ms": 1e3 * wall / steps, "cpu_ms": 1e3 * cpu / steps}


def _size(shapes: Any) -> Any:
    """Shapes with every dimension as its power of two: the calls of one operator on inputs
    of about one size (a lookup's ids, a batch's sessions vary a little from step to step)."""
    if isinstance(shapes, int):
        return shapes.bit_length()
    return [_size(s) for s in shapes] if isinstance(shapes, (list, tuple)) else shapes


def _by_category(ops: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for op, ms in ops.items():
        out[category(op)] += ms
    return out


def _top(ops: Counter[str], cat: str, total: float, n: int = 5) -> list[list[Any]]:
    """The heaviest `n` operators of category `cat`: [name, ms per step, share of total]."""
    mine = Counter({k: v for k, v in ops.items() if category(k) == cat})
    return [[k, round(v, 3), round(v / total, 4)] for k, v in mine.most_common(n)]


def run(quick: bool = False, batch: int = vs.BATCH) -> None:
    quiet_libraries()
    steps = STEPS["smoke" if smoke() else "quick" if quick else "full"]
    with vs.dataset(quick, batch) as d, process_group("cpu") as env:
        path = d["sessions"]
        schema, _ = read_schema(path)
        sizes = model_hash_sizes(build_model("student", schema, vs.MODEL, device="meta"))
        recd = vs._load(path, 0, True, sizes, batch, True)
        plain = vs._load(path, 0, False, sizes, batch, True)
        sides = [vs._lrm_side(path, env, recd, [], batch),
                 vs._torchrec_side(path, env, plain, [])]
        for s in sides:
            s.run(vs.WARMUP, timed=False)
        got = {s.name: _profile(s, min(steps, len(s.batches) - s.at)) for s in sides}
        for s in sides:
            s.detach()
    lrm, tr = got["lrm"], got["torchrec"]
    cats = {n: _by_category(p["ops"]) for n, p in got.items()}
    totals = {n: sum(c.values()) for n, c in cats.items()}
    common = {"batch_size": batch, "steps": steps, "threads": torch.get_num_threads(),
              "embedding_dim": vs.DIM, "bottom_mlp": vs.MODEL.student.bottom_mlp,
              "top_mlp": vs.MODEL.student.top_mlp,
              "candidate_is": "lrm student's step (train.vs_torchrec's)",
              "baseline_is": "torchrec DLRM's step (train.vs_torchrec's)"}
    order = [c for c, _ in CATEGORIES] + [FRAMEWORK]
    for cat in order:
        a, b = cats["lrm"][cat], cats["torchrec"][cat]
        emit("train.profile", cat, "ms/step", max(round(a, 3), 1e-3), max(round(b, 3), 1e-3),
             "lower",
             share_candidate=round(a / totals["lrm"], 4),
             share_baseline=round(b / totals["torchrec"], 4),
             top_candidate=_top(lrm["ops"], cat, totals["lrm"]),
             top_baseline=_top(tr["ops"], cat, totals["torchrec"]), **common)
    emit("train.profile", "total", "ms/step", round(totals["lrm"], 3),
         round(totals["torchrec"], 3), "lower",
         wall_ms_per_step={n: round(p["wall_ms"], 3) for n, p in got.items()},
         cpu_ms_per_step={n: round(p["cpu_ms"], 3) for n, p in got.items()},
         note=f"every operator's self time per step (its calls of a shape at their "
              f"{QUANTILE:.0%} quantile, times their count), summed; the profiler's "
              f"wall and process CPU time beside", **common)
