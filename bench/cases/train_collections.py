"""train.collections: what lrm's two embedding collections cost, and what they save.

lrm keeps a model's tables in two EmbeddingBagCollections (lrm.models.tables): the user
side, fed one row per session (RecD), and the item side, one row per impression. Each is
its own fused kernel, input dist and output dist: on a GPU the host pays for each (about
1 ms of lookup and backward apiece in an H100 profile), and a single-GPU step is
host-bound. The alternative is one collection fed both sides' rows stacked
(`lrm.models.tables.stack_rows`: B + R rows for every feature, empty bags where a row is
not the feature's side): one kernel, one dist, but every feature's pooled output has
B + R rows, so the output all-to-all across ranks (and its gradient) carries user features
at B + R rows instead of R, and item features at B + R instead of B.

Two lines, both layouts measured in the same run on the device at hand (sharded by DMP,
one process, fused row-wise Adagrad, the student's tables and the default day's RecD
batches): `lookup_step`, the forward and backward (with the fused update) of the tables
alone, ms per batch, stacked rows built beforehand (as a loader would); and
`pooled_rows`, the pooled rows x features per batch the output dist carries, the
multi-GPU side of the trade.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from bench.cases.train_common import EMBEDDING_LR, MODEL, batch_size, batches, dataset, device, \
    steps as steps_of, student_hash_sizes, time_steps
from bench.common import emit
from lrm.data.batch import Batch
from lrm.data.schema import read_schema
from lrm.dist import process_group, quiet_libraries
from lrm.models.tables import embedding_tables, side_features, split_tables, stack_rows
from lrm.sharding import parallel


class _Two(nn.Module):
    """lrm's layout: a user collection and an item collection."""

    def __init__(self, user: list[EmbeddingBagConfig], item: list[EmbeddingBagConfig]) -> None:
        super().__init__()
        meta = torch.device("meta")
        self.user_ebc = EmbeddingBagCollection(user, device=meta)
        self.item_ebc = EmbeddingBagCollection(item, device=meta)

    def forward(self, user: KeyedJaggedTensor, item: KeyedJaggedTensor) -> torch.Tensor:
        return self.user_ebc(user).values().sum() + self.item_ebc(item).values().sum()


class _One(nn.Module):
    """The alternative: every table in one collection, fed the stacked rows."""

    def __init__(self, tables: list[EmbeddingBagConfig]) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables, device=torch.device("meta"))

    def forward(self, stacked: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(stacked).values().sum()


def run(quick: bool = False, data: dict[str, Any] | None = None) -> None:
    quiet_libraries()
    steps, repeat = steps_of(quick, 60, 16, 3), steps_of(quick, 5, 3, 1)
    with (dataset(quick) if data is None else nullcontext(data)) as d, \
            process_group(device()) as env:
        path = d["sessions"]
        schema, _ = read_schema(path)
        recd = [b.to(env.device) for b in batches(path, True, steps,
                                                  student_hash_sizes(path))]
        stacked = [stack_rows(b.item, b.user) for b in recd]
        tables = embedding_tables(schema, MODEL.tables, MODEL.student.embedding_dim)
        user_t, item_t = split_tables(schema, tables)
        two = parallel.shard(_Two(user_t, item_t), env, embedding_lr=EMBEDDING_LR, seed=0)
        one = parallel.shard(_One(user_t + item_t), env, embedding_lr=EMBEDDING_LR, seed=0)

        def two_step(b: Batch) -> None:
            two(b.user, b.item).backward()

        def one_step(s: KeyedJaggedTensor) -> None:
            one(s).backward()

        t = time_steps({"two": (two_step, recd), "one": (one_step, stacked)}, 3, repeat)
        n_user, n_item = (len(fs) for fs in side_features(schema, tables))
        rows = sum(b.user.stride() for b in recd) / len(recd)
        info = {"batch_size": batch_size(), "steps": steps, "user_rows_per_batch": round(rows, 1),
                "user_features": n_user, "item_features": n_item,
                "embedding_dim": MODEL.student.embedding_dim,
                "threads": torch.get_num_threads()}
        emit("train.collections", "lookup_step", "ms", 1e3 * t["two"] / steps,
             1e3 * t["one"] / steps, "lower",
             candidate_is="lrm's two collections (user rows once per session, item rows "
                          "per impression): two kernels, two dists",
             baseline_is="one collection of every table, fed both sides' rows stacked "
                         "(built beforehand): one kernel, one dist", **info)
        emit("train.collections", "pooled_rows", "rows x features",
             batch_size() * n_item + rows * n_user, (batch_size() + rows) * (n_item + n_user),
             "lower",
             candidate_is="lrm's two collections: B rows per item feature, R per user "
                          "feature",
             baseline_is="one collection: B + R rows for every feature",
             note="what the output all-to-all (and its gradient) carries across ranks, "
                  "times the embedding dim", **info)
