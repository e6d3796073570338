"""The training batch: item-side features per impression, user-side features per session.

RecD's form: user-side features appear once per unique session in the batch
(`user`, stride U) and `inverse[i]` says which session row impression i belongs to.
In the plain form `user` has one row per impression (stride B) and `inverse` is None.
Models look user features up once per row of `user` and expand with `inverse`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class Batch(Pipelineable):
    dense: torch.Tensor  # [B, n_dense] float32
    item: KeyedJaggedTensor  # item-side sparse features, stride B
    user: KeyedJaggedTensor  # user-side sparse features, stride U (dedup) or B (plain)
    labels: torch.Tensor  # [B] float32 in {0, 1}
    inverse: torch.Tensor | None = None  # [B] int64 into user rows; None in the plain form
    teacher_logits: torch.Tensor | None = None  # [B] float32 (ExFM augmented data)

    @property
    def size(self) -> int:
        return int(self.labels.numel())

    @property
    def num_sessions(self) -> int:
        """Rows of the user-side KJT (unique sessions when deduplicated)."""
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
        )

    def record_stream(self, stream: torch.Stream) -> None:
        for t in (self.dense, self.labels, self.inverse, self.teacher_logits):
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
        )

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
