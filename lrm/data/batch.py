"""The training batch: item-side features per impression, user-side features per session.

RecD's form: user-side features appear once per unique session in the batch
(`user`, stride U) and `inverse[i]` says which session row impression i belongs to.
In the plain form `user` has one row per impression (stride B) and `inverse` is None.
Models look user features up once per row of `user` and expand with `inverse`.

RecD with shared histories (`windows` set; from the sessions layout, whose sequence
features are stored once per run of a user's sessions): `user` has U + G rows. Rows
[0, U) are the sessions (sequence features empty there), rows [U, U + G) are *segments*
of the runs' histories (only sequence features there): each history value of a user's
sessions in the batch lies in one segment, so it is looked up once. Session u's window of
sequence feature k is segments [first[k, u], end[k, u]) (contiguous), `lengths[k, u]`
values long. `session_form()` turns this into the RecD form.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class Windows:
    """Which segments of `Batch.user` make each session's sequence features."""

    sessions: int  # U: user rows [0, U) are sessions, the rest segments
    keys: list[str]  # the sequence features given as segments
    first: torch.Tensor  # [len(keys), U] int64: a window's first segment (0: row U)
    end: torch.Tensor  # [len(keys), U] int64: one past its last segment
    lengths: torch.Tensor  # [len(keys), U] float32: values in the window
    segment_lengths: torch.Tensor  # [len(keys), G] float32: values in each segment

    def _map(self, fn) -> Windows:  # type: ignore[no-untyped-def]
        return Windows(self.sessions, list(self.keys), fn(self.first), fn(self.end),
                       fn(self.lengths), fn(self.segment_lengths))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.first, self.end, self.lengths, self.segment_lengths


@dataclass
class Batch(Pipelineable):
    dense: torch.Tensor  # [B, n_dense] float32
    item: KeyedJaggedTensor  # item-side sparse features, stride B
    user: KeyedJaggedTensor  # user-side sparse features, stride U (dedup), B (plain), U + G
    labels: torch.Tensor  # [B] float32 in {0, 1}
    inverse: torch.Tensor | None = None  # [B] int64 into user rows; None in the plain form
    teacher_logits: torch.Tensor | None = None  # [B] float32 (ExFM augmented data)
    windows: Windows | None = None  # shared histories (see the module docstring)

    @property
    def size(self) -> int:
        return int(self.labels.numel())

    @property
    def num_sessions(self) -> int:
        """User rows of sessions (unique sessions when deduplicated)."""
        if self.windows is not None:
            return self.windows.sessions
        return int(self.user.stride()) if self.user.keys() else self.size

    @property
    def deduped(self) -> bool:
        return self.inverse is not None

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            item=self.item.to(device, non_blocking=non_blocking),
            user=self.user.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            inverse=mv(self.inverse),
            teacher_logits=mv(self.teacher_logits),
            windows=None if self.windows is None else self.windows._map(mv),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        extra = self.windows.tensors() if self.windows is not None else ()
        for t in (self.dense, self.labels, self.inverse, self.teacher_logits, *extra):
            if t is not None:
                t.record_stream(stream)
        self.item.record_stream(stream)
        self.user.record_stream(stream)

    def pin_memory(self) -> Batch:
        def pin(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.pin_memory()

        return replace(
            self, dense=pin(self.dense), item=self.item.pin_memory(),
            user=self.user.pin_memory(),
            labels=pin(self.labels), inverse=pin(self.inverse),
            teacher_logits=pin(self.teacher_logits),
            windows=None if self.windows is None else self.windows._map(pin),
        )

    def session_form(self) -> Batch:
        """This batch with every session's own sequence lists (`user` stride U, no
        `windows`); itself when it has no windows."""
        w = self.windows
        if w is None:
            return self
        U = w.sessions
        lengths, values = [], []
        for key, jt in self.user.to_dict().items():
            lens, vals = jt.lengths(), jt.values()
            if key not in w.keys:  # rows [U, U + G) are empty
                lengths.append(lens[:U])
                values.append(vals)
                continue
            k = w.keys.index(key)
            at = torch.zeros(lens.numel() - U + 1, dtype=torch.int64, device=lens.device)
            torch.cumsum(lens[U:], 0, out=at[1:])  # segment offsets in vals
            start, stop = at[w.first[k]], at[w.end[k]]
            n = stop - start
            idx = torch.repeat_interleave(start - (torch.cumsum(n, 0) - n), n)
            idx += torch.arange(idx.numel(), device=idx.device)
            lengths.append(n.to(lens.dtype))
            values.append(vals[idx])
        user = KeyedJaggedTensor(keys=self.user.keys(), values=torch.cat(values),
                                 lengths=torch.cat(lengths), stride=U)
        return replace(self, user=user, windows=None)

    def expand_user(self, pooled: torch.Tensor) -> torch.Tensor:
        """Expand per-session rows of `pooled` [U, ...] to per-impression rows [B, ...]."""
        return pooled if self.inverse is None else pooled.index_select(0, self.inverse)

    def variable_batch_kjt(self) -> KeyedJaggedTensor:
        """torchrec's native RecD form: one variable-batch KJT with inverse indices.

        User keys have stride U, item keys stride B; `inverse_indices` maps every key's
        rows back to the B impressions (identity for item keys). An unsharded
        EmbeddingBagCollection pools this once per session and expands to B itself.
        (Sharded by DMP on CPU this form fails in fbgemm, so the models use `user` +
        `expand_user` instead; see DEVELOPERS.md.)
        """
        if self.windows is not None:
            return self.session_form().variable_batch_kjt()
        B = self.size
        inv = self.inverse if self.inverse is not None else torch.arange(B)
        u, it = self.user, self.item
        keys = list(u.keys()) + list(it.keys())
        U = self.num_sessions
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([u.values(), it.values()]),
            lengths=torch.cat([u.lengths(), it.lengths()]),
            stride_per_key_per_rank=[[U]] * len(u.keys()) + [[B]] * len(it.keys()),
            inverse_indices=(keys, torch.stack(
                [inv] * len(u.keys()) + [torch.arange(B, device=inv.device)] * len(it.keys())
            )),
        )
