"""Whole-step CUDA graphs (lrm.train.step_graph). On a CPU: the local lookups and the static,
padded batches train exactly as torchrec's pipeline does (the capture itself needs a GPU);
the padding and the capacities keep their invariants; the checkpoints' row tracker still
learns every batch's rows. On a GPU (skipped without one): a replayed step trains as the
uncaptured one, and `lrm.train.train` takes the graphs."""

from __future__ import annotations

import dataclasses
import logging
import threading
from contextlib import contextmanager
from itertools import islice

import pytest
import torch
from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan
from torchrec.distributed.types import ShardingPlan
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lrm.checkpoint.tables import table_shards
from lrm.checkpoint.tracker import RowTracker
from lrm.config import ModelConfig, StudentModelConfig
from lrm.data.loader import BatchLoader
from lrm.data.schema import read_schema
from lrm.dist import process_group
from lrm.models import build_model
from lrm.sharding import parallel
from lrm.train import TrainJob, train
from lrm.train.data import model_hash_sizes
from lrm.train.guard import NonFiniteGuard
from lrm.train.job import bce_loss
from lrm.train.meter import Meter
from lrm.train.step_graph import PAD_ROWS, GraphSteps, Layout, StaticBatch, empty_layout, \
    unsupported
from lrm.train.steps import Steps, dense_optimizer
from tests.conftest import LOADER, tiny_train

MODEL = ModelConfig(student=StudentModelConfig(embedding_dim=8, bottom_mlp=[16],
                                               top_mlp=[16]))
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA graphs)")
STEPS = 6


def _batches(data, model, recd: bool, n: int = STEPS, size: int = 256):
    return list(islice(BatchLoader(data, size, days=[0], dedup=recd, drop_last=True,
                                   hash_sizes=model_hash_sizes(model), prefetch=0), n))


@contextmanager
def _build(data, kind: str, device: str = "cpu"):
    """(env, model, dmp, opt, step_fn, meter, losses): a sharded `kind` with the loop's
    optimizers, guard and meter, inside its process group."""
    schema, _ = read_schema(data)
    with process_group(device) as env:
        torch.manual_seed(0)
        model = build_model(kind, schema, MODEL, device="meta", dense_device=env.device)
        dmp = parallel.shard(model, env, embedding_lr=0.05, seed=0)
        guard = NonFiniteGuard(env, lambda s, v: f"bad loss at {s}: {v}")
        dense, adamw = dense_optimizer(dmp, 1e-2, 0.0)
        guard.gate(dmp, adamw)
        opt = parallel.optimizer(dmp, dense)
        meter = Meter(env, 10_000)
        losses: list[torch.Tensor] = []

        def step_fn(b):
            loss, serving = bce_loss(dmp, b)
            meter.record(serving, b.labels, guard.watch(loss))
            losses.append(loss.detach().clone())
            return loss, None

        yield env, model, dmp, opt, step_fn, meter, losses


def _local(t: torch.Tensor) -> torch.Tensor:
    """A copy of this process's part of a (possibly sharded) tensor."""
    return (t.local_shards()[0].tensor if hasattr(t, "local_shards") else t).clone()


def _state(dmp, opt) -> dict[str, torch.Tensor]:
    out = {k: _local(v) for k, v in dmp.state_dict().items()}
    for k, v in opt.state_dict()["state"].items():
        for name, t in (v.items() if isinstance(v, dict) else ()):
            if isinstance(t, torch.Tensor):
                out[f"opt:{k}:{name}"] = _local(t)
    return out


def _train(data, kind: str, recd: bool, how: str, slack: float = 1.0):
    """The state after STEPS steps: `how` = "pipeline" (torchrec's), "local" (GraphSteps'
    uncaptured step in a tight layout) or "padded" (the same in layouts `slack` larger)."""
    with _build(data, kind) as (env, model, dmp, opt, step_fn, meter, losses):
        batches = _batches(data, model, recd)
        if how == "pipeline":
            steps = Steps(dmp, opt, env.device, step_fn)
            it = iter(batches)
            while steps.step(it):
                pass
            steps.pause()
        else:
            steps = GraphSteps(dmp, opt, env.device, step_fn, batch=256, eager_steps=10**9)
            for b in batches:
                layout = empty_layout(dmp, b.size).grown(b, slack) if how == "padded" else None
                steps._eager(b, layout)
        return _state(dmp, opt), meter.sums.clone(), torch.stack(losses)


@pytest.mark.parametrize("kind,recd", [("student", True), ("student", False),
                                       ("teacher", True)])
def test_local_lookups_train_exactly_as_torchrecs_pipeline(datasets, kind, recd):
    """Bit for bit: every table, its Adagrad state, the dense weights, AdamW's state, the
    losses and the meter, over STEPS steps; and so in layouts padded far beyond the batch
    (padding ids, empty session rows)."""
    ref = _train(datasets["sessions"], kind, recd, "pipeline")
    for how, slack in (("local", 1.0), ("padded", 1.7)):
        got = _train(datasets["sessions"], kind, recd, how, slack)
        assert torch.equal(got[2], ref[2]), how
        assert torch.equal(got[1], ref[1]), how
        assert got[0].keys() == ref[0].keys()
        for k in ref[0]:
            assert torch.equal(got[0][k], ref[0][k]), (how, k)


def test_a_padded_static_batch_holds_each_batch_it_is_loaded_with(datasets):
    """The buffers a graph replays from, reloaded with a smaller batch after a larger one:
    the real rows' lengths and ids are the batch's, the session rows beyond it are empty,
    and the padding bags own exactly the slots left over."""
    with _build(datasets["sessions"], "student") as (env, model, dmp, *_):
        batches = _batches(datasets["sessions"], model, True, n=12)
        by_u = sorted(batches, key=lambda b: b.user.stride())
        big, small = by_u[-1], by_u[0]
        assert big.user.stride() > small.user.stride()
        layout = empty_layout(dmp, 256).grown(big, 1.3)
        assert layout.fits(big) and layout.fits(small)
        static = StaticBatch(layout, big, env.device)
        static.load(big)
        held = {side.attr: getattr(static.batch, side.attr).values().clone()
                for side in layout.sides}
        static.load(small)
        for side in layout.sides:
            src = getattr(small, side.attr)
            kjt = getattr(static.batch, side.attr)
            lengths = kjt.lengths().view(len(side.keys), side.stride)
            R = src.stride()
            at = 0
            for j, (key, cap) in enumerate(zip(side.keys, side.caps, strict=True)):
                jt = src[key]
                n = jt.values().numel()
                assert torch.equal(lengths[j, :R], jt.lengths().to(lengths.dtype)), key
                assert not lengths[j, R:side.rows].any(), key  # no stale session rows
                assert int(lengths[j, side.rows:].sum()) == cap - n, key
                # spread over the padding bags, none more than one above another
                pad = lengths[j, side.rows:]
                assert int(pad.max()) - int(pad.min()) <= 1 and pad.numel() == PAD_ROWS
                assert torch.equal(kjt.values()[at:at + n], jt.values()), key
                # the padding slots keep what they held: ids of the same table
                assert torch.equal(kjt.values()[at + n:at + cap],
                                   held[side.attr][at + n:at + cap]), key
                at += cap
            assert kjt.values().numel() == at == sum(side.caps)
        assert torch.equal(static.batch.inverse, small.inverse)
        assert torch.equal(static.batch.labels, small.labels)
        assert torch.equal(static.batch.dense, small.dense)


def test_a_static_batch_takes_only_its_sides_keys(datasets):
    """A batch KJT with a feature no table of that side takes (first, so every offset
    shifts) loads as the batch without it: the staging holds the side's keys only."""
    with _build(datasets["sessions"], "student") as (env, model, dmp, *_):
        b = _batches(datasets["sessions"], model, True, n=1)[0]
        it = b.item
        B = it.stride()
        stray = KeyedJaggedTensor(
            keys=["stray", *it.keys()], stride=B,
            values=torch.cat([torch.arange(2 * B, dtype=it.values().dtype), it.values()]),
            lengths=torch.cat([torch.full((B,), 2, dtype=it.lengths().dtype), it.lengths()]))
        layout = empty_layout(dmp, B).grown(b)
        plain, extra = StaticBatch(layout, b, env.device), StaticBatch(layout, b, env.device)
        plain.load(b)
        extra.load(dataclasses.replace(b, item=stray))
        for side in layout.sides:
            x, y = getattr(plain.batch, side.attr), getattr(extra.batch, side.attr)
            assert torch.equal(x.values(), y.values()), side.attr
            assert torch.equal(x.lengths(), y.lengths()), side.attr


def test_capacities_fit_what_they_were_grown_from_and_refuse_more(datasets):
    with _build(datasets["sessions"], "student") as (env, model, dmp, *_):
        recd = _batches(datasets["sessions"], model, True, n=12)
        plain = _batches(datasets["sessions"], model, False, n=1)
        tight = empty_layout(dmp, 256).grown(recd[0], slack=1.0)
        assert tight.fits(recd[0])
        assert not all(tight.fits(b) for b in recd[1:])  # another batch needs more room
        grown = tight
        for b in recd[1:]:
            if not grown.fits(b):
                grown = grown.grown(b)
        assert all(grown.fits(b) for b in recd)
        # capacities only grow; the plain form (no inverse index) is another layout, with a
        # session row per impression
        assert all(g >= t for s, u in zip(grown.sides, tight.sides, strict=True)
                   for g, t in zip(s.caps, u.caps, strict=True))
        assert not grown.fits(plain[0])
        # room to spare is not enough: a layout of the plain form takes no RecD batch
        # (its graph would read no inverse index)
        plain_room = empty_layout(dmp, 256).grown(plain[0], slack=3.0)
        assert plain_room.fits(plain[0]) and not plain_room.fits(recd[0])
        user = {s.attr: s for s in grown.grown(plain[0]).sides}["user"]
        assert user.rows == 256
        assert not Layout(128, grown.sides, grown.form).fits(recd[0])  # another batch size


def test_the_row_tracker_learns_every_step_s_rows(datasets):
    """Checkpoints' deltas: the rows GraphSteps' steps changed, as under the pipeline."""
    got = {}
    for how in ("pipeline", "local"):
        with _build(datasets["sessions"], "student") as (env, model, dmp, opt, step_fn, *_):
            def tables():
                return table_shards(dmp.state_dict(), opt.state_dict())

            tracker = RowTracker()
            tracker.take(tables())
            batches = _batches(datasets["sessions"], model, True)
            if how == "pipeline":
                steps = Steps(dmp, opt, env.device, step_fn)
            else:
                steps = GraphSteps(dmp, opt, env.device, step_fn, batch=256, eager_steps=10**9)
            it = iter(batches)
            while steps.step(it):
                pass
            steps.pause()
            got[how] = {k: v.tolist() for k, v in tracker.take(tables()).items()}
    assert got["local"] == got["pipeline"]
    assert sum(len(v) for v in got["local"].values()) > 100


def test_whole_step_graphs_apply_to_one_gpu_process_only(datasets):
    with _build(datasets["sessions"], "student") as (env, model, dmp, *_):
        assert unsupported(dmp, 1, torch.device("cpu")) == "not on a GPU"
        assert "2 processes" in unsupported(dmp, 2, torch.device("cuda"))
        assert unsupported(dmp, 1, torch.device("cuda")) is None
        assert "shared-history" in unsupported(dmp, 1, torch.device("cuda"), windows=True)
        assert "not a sharded collection" in unsupported(_unsharded(datasets), 1,
                                                         torch.device("cuda"))
        # a plan with column shards (e.g. the planner's for one device): their output dist
        # puts the columns together, which the local lookups alone would not
        unsharded = _unsharded(datasets)
        ebc = unsharded.embeddings.user_ebc
        plan = ShardingPlan({"embeddings.user_ebc": construct_module_sharding_plan(
            ebc, {t.name: column_wise(ranks=[0, 0], compute_kernel="fused")
                  for t in ebc.embedding_bag_configs()}, local_size=1, world_size=1,
            device_type="cpu")})
        cw = parallel.shard(unsharded, env, embedding_lr=0.05, seed=0, plan=plan)
        assert unsupported(cw, 1, torch.device("cuda")) == "column_wise shards in the sharding plan"


def _unsharded(datasets):
    schema, _ = read_schema(datasets["sessions"])
    return build_model("student", schema, MODEL, device="meta")


# -- on a GPU ---------------------------------------------------------------------------


@GPU
@pytest.mark.parametrize("recd", [True, False])
def test_replayed_steps_train_as_uncaptured_ones(datasets, recd):
    """12 steps: 3 uncaptured, then replays on new batches (a capture, and another where a
    batch outgrows the capacities), against 12 uncaptured steps. The meter's sums, which the
    captured step adds to on the device: rows and clicks exactly (each replay read its own
    batch), the log loss closely (the GPU's atomics make even two uncaptured runs differ in
    the last digits)."""
    runs = {}
    for eager in (3, 10**9):
        with _build(datasets["sessions"], "student", "cuda") as (env, model, dmp, opt,
                                                                 step_fn, meter, _):
            steps = GraphSteps(dmp, opt, env.device, step_fn, batch=256, eager_steps=eager)
            batches = [b.pin_memory() for b in _batches(datasets["sessions"], model, recd, 12)]
            it = iter(batches)
            while steps.step(it):
                pass
            torch.cuda.synchronize()
            runs[eager] = (steps.replays, steps.captures, meter.sums.cpu())
    assert runs[3][0] == 9 and runs[3][1] >= 1 and runs[10**9][:2] == (0, 0)
    graphed, eager = runs[3][2], runs[10**9][2]
    assert graphed[1:].tolist() == eager[1:].tolist()  # clicks, rows
    assert abs(graphed[0] - eager[0]) < 5e-4 * eager[0]  # log loss


@GPU
def test_train_on_one_gpu_replays_whole_steps_and_scores_as_the_pipeline(datasets, caplog):
    """`lrm.train.train` on a GPU captures the step and replays it; its held-out NE lies in
    the bootstrap interval of the run through torchrec's pipeline (the GPU's atomics make
    two runs differ; a graph that trained on stale inputs would not)."""
    results = {}
    for graphs in (True, False):
        with caplog.at_level(logging.INFO, logger="lrm.train"):
            caplog.clear()
            cfg = tiny_train(device="cuda", cuda_graphs=graphs, epochs=1)
            results[graphs] = train(TrainJob(kind="student", train=cfg, model=MODEL,
                                             data=datasets["sessions"], loader=LOADER))
            logged = caplog.text
        assert ("whole-step CUDA graph 1 captured" in logged) == graphs, logged
    lo, hi = results[False].eval["ne_ci"]
    assert lo <= results[True].eval["ne"] <= hi, (results[True].eval, results[False].eval)
    assert abs(results[True].eval["ne"] - results[False].eval["ne"]) < 1e-2


@GPU
def test_a_step_that_cannot_be_captured_trains_uncaptured(datasets, caplog):
    """A loss that reads a value on the host (a capture forbids it): the capture fails, a
    warning says so, and every step still trains, uncaptured."""
    with _build(datasets["sessions"], "student", "cuda") as (env, model, dmp, opt, step_fn,
                                                             meter, _):
        def host_reading(b):
            loss, none = step_fn(b)
            if float(loss) < 0:  # a host read: illegal while a stream captures
                raise AssertionError
            return loss, none

        steps = GraphSteps(dmp, opt, env.device, host_reading, batch=256)
        with caplog.at_level(logging.WARNING, logger="lrm.train"):
            it = iter(_batches(datasets["sessions"], model, True, 8))
            while steps.step(it):
                pass
        torch.cuda.synchronize()
        assert (steps.captures, steps.replays, steps.uncaptured) == (0, 0, 8)
        assert "the capture failed" in caplog.text
        assert meter.sums[2].item() == 8 * 256
        torch.rand(4, device="cuda")  # the device's random generator still draws


@GPU
def test_the_capture_lets_other_threads_use_cuda(datasets):
    """The loader's threads pin each batch's host memory while the main thread captures
    (measured: a global capture failed on it, with 4 loader threads at batch 2048)."""
    stop = threading.Event()

    empty_host_cache = getattr(torch._C, "_host_emptyCache", None) or \
        torch._C._accelerator_emptyHostCache

    def pin() -> None:  # a new pinned block each time: CUDA host allocations
        while not stop.is_set():
            torch.empty(1 << 14).pin_memory()
            empty_host_cache()

    with _build(datasets["sessions"], "student", "cuda") as (env, model, dmp, opt, step_fn,
                                                             *_):
        pinning = threading.Thread(target=pin, daemon=True)
        pinning.start()
        try:
            steps = GraphSteps(dmp, opt, env.device, step_fn, batch=256)
            it = iter(_batches(datasets["sessions"], model, True, 12))
            while steps.step(it):
                pass
            torch.cuda.synchronize()
            assert steps.captures >= 1 and steps.replays == 9
        finally:
            stop.set()
            pinning.join()
