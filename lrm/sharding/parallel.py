"""Distributed wrapping: DistributedModelParallel, its optimizers, and unsharding.

Embedding tables are sharded by torchrec and trained by fbgemm's fused row-wise Adagrad
(the update runs inside the TBE backward, so it never materializes a table-sized
gradient); the dense part is replicated (DDP, which DMP applies) and trained by AdamW.

A plan normally comes from the cost-model planner (stage shard_plan, lrm.sharding.plan);
without one, a single process keeps every table whole on its one rank (torchrec's planner
split the user tables column-wise on one H100, which cost 2 ms of host time per step),
and several processes get torchrec's planner restricted to the `fused` kernel and to
table-wise / column-wise sharding: a data-parallel table would use the dense kernel (and
miss the fused optimizer), torchrec 1.8 has no CPU kernel for row-wise sharding, and the
user-side tables see a different batch size on every rank (one row per unique session),
which table- and column-wise sharding pool correctly (checked against the unsharded
module). Any `ShardingPlan` (e.g. the cost-model planner's) can be passed instead.

Table initialization does not depend on the plan: every table is filled from a generator
seeded by (seed, table, block of rows), so one process and N processes, or two plans,
start from the same weights.
"""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor
from torchrec import EmbeddingBagCollection
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.model_parallel import DataParallelWrapper
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan, ShardingType
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from lrm.dist import Dist
from lrm.errors import ConfigError

SHARDING_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value)
INIT_BLOCK_ROWS = 1 << 16


def table_names(model: nn.Module) -> list[str]:
    """Names of every embedding table in the model's EmbeddingBagCollections."""
    return [t.name for m in model.modules() if isinstance(m, EmbeddingBagCollection)
            for t in m.embedding_bag_configs()]


def sharders(embedding_lr: float, eps: float = 1e-8) -> list[EmbeddingBagCollectionSharder]:
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": embedding_lr,
             "eps": eps}
    return [EmbeddingBagCollectionSharder(fused_params=fused)]


def default_plan(model: nn.Module, env: Dist,
                 sharder_list: list[EmbeddingBagCollectionSharder]) -> ShardingPlan:
    """torchrec's planner, fused kernel, table- or column-wise (see the module docstring);
    several processes only (one device: `one_device_plan`, since column shards there only
    split a table's lookup: measured on an H100, 2 ms a step for the user side's)."""
    constraints = {name: ParameterConstraints(sharding_types=list(SHARDING_TYPES),
                                              compute_kernels=["fused"])
                   for name in table_names(model)}
    local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=env.world_size, local_world_size=local),
        kernel_config=KernelConfig(compute_device=env.device.type))
    # a fixed share of memory for the dense part: the heuristic one needs materialized
    # dense tensors to size them and warns otherwise
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints,
                                       storage_reservation=FixedPercentageStorageReservation(0.15))
    return planner.collective_plan(model, sharder_list, dist.GroupMember.WORLD)


class _Replicas(DataParallelWrapper):
    """No data-parallel wrapper: with one process there is nothing to all-reduce, and DDP
    would still copy every gradient into its buckets and launch a collective a step."""

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv,
             device: torch.device) -> None:
        pass


def one_device_plan(model: nn.Module, env: Dist) -> ShardingPlan:
    """Every table whole (table-wise) on rank 0: one process has nothing to balance."""
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, EmbeddingBagCollection):
            out[path] = construct_module_sharding_plan(
                m, {t.name: table_wise(rank=0, compute_kernel="fused")
                    for t in m.embedding_bag_configs()},
                local_size=1, world_size=1, device_type=env.device.type)
    return ShardingPlan(out)  # type: ignore[arg-type]


def check_plan(plan: ShardingPlan, env: Dist) -> None:
    """A plan for other ranks or another device is a ConfigError (before DMP fails deep)."""
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():  # type: ignore[attr-defined]
            bad = [r for r in (ps.ranks or []) if r >= env.world_size]
            if bad:
                raise ConfigError(f"the sharding plan puts {path}.{name} on rank {bad[0]}; "
                                  f"this run has {env.world_size} ranks")
            spec = ps.sharding_spec
            for m in (spec.shards if spec is not None else []):
                if m.placement.device().type != env.device.type:
                    raise ConfigError(f"the sharding plan places {path}.{name} on "
                                      f"{m.placement.device().type}; this run trains on "
                                      f"{env.device.type}")


def shard(model: nn.Module, env: Dist, *, embedding_lr: float, seed: int,
          plan: ShardingPlan | None = None) -> DistributedModelParallel:
    """Wrap `model` (tables on the meta device) in DMP and initialize its tables; the dense
    part is DDP-replicated across processes (not wrapped at all in one process)."""
    sh = sharders(embedding_lr)
    if plan is None:
        plan = one_device_plan(model, env) if env.world_size == 1 else \
            default_plan(model, env, sh)
    check_plan(plan, env)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD), device=env.device,
        plan=plan, sharders=sh,  # type: ignore[arg-type]
        data_parallel_wrapper=_Replicas() if env.world_size == 1 else None)
    init_tables(dmp, seed)
    return dmp


def sharding_types(dmp: DistributedModelParallel) -> dict[str, str]:
    """table -> how the run placed it ("table_wise on ranks [0]"): what the plan did."""
    return {name: f"{ps.sharding_type} on ranks {list(ps.ranks or [])}"
            for module_plan in dmp.plan.plan.values()
            for name, ps in module_plan.items()}  # type: ignore[attr-defined]


def _block_seed(seed: int, key: str, block: int) -> int:
    h = hashlib.blake2b(f"{seed}:{key}:{block}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def _local_shards(t: torch.Tensor) -> list[tuple[torch.Tensor, int, int]]:
    """(local shard, row offset, column offset) of a sharded table, [] for a plain tensor."""
    if isinstance(t, ShardedTensor):
        return [(s.tensor, s.metadata.shard_offsets[0], s.metadata.shard_offsets[1])
                for s in t.local_shards()]
    if isinstance(t, DTensor):
        local = t.to_local()
        if hasattr(local, "local_shards"):  # torchrec's LocalShardsWrapper
            return [(s, o[0], o[1]) for s, o in zip(local.local_shards(),
                                                       local.local_offsets(), strict=True)]
    return []


@torch.no_grad()
def init_tables(dmp: nn.Module, seed: int) -> None:
    """Fill every table uniform(±1/sqrt(rows)) (torchrec's default), independent of the plan.

    Rows are drawn in blocks of INIT_BLOCK_ROWS from a generator seeded by (seed, table
    key, block), full width, so a shard only draws the blocks it overlaps.
    """
    for key, t in dmp.state_dict().items():
        shards = _local_shards(t)
        if not shards:
            continue
        rows, dim = t.size(0), t.size(1)
        bound = rows ** -0.5
        for local, r0, c0 in shards:
            if local.numel() == 0:
                continue
            r1, c1 = r0 + local.shape[0], c0 + local.shape[1]
            for b in range(r0 // INIT_BLOCK_ROWS, (r1 - 1) // INIT_BLOCK_ROWS + 1):
                b0 = b * INIT_BLOCK_ROWS
                n = min(INIT_BLOCK_ROWS, rows - b0)
                g = torch.Generator(device=local.device).manual_seed(_block_seed(seed, key, b))
                block = torch.empty(n, dim, device=local.device).uniform_(-bound, bound,
                                                                           generator=g)
                lo, hi = max(r0, b0), min(r1, b0 + n)
                local[lo - r0:hi - r0].copy_(block[lo - b0:hi - b0, c0:c1])


def optimizer(dmp: DistributedModelParallel, dense: KeyedOptimizerWrapper) -> CombinedOptimizer:
    """One optimizer to step, zero and checkpoint: fused (tables) + dense."""
    return CombinedOptimizer([dmp.fused_optimizer, dense])


def full_state_dict(dmp: nn.Module, env: Dist) -> dict[str, torch.Tensor] | None:
    """The unsharded state dict as plain CPU tensors on rank 0 (None elsewhere); collective."""
    out: dict[str, torch.Tensor] = {}
    for key, t in dmp.state_dict().items():
        if isinstance(t, ShardedTensor):
            full = torch.empty(t.size(), dtype=t.dtype, device=env.device) if env.is_main \
                else None
            t.gather(dst=0, out=full)
        elif isinstance(t, DTensor):
            full = t.full_tensor()
        else:
            full = t.detach()
        if env.is_main:
            assert full is not None
            out[key] = full.to("cpu", copy=True)
    return out if env.is_main else None
