"""Whole-step CUDA graphs: one process on a GPU replays a training step (forward, loss, the
non-finite guard, the meter, backward with the tables' fused update, AdamW) as one launch.

Why: on a GPU lrm's step is bound by the host. Measured on an H100 (bench vs_torchrec's
student, batch 2048): the host spent 5.5 ms a step launching ~150 kernels and driving
DMP's per-step machinery, while the GPU's own work was under 1 ms; torchrec's DLRM example
spends 3.3-5.1 ms of host time the same way (every lease measured, three sessions).
Graphing the MLPs alone (lrm.train.graphs) saves a ninth of that. A whole step is one
graph only if nothing in it waits for the host: DMP's input dist sends its splits with an
all-to-all and reads them back on the host before it sends the ids, so it cannot be
captured. With one process the dists move nothing
(every table lives on rank 0), so here each sharded collection is called through its own
local lookups (torchrec's fused TBE modules, whose backward applies fbgemm's row-wise
Adagrad) and the KeyedTensor is assembled from their output, as its output dist would for
one rank. torchrec has no such path (its CUDA-graph helpers cover an unsharded model's
inference), so it is written here. Measured on an H100 (same bench, batch 2048): 0.87-0.88 ms
a step, 0.12-0.20 ms of it the host's, against torchrec's example at 4.8-6.8 ms.

A graph needs static shapes. A batch has B impressions (fixed), but its ids per feature
and its sessions (RecD) vary. `Layout` fixes a capacity per feature and for the session
rows, a little above the batch the capture sees (`slack`). `StaticBatch` copies each batch
to the device whole (a few copies: the host's only work for a step besides the replay) and
the graph's first kernels lay it out in buffers of those sizes. (Laying it out on the host,
a copy and two small ops per feature, cost the main thread ~1 ms a step on an H100 end to
end, where the loader's thread competes for the interpreter; whole, 0.4 ms.) In them:

* each feature's ids fill its first `n` slots; the rest are padding, owned by `PAD_ROWS`
  extra bags after the real rows (spread over several bags: fbgemm pools one bag per warp,
  and one long bag would serialize). Their ids are whatever the slots last held (valid ids
  of the same table, zeros at first); the pooled padding bags are cut off before the model
  sees them, so their gradient is zero, and a zero gradient leaves a row-wise Adagrad row
  and its state exactly as they were;
* session rows beyond the batch's U are empty bags, which no impression's inverse index
  points to.

A batch that does not fit (more ids or sessions than the capacities) grows them: the step is
captured again, at most MAX_CAPTURES times; after that such a batch takes the same step
uncaptured. Steps before the capture (the learning-rate warm-up, whose rates a graph would
freeze: fbgemm takes its rate as a host scalar) and a short batch run uncaptured too,
through the same local lookups. Batches with shared histories (`Batch.windows`) are not
taken: their segment count varies too, and the loop trains them through torchrec's
pipeline.

Checkpoints find the rows a step changed in the fused optimizer's state, which a replay
updates as an uncaptured step does (lrm.checkpoint.tracker). A step that cannot be
captured (a layer that reads a value on the host) trains uncaptured, with a warning; the
capture is thread-local, since the loader's threads pin host memory meanwhile.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from lrm.data.batch import Batch
from lrm.models.tables import SparseEmbeddings, select_keys
from lrm.train.steps import StepFn

log = logging.getLogger(__name__)

PAD_ROWS = 64  # bags per feature that own its padding ids
SLACK = 1.25  # capacities over the sizes of the batch a capture sees
MAX_CAPTURES = 4  # captures of a form (growing its capacities) before a misfit runs uncaptured
EAGER_STEPS = 3  # uncaptured steps before the first capture (AdamW's state, allocations)


@dataclass(frozen=True)
class Side:
    """The static input of one sharded collection: which batch KJT feeds it, its keys in
    the order of its lookups, and its capacities."""

    attr: str  # "user" or "item": the Batch field
    keys: tuple[str, ...]
    rows: int  # rows the model sees (B for items; the session capacity for users)
    caps: tuple[int, ...]  # ids per key

    @property
    def stride(self) -> int:
        return self.rows + PAD_ROWS


def form(b: Batch) -> tuple[bool, bool]:
    """What a batch carries beyond its sizes: (an inverse index (RecD), teacher logits)."""
    return b.inverse is not None, b.teacher_logits is not None


@dataclass(frozen=True)
class Layout:
    batch: int  # impressions
    sides: tuple[Side, ...]
    form: tuple[bool, bool] = (False, False)  # see `form`

    def fits(self, b: Batch) -> bool:
        if b.size != self.batch or b.windows is not None or form(b) != self.form:
            return False
        for s in self.sides:
            kjt: KeyedJaggedTensor = getattr(b, s.attr)
            if kjt.stride() > s.rows:
                return False
            lpk = _ids_per_key(kjt)
            if any(lpk[k] > c for k, c in zip(s.keys, s.caps, strict=True)):
                return False
        return True

    def grown(self, b: Batch, slack: float = SLACK) -> Layout:
        """Capacities that hold `b` with `slack` to spare (never less than these), in its
        form."""
        sides = []
        for s in self.sides:
            kjt: KeyedJaggedTensor = getattr(b, s.attr)
            lpk = _ids_per_key(kjt)
            # items: one row per impression; sessions: at most one per impression, and
            # exactly one without an inverse index (the plain form)
            rows = self.batch if s.attr == "item" or b.inverse is None else \
                min(self.batch, max(s.rows, math.ceil(kjt.stride() * slack)))
            caps = tuple(max(c, math.ceil(lpk[k] * slack) + 1)
                         for k, c in zip(s.keys, s.caps, strict=True))
            sides.append(Side(s.attr, s.keys, rows, caps))
        return Layout(self.batch, tuple(sides), form(b))


def _ids_per_key(kjt: KeyedJaggedTensor) -> dict[str, int]:
    return dict(zip(kjt.keys(), kjt.length_per_key(), strict=True))


def _lookup_keys(sebc: nn.Module) -> tuple[str, ...]:
    """A sharded collection's features in the order its lookups take them."""
    return tuple(f for s in sebc._embedding_shardings for f in s.feature_names())


def empty_layout(model: nn.Module, batch: int) -> Layout:
    """Zero capacities for `model`'s sharded collections (grown from the first batch)."""
    emb = _sparse(model)
    sides = []
    for attr in ("user", "item"):
        sebc = getattr(emb, f"{attr}_ebc")
        if sebc is not None:
            keys = _lookup_keys(sebc)
            sides.append(Side(attr, keys, batch if attr == "item" else 0, (0,) * len(keys)))
    return Layout(batch, tuple(sides))


def _sparse(model: nn.Module) -> SparseEmbeddings:
    found = [m for m in model.modules() if isinstance(m, SparseEmbeddings)]
    if len(found) != 1:
        raise ValueError(f"whole-step graphs need one SparseEmbeddings, found {len(found)}")
    return found[0]


def unsupported(model: nn.Module, world_size: int, device: torch.device,
                windows: bool = False) -> str | None:
    """Why `model` (sharded) cannot take whole-step graphs here, fed batches with shared
    histories or not (`windows`); None when it can."""
    if windows:
        return "shared-history batches (Batch.windows)"
    if device.type != "cuda":
        return "not on a GPU"
    if world_size != 1:
        return f"{world_size} processes (DMP's dists move data)"
    try:
        emb = _sparse(model)
    except ValueError as e:
        return str(e)
    if emb._layout.cross_keys:
        return "tables shared across the user and item sides"
    for sebc in (emb.user_ebc, emb.item_ebc):
        if sebc is None:
            continue
        if not hasattr(sebc, "_lookups"):
            return f"{type(sebc).__name__} is not a sharded collection"
        other = sorted(set(sebc._sharding_types) - {"table_wise"})
        if other:  # their output dists reorder or reduce what the lookups return
            return f"{', '.join(other)} shards in the sharding plan"
    return None


class _SideBuffers:
    """One side's buffers: what the model reads (`values`, `lengths`: each key's ids in
    its first slots, its padding bags after the real rows) and where a batch lands as it
    is (`in_values`, `in_lengths`), with the slot constants `unpack` maps them by."""

    def __init__(self, s: Side, like: KeyedJaggedTensor, device: torch.device) -> None:
        self.side = s
        K, C = len(s.keys), sum(s.caps)
        self.values = torch.zeros(C, dtype=like.values().dtype, device=device)
        self.lengths = torch.zeros((K, s.stride), dtype=like.lengths().dtype, device=device)
        # sized so that every index `unpack` forms is in bounds without a clamp: a key's
        # slot p < cap reads off + p < 2C (off <= C), a real row r of key block k reads
        # k * R + r < K * rows (R <= rows)
        self.in_values = torch.zeros(max(2 * C, 1), dtype=self.values.dtype, device=device)
        self.in_lengths = torch.zeros(max(K * s.rows, 1), dtype=self.lengths.dtype,
                                      device=device)
        caps = torch.tensor(s.caps, dtype=torch.int64, device=device)
        self.caps = caps
        self.slot_key = torch.repeat_interleave(torch.arange(K, device=device), caps)
        self.slot_pos = torch.arange(C, device=device) - \
            (torch.cumsum(caps, 0) - caps)[self.slot_key]
        self.row = torch.arange(s.rows, device=device)
        self.pad_bag = torch.arange(PAD_ROWS, device=device)

    def meta(self, src: KeyedJaggedTensor) -> list[int]:
        """The batch's side as the unpack reads it: per key (layout order) its ids and
        their offset in `src`'s values, its row block in `src`'s lengths; then the rows."""
        have = src.keys()
        order = [have.index(k) for k in self.side.keys]
        lpk, opk = src.length_per_key(), src.offset_per_key()
        return [*(lpk[i] for i in order), *(opk[i] for i in order), *order, src.stride()]

    def stage(self, src: KeyedJaggedTensor) -> None:
        v, ln = src.values(), src.lengths()
        if v.numel():
            self.in_values[:v.numel()].copy_(v, non_blocking=True)
        if ln.numel():
            self.in_lengths[:ln.numel()].copy_(ln, non_blocking=True)

    def unpack(self, meta: torch.Tensor) -> None:
        """`values` and `lengths` from the staged batch and its `meta` (device ops only)."""
        K = len(self.side.keys)
        n, off, order, rows = meta[:K], meta[K:2 * K], meta[2 * K:3 * K], meta[3 * K]
        if self.values.numel():  # few kernels: at batch 16384 these run over ~300k slots
            key = self.slot_key
            src = off[key].add_(self.slot_pos)
            torch.where(self.slot_pos < n[key], self.in_values[src], self.values,
                        out=self.values)
        at = order[:, None] * rows + self.row
        real = torch.where(self.row < rows, self.in_lengths[at], 0)
        # the padding ids, spread evenly over the padding bags
        q, r = torch.div(self.caps - n, PAD_ROWS, rounding_mode="floor"), \
            torch.remainder(self.caps - n, PAD_ROWS)
        pad = q[:, None] + (self.pad_bag < r[:, None])
        self.lengths.copy_(torch.cat([real, pad], 1))


class StaticBatch:
    """Device buffers of one Layout and the Batch over them (see the module docstring).

    A batch comes in as it is: `stage` copies its tensors whole (a few copies, the host's
    only per-step work) and `unpack`, device ops a graph captures, lays its ids into the
    capacities; `load` does both."""

    def __init__(self, layout: Layout, like: Batch, device: torch.device) -> None:
        self.layout = layout
        B = layout.batch
        self.dense = torch.zeros((B, like.dense.shape[1]), dtype=like.dense.dtype, device=device)
        self.labels = torch.zeros(B, dtype=like.labels.dtype, device=device)
        self.inverse = None if like.inverse is None else \
            torch.zeros(B, dtype=like.inverse.dtype, device=device)
        self.teacher = None if like.teacher_logits is None else \
            torch.zeros(B, dtype=like.teacher_logits.dtype, device=device)
        self.sides = [_SideBuffers(s, getattr(like, s.attr), device) for s in layout.sides]
        self.meta = torch.zeros(sum(3 * len(s.keys) + 1 for s in layout.sides),
                                dtype=torch.int64, device=device)
        kjts = {}
        for sb in self.sides:
            s = sb.side
            kjts[s.attr] = KeyedJaggedTensor(
                keys=list(s.keys), values=sb.values, lengths=sb.lengths.view(-1),
                stride=s.stride, length_per_key=list(s.caps),
                offset_per_key=list(itertools.accumulate(s.caps, initial=0)))
        empty = KeyedJaggedTensor(keys=[], values=torch.zeros(0, dtype=torch.int64,
                                                              device=device),
                                  lengths=torch.zeros(0, dtype=torch.int32, device=device),
                                  stride=B)
        self.batch = Batch(dense=self.dense, item=kjts["item"], user=kjts.get("user", empty),
                           labels=self.labels, inverse=self.inverse,
                           teacher_logits=self.teacher)

    def stage(self, b: Batch) -> None:
        """Copy `b` (host or device tensors; it must fit the layout) to the device."""
        self.dense.copy_(b.dense, non_blocking=True)
        self.labels.copy_(b.labels, non_blocking=True)
        if self.inverse is not None:
            self.inverse.copy_(b.inverse, non_blocking=True)  # type: ignore[arg-type]
        if self.teacher is not None:
            self.teacher.copy_(b.teacher_logits, non_blocking=True)  # type: ignore[arg-type]
        meta: list[int] = []
        for sb in self.sides:
            src: KeyedJaggedTensor = getattr(b, sb.side.attr)
            if len(src.keys()) != len(sb.side.keys):  # keys no table of this side takes
                src = select_keys(src, list(sb.side.keys))
            sb.stage(src)
            meta += sb.meta(src)
        self.meta.copy_(torch.tensor(meta, dtype=torch.int64), non_blocking=True)

    def unpack(self) -> None:
        at = 0
        for sb in self.sides:
            k = 3 * len(sb.side.keys) + 1
            sb.unpack(self.meta[at:at + k])
            at += k

    def load(self, b: Batch) -> None:
        self.stage(b)
        self.unpack()


def _local_forward(sebc: nn.Module, rows: int) -> Callable[[KeyedJaggedTensor], KeyedTensor]:
    """A sharded collection's forward on one process without its dists: the lookups on
    a KJT already in their key order, the padding bags cut off."""
    lookups = sebc._lookups
    # per lookup (sharding type) its features' count: torchrec fills `_feature_splits` only
    # when its input dist first runs, which this path never calls
    splits = [len(s.feature_names()) for s in sebc._embedding_shardings]
    names, dims = sebc._embedding_names, sebc._embedding_dims

    def forward(kjt: KeyedJaggedTensor) -> KeyedTensor:
        parts = kjt.split(splits) if len(lookups) > 1 else [kjt]
        embs = [lookup(f) for lookup, f in zip(lookups, parts, strict=True)]
        x = embs[0] if len(embs) == 1 else torch.cat(embs, 1)
        return KeyedTensor(keys=names, length_per_key=dims, values=x[:rows])

    return forward


class _Graph:
    """One captured step: its layout, its input buffers, the graph."""

    def __init__(self, layout: Layout, static: StaticBatch, graph: torch.cuda.CUDAGraph
                 ) -> None:
        self.layout, self.static, self.graph = layout, static, graph


class GraphSteps:
    """`lrm.train.steps.Steps` for one process on a GPU, as whole-step CUDA graphs (see the
    module docstring). `step(batches)` takes the next batch (host or device tensors) and
    trains on it; `pause()` has nothing to drain. `eager_steps`: steps to take uncaptured
    first (at least the learning-rate warm-up's). One graph per batch form (`form`)."""

    def __init__(self, dmp: nn.Module, opt: torch.optim.Optimizer, device: torch.device,
                 step_fn: StepFn, *, batch: int, eager_steps: int = EAGER_STEPS) -> None:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.dmp, self.opt, self.device, self.step_fn = dmp, opt, device, step_fn
        self.batch = batch
        emb = _sparse(dmp)
        self.eager_left = max(eager_steps, EAGER_STEPS)
        self.graphs: dict[tuple[bool, bool], _Graph] = {}
        self.captures = 0  # over every form
        self._made: dict[tuple[bool, bool], int] = {}  # captures per form
        self.replays = 0
        self.uncaptured = 0
        self._sebcs = {a: getattr(emb, f"{a}_ebc") for a in ("user", "item")
                       if getattr(emb, f"{a}_ebc") is not None}
        self._empty = empty_layout(dmp, batch)  # the sides' keys, once (no module walk a step)

    # -- the step ------------------------------------------------------------------------

    def step(self, batches: Iterator[Batch]) -> bool:
        """One optimizer step on the next batch; False when `batches` is exhausted."""
        try:
            b = next(batches)
        except StopIteration:
            return False
        if b.windows is not None:
            raise ValueError("whole-step CUDA graphs take no shared-history batches "
                             "(Batch.windows): train those through lrm.train.steps.Steps")
        if self.eager_left > 0 or b.size != self.batch:
            self.eager_left = max(self.eager_left - 1, 0)
            self._eager(b)
            return True
        key = form(b)
        g = self.graphs.get(key)
        if (g is None or not g.layout.fits(b)) and self._made.get(key, 0) < MAX_CAPTURES:
            base = g.layout if g is not None else self._empty
            g = self._capture(base.grown(b), b) or g
        if g is not None and g.layout.fits(b):
            g.static.stage(b)
            g.graph.replay()
            self.replays += 1
        else:
            self._eager(b)
        return True

    def pause(self) -> None:
        """Nothing is in flight between steps."""

    def _eager(self, b: Batch, layout: Layout | None = None) -> None:
        """The step uncaptured, through the same local lookups (by default in a layout
        that holds `b` exactly): what the pipeline does with a batch (zero the gradients,
        where the fused optimizer takes its learning rate; forward and loss; backward;
        step)."""
        layout = layout or Layout(b.size, self._empty.sides).grown(b, slack=1.0)
        static = StaticBatch(layout, b, self.device)
        static.load(b)
        with self._local(layout):
            self.opt.zero_grad()
            loss, _ = self.step_fn(static.batch)
            loss.backward()
            self.opt.step()
        self.uncaptured += 1

    def _capture(self, layout: Layout, like: Batch) -> _Graph | None:
        """Capture a step at `layout` (replacing the graph of its form); None when the
        step cannot be captured (its batches then train uncaptured)."""
        self._made[layout.form] = self._made.get(layout.form, 0) + 1
        static = StaticBatch(layout, like, self.device)
        graph = torch.cuda.CUDAGraph()
        # gradients made inside the capture live in its pool; the replays rewrite them
        self.opt.zero_grad(set_to_none=True)
        try:
            # thread-local: the loader's threads pin host memory meanwhile, a CUDA call that
            # a global capture would refuse (and so fail it) though it touches no stream
            with self._local(layout), _capturable(self.opt), \
                    torch.cuda.graph(graph, capture_error_mode="thread_local"):
                static.unpack()
                loss, _ = self.step_fn(static.batch)
                loss.backward()
                self.opt.step()
        except RuntimeError as e:
            # e.g. a layer that reads a value on the host inside the step (a capture only
            # records kernels; nothing ran, so no state changed)
            self._made[layout.form] = MAX_CAPTURES
            torch.cuda.synchronize()
            # torch ends a failed capture with an error before it releases the device's
            # random generator, which then refuses every later draw: give it a fresh state
            # (same seed and offset)
            gen = torch.cuda.default_generators[self.device.index or 0]
            gen.graphsafe_set_state(gen.clone_state())
            log.warning("whole-step CUDA graph: the capture failed, so these batches train "
                        "uncaptured: %s", str(e).strip().splitlines()[0] if str(e) else e)
            return None
        self.graphs[layout.form] = g = _Graph(layout, static, graph)
        self.captures += 1
        log.info("whole-step CUDA graph %d captured: batch %d, %s", self.captures,
                 layout.batch, ", ".join(f"{s.attr} rows {s.rows} ids {sum(s.caps)}"
                                         for s in layout.sides))
        return g

    @contextlib.contextmanager
    def _local(self, layout: Layout) -> Iterator[None]:
        """The sharded collections' forwards as local lookups, on the layout's rows. (The
        graphed MLPs of lrm.train.graphs run eager inside a capture by themselves: a graph
        cannot launch another.)"""
        saved = {}
        for s in layout.sides:
            sebc = self._sebcs[s.attr]
            saved[s.attr] = sebc.__dict__.get("forward")
            sebc.forward = _local_forward(sebc, s.rows)
        try:
            yield
        finally:
            for attr, fwd in saved.items():
                sebc = self._sebcs[attr]
                if fwd is None:
                    del sebc.forward
                else:
                    sebc.forward = fwd


@contextlib.contextmanager
def _capturable(opt: torch.optim.Optimizer) -> Iterator[None]:
    """torch's optimizers refuse a capture unless their groups say `capturable` (fused
    AdamW's kernel reads its step count on the device either way, so the flag changes
    nothing it computes); set only for the capture, so checkpoints keep the flag as made."""
    groups = [g for g in opt.param_groups if "capturable" in g]
    was = [g["capturable"] for g in groups]
    for g in groups:
        g["capturable"] = True
    try:
        yield
    finally:
        for g, w in zip(groups, was, strict=True):
            g["capturable"] = w
