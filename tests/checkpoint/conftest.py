"""A small sharded model to checkpoint: two fused-Adagrad tables (one shared by two
features) and a dense layer trained by AdamW, sharded table-wise or column-wise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, \
    table_wise
from torchrec.distributed.types import ShardingPlan

from lrm.checkpoint import CheckpointManager, Store
from lrm.config import CheckpointConfig
from lrm.dist import Dist, process_group
from lrm.sharding import parallel
from lrm.train.state import TrainState
from lrm.train.steps import dense_optimizer

TABLES = {"t_a": 60, "t_b": 40}  # rows; dim DIM
DIM = 8
FEATURES = {"a": "t_a", "a2": "t_a", "b": "t_b"}
WEIGHT = "ebc.embedding_bags.{}.weight"


@pytest.fixture(scope="module")
def env() -> Iterator[Dist]:
    """One process group for a module's tests (creating one per test costs ~0.5 s), and
    one intra-op thread (the machine is shared; these models are tiny)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with process_group("cpu") as e:
            yield e
    finally:
        torch.set_num_threads(threads)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection([
            EmbeddingBagConfig(name=t, num_embeddings=n, embedding_dim=DIM,
                               feature_names=[f for f, o in FEATURES.items() if o == t])
            for t, n in TABLES.items()], device=torch.device("meta"))
        self.top = nn.Linear(DIM * len(FEATURES), 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.top(self.ebc(kjt).values()).squeeze(1)


def plan(env: Dist, layout: str) -> ShardingPlan:
    """table: every table on rank 0; column: every table in 2 column shards (ranks 0 and
    the last rank)."""
    model = Toy()
    ranks = [0, env.world_size - 1]
    gen = {t: table_wise(rank=0, compute_kernel="fused") if layout == "table"
           else column_wise(ranks=ranks, compute_kernel="fused") for t in TABLES}
    return ShardingPlan({"ebc": construct_module_sharding_plan(
        model.ebc, gen, local_size=env.world_size, world_size=env.world_size,
        device_type="cpu")})


def build(env: Dist, layout: str = "table"):
    """(dmp, parts) of a fresh Toy, initialized from seed 0 whatever the layout."""
    torch.manual_seed(0)
    dmp = parallel.shard(Toy(), env, embedding_lr=0.1, seed=0, plan=plan(env, layout))
    dense, _ = dense_optimizer(dmp, 1e-2, 0.0)
    dense.init_state()
    opt = parallel.optimizer(dmp, dense)
    return dmp, {"model": dmp, "optim": opt, "train": TrainState()}


def batch(step: int, size: int = 16, spread: float = 1.2) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """A deterministic batch with Zipf-like ids (a few rows are hot)."""
    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(0, 3, (len(FEATURES) * size,), generator=g)
    ids = []
    for i, (f, t) in enumerate(FEATURES.items()):
        n = int(lengths[i * size:(i + 1) * size].sum())
        u = torch.rand(n, generator=g)
        ids.append(((TABLES[t] ** u - 1) ** spread).long().clamp(0, TABLES[t] - 1))
    kjt = KeyedJaggedTensor(keys=list(FEATURES), values=torch.cat(ids), lengths=lengths)
    return kjt, torch.randint(0, 2, (size,), generator=g).float()


def looked_up(steps: range) -> dict[str, set[int]]:
    """{table: the rows the batches of `steps` look up}."""
    out: dict[str, set[int]] = {t: set() for t in TABLES}
    for s in steps:
        kjt, _ = batch(s)
        for f, t in FEATURES.items():
            out[t] |= set(kjt[f].values().tolist())
    return out


def train_steps(parts, steps: range, ckpt=None) -> None:
    dmp, opt, state = parts["model"], parts["optim"], parts["train"]
    dmp.train()
    for s in steps:
        kjt, y = batch(s)
        loss = F.binary_cross_entropy_with_logits(dmp(kjt), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state.step += 1
        if ckpt is not None:
            ckpt.step(state.step, parts)


def tables_and_state(parts, env: Dist) -> dict[str, torch.Tensor]:
    """Full weights and row-wise momentum of every table (rank 0), plus the dense ones."""
    out = dict(parallel.full_state_dict(parts["model"], env) or {})
    for key, st in parts["optim"].state_dict()["state"].items():
        for name, v in st.items():
            if hasattr(v, "local_shards"):
                full = torch.empty(v.size()) if env.is_main else None
                v.gather(dst=0, out=full)
                if env.is_main:
                    out[f"{key}/{name}"] = full
            elif env.is_main:
                out[f"{key}/{name}"] = v.detach().clone()
    return out


# a chain to damage (tests/faults/test_checkpoint_matrix.py, test_damage.py)
ID = {"kind": "toy"}
CFG = CheckpointConfig(every=2, deltas=2, keep=5)
# the folder the fixture writes: chain 1 = steps 2 (baseline), 4, 6; chain 2 = 8 (baseline), 10
NAMES = {2: "000001-step-2", 4: "000002-step-4", 6: "000003-step-6", 8: "000004-step-8",
         10: "000005-step-10"}


@pytest.fixture(scope="module")
def chain(env, tmp_path_factory):
    """(folder, {step: full state at that step}) of one 10-step run."""
    root = tmp_path_factory.mktemp("chain") / "ck"
    _, parts = build(env)
    states = {}
    with CheckpointManager(root, env, CFG, ID) as ck:
        ck.start(parts, False)
        for s in range(10):
            train_steps(parts, range(s, s + 1), ck)
            if (s + 1) % 2 == 0:
                states[s + 1] = tables_and_state(parts, env)
        ck.finish(10, parts)
    assert [(e.step, e.kind) for e in Store(root).entries()] == [
        (2, "baseline"), (4, "delta"), (6, "delta"), (8, "baseline"), (10, "delta")]
    return root, states
