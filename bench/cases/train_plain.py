"""train.vs_plain_pytorch: the project's student step against the same student in plain PyTorch.

The baseline is DLRMStudent written the way a plain PyTorch user would: one
`nn.EmbeddingBag` per table (same rows, dim, pooling; sparse gradients), the same bottom
MLP, all-pairs dot interaction and top MLP, torch.optim.Adagrad (sparse) on the tables and
AdamW on the rest, fed plain per-impression batches. Its inputs (values, offsets per
feature) are cut from the batches before timing, so it pays nothing for data handling.
Same batch size, same threads (torch's default here), same process; the timed passes
alternate between the baseline and the candidates.

Two lines: `student_step` (the project as it trains by default: RecD batches, DMP, fused
row-wise Adagrad) and `student_step_same_batches` (the project on the plain batches too:
what sharding and fbgemm's fused kernels alone are worth).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_configs import PoolingType

from bench.cases.train_common import EMBEDDING_LR, LR, MODEL, batch_size, batches, dataset, \
    device, project_step, steps as steps_of, student_hash_sizes, time_steps
from bench.common import emit
from lrm.config import StudentModelConfig
from lrm.data.batch import Batch
from lrm.data.schema import FeatureSchema, read_schema
from lrm.models import embedding_tables

Inputs = tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


def _mlp(n_in: int, widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Linear(n_in, w), nn.ReLU()]
        n_in = w
    return nn.Sequential(*layers)


class PlainStudent(nn.Module):
    """DLRM student: EmbeddingBags + bottom MLP + dot interaction + top MLP + head."""

    def __init__(self, schema: FeatureSchema, cfg: StudentModelConfig) -> None:
        super().__init__()
        d = cfg.embedding_dim
        tables = embedding_tables(schema, MODEL.tables, d)
        self.bags = nn.ModuleDict()
        for t in tables:
            bag = nn.EmbeddingBag(t.num_embeddings, d, sparse=True, include_last_offset=True,
                                  mode="mean" if t.pooling == PoolingType.MEAN else "sum")
            nn.init.uniform_(bag.weight, -1 / math.sqrt(t.num_embeddings),
                             1 / math.sqrt(t.num_embeddings))
            self.bags[t.name] = bag
        self.features = list(schema.user_features) + list(schema.item_sparse)
        self.table = {f: t.name for t in tables for f in t.feature_names}
        self.bottom = _mlp(len(schema.dense), cfg.bottom_mlp + [d])
        n = len(self.features) + 1
        self.top = _mlp(n * (n - 1) // 2 + d, cfg.top_mlp)
        self.head = nn.Linear(cfg.top_mlp[-1], 1)
        i, j = torch.triu_indices(n, n, offset=1)
        self.register_buffer("i", i, persistent=False)
        self.register_buffer("j", j, persistent=False)

    def forward(self, dense: torch.Tensor,
                sparse: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        b = self.bottom(dense)
        pooled = [self.bags[self.table[f]](v, o) for f, (v, o) in zip(self.features, sparse,
                                                                       strict=True)]
        x = torch.stack([*pooled, b], 1)
        dots = torch.bmm(x, x.transpose(1, 2))[:, self.i, self.j]
        return self.head(self.top(torch.cat([b, dots], 1))).squeeze(1)


def plain_inputs(batch: Batch, model: PlainStudent) -> Inputs:
    """(dense, [(values, offsets)] per feature, labels) from a plain batch."""
    assert not batch.deduped
    feats = {**batch.user.to_dict(), **batch.item.to_dict()}
    return batch.dense, [(feats[f].values(), feats[f].offsets()) for f in model.features], \
        batch.labels


def _to(inputs: Inputs, dev: torch.device) -> Inputs:
    dense, sparse, labels = inputs
    return dense.to(dev), [(v.to(dev), o.to(dev)) for v, o in sparse], labels.to(dev)


def plain_step(model: PlainStudent) -> Callable[[Inputs], None]:
    sparse = [p for n, p in model.named_parameters() if n.startswith("bags.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("bags.")]
    warnings.filterwarnings("ignore", message="Sparse invariant checks")  # torch's own note
    opt_s = torch.optim.Adagrad(sparse, lr=EMBEDDING_LR)
    opt_d = torch.optim.AdamW(dense, lr=LR, weight_decay=0.0)

    def step(inputs: Inputs) -> None:
        dense_x, sp, labels = inputs
        loss = F.binary_cross_entropy_with_logits(model(dense_x, sp), labels)
        opt_s.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)
        loss.backward()
        opt_s.step()
        opt_d.step()

    return step


def run(quick: bool = False, data: dict[str, Any] | None = None) -> None:
    steps, repeat = steps_of(quick, 40, 12, 3), steps_of(quick, 5, 3, 1)
    with (dataset(quick) if data is None else nullcontext(data)) as d:
        schema, _ = read_schema(d["sessions"])
        sizes = student_hash_sizes(d["sessions"])
        recd = batches(d["sessions"], True, steps, sizes)
        plain = batches(d["sessions"], False, steps, sizes)
        torch.manual_seed(0)
        dev = torch.device(device())
        baseline = PlainStudent(schema, MODEL.student).to(dev)
        inputs = [_to(plain_inputs(b, baseline), dev) for b in plain]
        with project_step(d["sessions"]) as step:
            t = time_steps({"base": (plain_step(baseline), inputs), "recd": (step, recd),
                            "same": (step, plain)}, 3, repeat)
        t_base, t_recd, t_same = t["base"], t["recd"], t["same"]
        n = steps * batch_size()
        info = {"batch_size": batch_size(), "steps": steps, "threads": torch.get_num_threads(),
                "embedding_dim": MODEL.student.embedding_dim,
                "baseline_is": "plain PyTorch student: nn.EmbeddingBag (sparse grads) + MLPs, "
                               "Adagrad + AdamW, plain batches"}
        emit("train.vs_plain_pytorch", "student_step", "samples/s", n / t_recd, n / t_base,
             "higher", candidate_is="lrm's step: DMP, fused row-wise Adagrad + fused AdamW, "
             "guard, RecD batches", **info)
        emit("train.vs_plain_pytorch", "student_step_same_batches", "samples/s", n / t_same,
             n / t_base, "higher", candidate_is="lrm's step on plain batches", **info)
